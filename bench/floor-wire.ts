// HTTP/1.1 straight on node:net, for the two floors without node:http (bench/floor-net.ts and
// bench/floor-hono.ts): a reader of what the benchmark sends (bench/sequence.ts, bench/wrk.lua,
// bench/users.ts: a request line, header fields, a body framed by a Content-Length, keep-alive), and an
// answer in one write, with the headers ours sends, in the order node:http writes them (bench/floor.ts's
// bytes, the Date aside). What it cannot read gets node:http's 400 and a close. No idle timeout, no
// chunked bodies, no limits but the sizes below: it is a benchmark's floor, not a server. Its reads land
// in one buffer, as ours do (server/read-buffer.ts).
import { createServer, type Socket } from 'node:net'
import { readIntoOneBuffer } from '../server/read-buffer.ts'

export type WireRequest = { method: string; target: string; fields: Map<string, string>; body: Buffer }
export type WireAnswer = { status: number; body: string }
type Handler = (request: WireRequest) => WireAnswer | Promise<WireAnswer>

// node:http's --max-http-header-size; ours refuses a larger body (a 413), which the benchmark never sends.
const MAX_HEAD_BYTES = 16 * 1024
const MAX_BODY_BYTES = 16 * 1024
const REASONS: Record<number, string> = {
  200: 'OK',
  201: 'Created',
  400: 'Bad Request',
  401: 'Unauthorized',
  404: 'Not Found',
  500: 'Internal Server Error',
}
const JSON_FIELDS = 'content-type: application/json\r\nx-content-type-options: nosniff\r\ncache-control: no-store\r\n'
const MALFORMED = 'HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n'
const FAILED: WireAnswer = { status: 500, body: '{"error":"internal server error"}' }
const EMPTY = Buffer.alloc(0)

// The Date field, made once a second as node:http makes it: kept until the next second begins.
let date = ''
function utcDate() {
  if (!date) {
    date = new Date().toUTCString()
    setTimeout(() => (date = ''), 1000 - (Date.now() % 1000)).unref()
  }
  return date
}

type Parsed = { request: WireRequest; keepAlive: boolean; length: number }

// The request at the start of the bytes; 'more' while it has not all come. Field names are kept in lower
// case, and a field sent twice is one value joined by commas (so two Content-Lengths are malformed).
function parse(bytes: Buffer): Parsed | 'more' | 'malformed' {
  const end = bytes.indexOf('\r\n\r\n')
  if (end < 0) return bytes.length > MAX_HEAD_BYTES ? 'malformed' : 'more'
  if (end > MAX_HEAD_BYTES) return 'malformed'
  const lines = bytes.toString('latin1', 0, end).split('\r\n')
  const [method, target, version, extra] = lines[0].split(' ')
  if (
    extra !== undefined ||
    !/^[A-Z]+$/.test(method) ||
    !target?.startsWith('/') ||
    (version !== 'HTTP/1.1' && version !== 'HTTP/1.0')
  )
    return 'malformed'
  const fields = new Map<string, string>()
  for (let i = 1; i < lines.length; i++) {
    const colon = lines[i].indexOf(':')
    if (colon <= 0) return 'malformed'
    const name = lines[i].slice(0, colon).toLowerCase()
    const value = lines[i].slice(colon + 1).trim()
    fields.set(name, fields.has(name) ? `${fields.get(name)}, ${value}` : value)
  }
  const declared = fields.get('content-length') ?? '0'
  if (fields.has('transfer-encoding') || !/^\d{1,6}$/.test(declared) || Number(declared) > MAX_BODY_BYTES)
    return 'malformed'
  const length = end + 4 + Number(declared)
  if (bytes.length < length) return 'more'
  const connection = fields.get('connection')?.toLowerCase()
  const keepAlive = version === 'HTTP/1.1' ? connection !== 'close' : connection === 'keep-alive'
  // A copy of the body: the handler may read it after the bytes' memory is reused.
  const body = length > end + 4 ? Buffer.from(bytes.subarray(end + 4, length)) : EMPTY
  return { request: { method, target, fields, body }, keepAlive, length }
}

// One write: the status line, ours' fields, and the body.
function write(socket: Socket, { status, body }: WireAnswer, keepAlive: boolean) {
  const connection = keepAlive ? 'Connection: keep-alive\r\nKeep-Alive: timeout=65\r\n' : 'Connection: close\r\n'
  socket.write(
    `HTTP/1.1 ${status} ${REASONS[status] ?? 'Unknown'}\r\n${JSON_FIELDS}Date: ${utcDate()}\r\n${connection}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  )
  if (!keepAlive) socket.end()
}

// What throws is a 500, as ours answers it, and the process goes on.
function answerTo(handle: Handler, request: WireRequest): WireAnswer | Promise<WireAnswer> {
  const failed = (error: unknown) => (console.error(error), FAILED)
  try {
    const answer = handle(request)
    return answer instanceof Promise ? answer.catch(failed) : answer
  } catch (error) {
    return failed(error)
  }
}

// A connection's requests, one at a time in the order they came: the next is read once the last is
// answered, so a client that sends several at once gets its answers in order.
function serveConnection(socket: Socket, handle: Handler) {
  let pending: Buffer | undefined
  let busy = false
  let closed = false
  const next = () => {
    while (pending && !busy && !closed) {
      const parsed = parse(pending)
      if (parsed === 'more') return
      if (parsed === 'malformed') {
        closed = true
        socket.end(MALFORMED)
        return
      }
      pending = parsed.length < pending.length ? pending.subarray(parsed.length) : undefined
      closed = !parsed.keepAlive
      const answer = answerTo(handle, parsed.request)
      if (!(answer instanceof Promise)) write(socket, answer, parsed.keepAlive)
      else {
        busy = true
        void answer.then((settled) => {
          busy = false
          if (!socket.destroyed) write(socket, settled, parsed.keepAlive)
          next()
        })
      }
    }
  }
  const received = (chunk: Buffer) => {
    if (closed) return // after the last answer it will give: nothing more is read
    pending = pending ? Buffer.concat([pending, chunk]) : chunk
    next()
  }
  // A read in the one buffer is the next read's memory: what is left of it is copied.
  const lent = (length: number, read: Buffer) => {
    received(read.subarray(0, length))
    if (pending?.buffer === read.buffer) pending = Buffer.from(pending)
  }
  if (!readIntoOneBuffer(socket, lent)) socket.on('data', received)
  socket.on('error', () => {}) // a client gone: nobody to answer
}

// Listens on HOST and PORT as bench/floor.ts does, and says where; on SIGTERM or SIGINT, stop() and exit
// at once: the connections a floor holds open are the benchmark's own, ended with it.
export function serveWire(handle: Handler, stop: () => void) {
  const server = createServer({ noDelay: true }, (socket) => serveConnection(socket, handle))
  server.listen(Number(process.env.PORT ?? 0), process.env.HOST ?? '127.0.0.1', () => {
    const { address, port } = server.address() as { address: string; port: number }
    console.log(`listening on http://${address}:${port}`)
  })
  const exit = () => {
    server.close()
    stop()
    process.exit(0)
  }
  process.on('SIGTERM', exit)
  process.on('SIGINT', exit)
}
