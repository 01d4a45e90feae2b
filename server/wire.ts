// The API's HTTP/1.1 server, straight on node:net: every request read strictly and within its limits
// (server/reader.ts, server/http1.ts), handed to the fetch handler as a light Request (server/web.ts),
// and answered in one write. The same API on node:http counts a sixth more instructions a request, and
// an idle connection takes four times the memory (BENCHMARKS.md, "Now"); here an idle connection is its
// socket, a few fields and an empty reader, every read lands in one buffer (server/read-buffer.ts), the
// bytes of a request are held only while it is split across packets, and one timer a second keeps every
// time limit.
import { createServer, type Socket } from 'node:net'
import { CHUNKED, MAX_HEAD_BYTES, type Head } from './http1.ts'
import { readIntoOneBuffer } from './read-buffer.ts'
import { RequestReader, type ReadRequest } from './reader.ts'
import { answerOf, CONTINUE, rawError } from './responses.ts'
import { IncomingRequest, useGivenResponses } from './web.ts'
import {
  DRAIN_MS,
  HEADERS_TIMEOUT_MS,
  HEALTH_PATH,
  KEEP_ALIVE_MS,
  lastAnswer,
  LINGER_MS,
  MAX_UNWRITTEN,
  nextAnswer,
  OVER_CAPACITY_MS,
  REFUSALS,
  REQUEST_TIMEOUT_MS,
  RETRY_AFTER_S,
  type ApiServer,
  type Fetch,
} from './api-server.ts'

const CHECK_MS = 1_000

// A connection's states: waiting for a request (new, or kept alive after an answer), reading one,
// answering one, and closing after its last answer.
const WAITING = 0
const READING = 1
const ANSWERING = 2
const CLOSING = 3

const CONNECTION = Symbol('the wire connection')
type Wired = Socket & { [CONNECTION]: Connection }

// oneReadBuffer false reads every connection as 'data' events, as a Node without the one read buffer
// does (server/read-buffer.ts): for the tests of that way.
export function createWireServer(fetch: Fetch, maxBodyBytes: number, { oneReadBuffer = true } = {}): ApiServer {
  useGivenResponses()
  const served: Served = {
    fetch,
    maxBodyBytes,
    oneReadBuffer,
    // Read ahead of the request being answered past a head and a body, reading waits for the answer.
    maxReadAhead: MAX_HEAD_BYTES + maxBodyBytes,
    connections: new Set(),
    admitted: 0,
    draining: false,
  }
  const api: ApiServer = {
    maxConnections: Infinity,
    server: createServer({ allowHalfOpen: true, noDelay: true }, (socket) => {
      const admitted = served.admitted < api.maxConnections
      if (admitted) served.admitted++
      served.connections.add(new Connection(socket as Wired, !admitted, served))
    }),
    idleSince: (socket) => (socket as Wired)[CONNECTION]?.idleSince(),
    drain(drained) {
      served.draining = true
      api.server.close(() => drained())
      for (const connection of served.connections) connection.closeIfIdle()
      setTimeout(() => served.connections.forEach((connection) => connection.socket.destroy()), DRAIN_MS).unref()
    },
  }
  setInterval(() => {
    const now = Date.now()
    for (const connection of served.connections) connection.checkTime(now)
  }, CHECK_MS).unref()
  return api
}

// What the connections of one server share.
type Served = {
  fetch: Fetch
  maxBodyBytes: number
  oneReadBuffer: boolean
  maxReadAhead: number
  connections: Set<Connection>
  admitted: number
  draining: boolean
}

// What nextRequest finds: a request whole, or none yet (more is to come), or none ever (it refused what
// came, and the connection is closing); and what call gets: an answer now, or later (from a promise,
// or already written: a failure).
const INCOMPLETE = 'incomplete'
const REFUSED = 'refused'
const LATER = 'later'

