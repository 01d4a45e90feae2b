// What one connection has sent and not yet used, and where reading it stands: the request being read,
// how far each of its parts has been looked at, and what it has cost against its limits. server/wire.ts
// holds one a connection and hands it each read; like server/http1.ts, whose reading it drives, it does
// no I/O, so that the tests can feed it a read at a time. What it keeps is bounded whatever comes: the
// head being read (32 KB, with the empty lines before it), a body (maxBodyBytes, and 8 KB of chunked
// framing) and the read that brought them; no byte is looked at again in a later read. A read may be
// lent (server/read-buffer.ts: memory the next read reuses): what is left of it is copied at release().
import { CHUNKED, ChunkedBody, readHead, type Head, type HeadProgress, type Refusal } from './http1.ts'

export type ReadRequest = { head: Head; body: Buffer | null }

export class RequestReader implements HeadProgress {
  bytes: Buffer | undefined // what has come and is not yet used, up to `end`
  end = 0
  lent = false // `bytes` is a lent read, the caller's again at release()
  // The request being read: HeadProgress, for its head,
  start = 0
  skipped = 0
  line = 0
  scanned = 0
  counted = 0
  requestLine: RegExpExecArray | undefined
  fields: string[] | undefined
  // then the head, once whole, and how far its body has come.
  head: Head | undefined
  bodyAt = 0
  chunked: ChunkedBody | undefined
  examined = 0 // bytes looked at, over the connection's life

  readonly maxBodyBytes: number

  constructor(maxBodyBytes: number) {
    this.maxBodyBytes = maxBodyBytes
  }

  // Nothing of a next request has come.
  get idle(): boolean {
    return this.bytes === undefined && this.head === undefined
  }

  // The bytes kept that are still to be read.
  get held(): number {
    return this.end - this.#kept()
  }

  // A read. Kept as it is when nothing else is; else appended, after what is still to be read.
  push(chunk: Buffer, lent = false) {
    if (this.bytes === undefined) {
      this.bytes = chunk
      this.end = chunk.length
      this.lent = lent
      return
    }
    const needed = this.end - this.#kept() + chunk.length
    if (this.#kept() > 0 || needed > this.bytes.length) this.#moveTo(needed)
    chunk.copy(this.bytes, this.end)
    this.end += chunk.length
  }

  // A lent read is the caller's again: what is still to be read of it gets a buffer of its own.
  release() {
    if (!this.lent) return
    this.lent = false
    if (this.bytes !== undefined) this.#moveTo(this.end - this.#kept())
  }

  // Where what is still to be read starts.
  #kept(): number {
    return this.head === undefined ? this.start : this.bodyAt
  }

  // What is still to be read, in a new buffer with room for `needed` bytes and more: what a handler may
  // still hold of the old one (a body) is left as it is.
  #moveTo(needed: number) {
    const keep = this.#kept()
    const moved = Buffer.allocUnsafe(Math.max(1024, needed + Math.min(needed, 8192)))
    this.bytes!.copy(moved, 0, keep, this.end)
    this.bytes = moved
    this.end -= keep
    this.start -= keep
    this.line -= keep
    this.scanned -= keep
    this.bodyAt -= keep
  }

  // The next request's head, once it has all come; undefined until then.
  readHead(): Head | Refusal | undefined {
    const read = readHead(this.#unread(), this)
    if (read === undefined || 'status' in read) return read
    this.head = read
    this.bodyAt = read.end
    if (read.bodyLength === CHUNKED) this.chunked = new ChunkedBody(this.maxBodyBytes, this)
    return read
  }

  // The request whose head has been read, once its body has all come; undefined until then. The
  // reading goes on to the next request.
  readBody(): ReadRequest | Refusal | undefined {
    const head = this.head!
    let body: Buffer | null = null
    let next = this.bodyAt
    if (this.chunked !== undefined) {
      const read = this.chunked.read(this.#unread(), this.bodyAt)
      if ('status' in read) return read
      next = this.bodyAt = read.at
      if (!read.done) return void this.#dropIfUsed()
      body = this.chunked.data
    } else if (head.bodyLength > 0) {
      next = this.bodyAt + head.bodyLength
      if (this.end < next) return undefined
      body = this.bytes!.subarray(this.bodyAt, next)
      if (this.lent) body = Buffer.from(body) // the handler may read it after the read's memory is reused
    }
    this.#next(next)
    return { head, body }
  }

  // The connection is closing: what it sent is of no more use.
  discard() {
    this.end = 0
    this.#next(0)
  }

  #unread(): Buffer {
    const bytes = this.bytes!
    return this.end === bytes.length ? bytes : bytes.subarray(0, this.end)
  }

  // A chunked body has used all that has come of it: nothing of it is kept.
  #dropIfUsed() {
    if (this.bodyAt === this.end) ((this.bytes = undefined), (this.end = this.bodyAt = 0))
  }

  // The one place a request's reading starts: at `at`, where the last one ended.
  #next(at: number) {
    if (at === this.end) ((this.bytes = undefined), (this.end = at = 0))
    this.start = this.line = this.scanned = at
    this.skipped = this.counted = 0
    this.requestLine = this.fields = this.head = this.chunked = undefined
  }
}