class Connection {
  state = WAITING
  since = Date.now() // when the current wait began: for a request, its first byte
  readonly reader: RequestReader // what the client sent that is not yet used, and how far it is read
  taken = 0 // requests taken since the last read: pipelined ones count toward MAX_UNWRITTEN
  answering: Head | undefined // the head of the request being answered
  request: IncomingRequest | undefined
  answered = 0 // the number of its last answer (0: none yet)
  readonly cameAfter = lastAnswer() // the number of the last answer of all when it came
  sent = 0 // what it has written, in the units of socket.writableLength
  unwritten: number[] | undefined // where each answer the kernel had not taken when written ends
  clientEnded = false
  paused = false

  readonly socket: Wired
  readonly overCapacity: boolean
  readonly served: Served

  constructor(socket: Wired, overCapacity: boolean, served: Served) {
    this.socket = socket
    this.overCapacity = overCapacity
    this.served = served
    this.reader = new RequestReader(served.maxBodyBytes)
    socket[CONNECTION] = this
    if (!(served.oneReadBuffer && readIntoOneBuffer(socket, onRead))) socket.on('data', onData)
    socket.on('end', onEnd).on('error', onError).on('close', onClose)
  }

  // A read: lent when it is in the one read buffer, which the next read reuses.
  received(chunk: Buffer, lent: boolean) {
    if (this.state === CLOSING) return
    this.reader.push(chunk, lent)
    this.taken = 0
    if (this.state === ANSWERING) {
      if (this.reader.held > this.served.maxReadAhead) ((this.paused = true), this.socket.pause())
      return
    }
    this.advance()
  }

  // Reads and answers every request whole in what has come, in order, until one is still on its way or
  // is being answered. Requests taken from one read count as answers the kernel has not taken until
  // the next read, as node:http counts the requests it parses from one read until their 'finish': a
  // client that pipelines more than MAX_UNWRITTEN requests at once is closed, as node:http would close it.
  advance() {
    while (this.state === WAITING || this.state === READING) {
      const ready = this.nextRequest()
      if (ready === INCOMPLETE) {
        // The client has sent its FIN, and the request it began can never be whole.
        if (this.clientEnded && this.state === READING) this.refuseStatus(400)
        return
      }
      if (ready === REFUSED) return
      const answer = this.call(ready)
      if (answer === LATER || !this.respond(answer)) return
    }
  }

  // The next request, once its head and body have all come.
  nextRequest(): ReadRequest | typeof INCOMPLETE | typeof REFUSED {
    const reader = this.reader
    if (reader.bytes === undefined || this.socket.destroyed) return INCOMPLETE
    if (this.state === WAITING) ((this.state = READING), (this.since = Date.now()))
    if (reader.head === undefined) {
      const head = reader.readHead()
      if (head === undefined) return INCOMPLETE
      if ('status' in head) return this.refuseStatus(head.status)
      if (Math.max(this.taken++, this.unwrittenAnswers()) >= MAX_UNWRITTEN) return (this.socket.destroy(), REFUSED)
      if (this.overCapacity && !(head.method === 'GET' && pathOf(head.url) === HEALTH_PATH))
        return this.refuseStatus(503)
      if (head.bodyLength > this.served.maxBodyBytes) return this.refuseStatus(413)
      if (head.expectContinue) this.write(CONTINUE, false)
    }
    const request = reader.readBody()
    if (request === undefined) return INCOMPLETE
    return 'status' in request ? this.refuseStatus(request.status) : request
  }

  // Hands a request to the fetch handler: its answer now, or LATER.
  call({ head, body }: ReadRequest): Response | typeof LATER {
    this.state = ANSWERING
    this.answering = head
    // Decoded, a chunked body has a length (RFC 9112, 7.1.3): the handler sees it so.
    const fields = head.bodyLength === CHUNKED ? dechunkedFields(head.fields, body!.length) : head.fields
    const request = (this.request = new IncomingRequest(head.method, head.url, fields, body))
    let answer: Response | Promise<Response>
    try {
      answer = this.served.fetch(request as unknown as Request)
    } catch (error) {
      return this.failed(error)
    }
    if (!(answer instanceof Promise)) return answer
    answer.then(
      (response) => this.respond(response) && this.advance(),
      (error) => this.failed(error),
    )
    return LATER
  }

  // Writes the answer; true if the connection goes on to its next request.
  respond(response: Response): boolean {
    const request = this.answering!
    this.answering = this.request = undefined
    if (this.socket.destroyed) return false
    // After the client's FIN, the last request it sent whole is answered with a close.
    const keepAlive =
      request.keepAlive && !this.overCapacity && !(this.clientEnded && this.reader.idle) && !this.served.draining
    let answer
    try {
      answer = answerOf(response, { head: request.method === 'HEAD', keepAlive, minor: request.minor })
    } catch (error) {
      console.error(error)
      const error500 = rawError(500, 'internal server error', {}, request.method === 'HEAD')
      answer = { head: error500, body: null, chunked: false, close: true }
    }
    this.answered = nextAnswer()
    const head = answer.latin1 ? Buffer.from(answer.head, 'latin1') : answer.head
    const body = answer.body
    if (answer.stream) return (void this.stream(head, answer.stream, answer), false)
    if (body === null) this.write(head)
    else if (typeof head === 'string' && typeof body === 'string') this.write(head + body)
    else
      this.write(
        Buffer.concat([
          typeof head === 'string' ? Buffer.from(head, 'latin1') : head,
          typeof body === 'string' ? Buffer.from(body) : body,
        ]),
      )
    return this.afterAnswer(answer.close)
  }

  afterAnswer(close: boolean): boolean {
    if (close) return (this.close(), false)
    this.state = WAITING
    this.since = Date.now()
    if (this.paused) ((this.paused = false), this.socket.resume())
    if (this.clientEnded && this.reader.idle) return (this.close(), false)
    return true
  }

  // A body of a stream: chunked in HTTP/1.1, or ended by the close in HTTP/1.0.
  async stream(
    head: string | Buffer,
    body: ReadableStream<Uint8Array>,
    { chunked, close }: { chunked: boolean; close: boolean },
  ) {
    this.write(head)
    try {
      for await (const chunk of body) {
        if (this.socket.destroyed) return
        if (chunk.byteLength === 0) continue
        this.write(
          chunked ? Buffer.concat([Buffer.from(`${chunk.byteLength.toString(16)}\r\n`), chunk, CRLF]) : chunk,
          false,
        )
        if (this.socket.writableNeedDrain) await drained(this.socket)
      }
      if (chunked) this.write('0\r\n\r\n', false)
    } catch (error) {
      console.error(error)
      return void this.socket.destroy() // the head has gone: nothing can say what went wrong
    }
    if (this.afterAnswer(close)) this.advance()
  }

  // Writes bytes; an answer's end is remembered while the kernel has not taken it.
  write(data: string | Uint8Array, ends = true) {
    this.socket.write(data)
    this.sent += data.length
    if (ends && this.socket.writableLength > 0) (this.unwritten ??= []).push(this.sent)
  }

  // How many answers the kernel has not taken yet.
  unwrittenAnswers(): number {
    if (this.unwritten === undefined) return 0
    const taken = this.sent - this.socket.writableLength
    while (this.unwritten.length > 0 && this.unwritten[0] <= taken) this.unwritten.shift()
    if (this.unwritten.length === 0) this.unwritten = undefined
    return this.unwritten?.length ?? 0
  }

  failed(error: unknown): typeof LATER {
    console.error(error)
    const head = this.answering?.method === 'HEAD'
    this.answering = this.request = undefined
    if (!this.socket.destroyed) this.answerAndClose(rawError(500, 'internal server error', {}, head))
    return LATER
  }

  // A refusal of a request whose head was read (a 413, a 503, a body at fault) knows its method.
  refuseStatus(status: number): typeof REFUSED {
    const fields: Record<string, string> = status === 503 ? { 'retry-after': RETRY_AFTER_S } : {}
    this.answerAndClose(rawError(status, REFUSALS[status], fields, this.reader.head?.method === 'HEAD'))
    return REFUSED
  }

  answerAndClose(answer: string) {
    this.write(answer)
    this.answered = nextAnswer()
    this.close()
  }

  // The last answer has been written: a FIN after it, then what the client still sends is dropped.
  close() {
    this.state = CLOSING
    this.since = Date.now()
    this.reader.discard()
    if (this.paused) this.socket.resume()
    this.socket.end()
  }

  closeIfIdle() {
    if (this.state === WAITING && this.reader.idle) this.close()
  }

  closed() {
    this.served.connections.delete(this)
    if (!this.overCapacity) this.served.admitted--
    this.request?.abort(new Error('the client closed the connection before the answer'))
  }

  idleSince(): number | undefined {
    const idle = this.state === WAITING && this.reader.idle && this.socket.writableLength === 0
    return idle ? this.answered || this.cameAfter : undefined
  }

  // Once a second: closes what has waited too long. A request too slow is a 408; a connection over
  // capacity that has not asked is a 503; an idle one is closed without a word, as node:http does.
  checkTime(now: number) {
    const waited = now - this.since
    if (this.state === CLOSING) {
      if (waited >= LINGER_MS) this.socket.destroy()
    } else if (this.overCapacity && this.state !== ANSWERING) {
      if (waited >= OVER_CAPACITY_MS) this.refuseStatus(503)
    } else if (this.state === WAITING) {
      if (this.answered === 0 ? waited >= HEADERS_TIMEOUT_MS : waited >= KEEP_ALIVE_MS) {
        if (this.answered === 0) this.refuseStatus(408)
        else this.socket.destroy()
      }
    } else if (this.state === READING && waited >= (this.reader.head ? REQUEST_TIMEOUT_MS : HEADERS_TIMEOUT_MS))
      this.refuseStatus(408)
  }

  // The client sent its FIN: what it sent whole is answered, then the connection closes (once its FIN
  // has gone too, the socket closes itself); a request cut short can never be whole, and is refused.
  clientEnd() {
    this.clientEnded = true
    if (this.state === WAITING && this.reader.idle) this.close()
    else if (this.state === READING) this.refuseStatus(400)
  }
}

const CRLF = Buffer.from('\r\n')

// Resolves once the socket has taken what it holds, or has closed.
function drained(socket: Socket): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      socket.off('drain', done).off('close', done)
      resolve()
    }
    socket.on('drain', done).on('close', done)
  })
}

// Whatever goes wrong reading a connection ends that connection, never the process.
function onData(this: Wired, chunk: Buffer) {
  try {
    this[CONNECTION].received(chunk, false)
  } catch (error) {
    console.error(error)
    this.destroy()
  }
}
function onRead(this: Socket, length: number, read: Buffer) {
  const connection = (this as Wired)[CONNECTION]
  try {
    connection.received(read.subarray(0, length), true)
  } catch (error) {
    console.error(error)
    this.destroy()
  }
  connection.reader.release()
}

// A URL's path: after its authority, up to its query.
function pathOf(url: string): string {
  const path = url.slice(url.indexOf('/', url.indexOf('//') + 2))
  const query = path.indexOf('?')
  return query < 0 ? path : path.slice(0, query)
}
function onEnd(this: Wired) {
  this[CONNECTION].clientEnd()
}
function onError(this: Wired) {
  this.destroy() // a reset or a broken pipe: the client is gone, and nothing is logged for it
}
function onClose(this: Wired) {
  this[CONNECTION].closed()
}

// The fields a handler sees for a body that came chunked: its length instead of its coding.
function dechunkedFields(fields: string[], length: number): string[] {
  const kept: string[] = []
  for (let i = 0; i < fields.length; i += 2) {
    if (fields[i] !== 'transfer-encoding' && fields[i] !== 'trailer') kept.push(fields[i], fields[i + 1])
  }
  kept.push('content-length', String(length))
  return kept
}
