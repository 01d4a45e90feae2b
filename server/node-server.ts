// The API on node:http, through @hono/node-server: the server `HTTP_SERVER=node-server` selects, and
// what `node app.ts` serves the API with. Set for tens of thousands of keep-alive users: its timeouts,
// the JSON error shape for what never reaches Hono, a bound on pipelined answers nobody reads, a
// connection past capacity answered rather than dropped, the body's limit on every request, and the
// drain.
import { getRequestListener, RequestError, type HttpBindings } from '@hono/node-server'
import { createServer, IncomingMessage, type RequestListener, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { errorBody, errorResponse, JSON_HEADERS } from '../app.ts'
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
import { MAX_FRAMING_BYTES, PLAIN_HOST } from './http1.ts'
import { rawError } from './responses.ts'

type FetchCallback = Parameters<typeof getRequestListener>[0]

export function createNodeServer(fetch: Fetch, maxBodyBytes: number): ApiServer {
  let draining = false
  let admitted = 0
  // A request the adapter cannot even build (a bad Host header, say) still gets the JSON error.
  const listener = getRequestListener(closingWhen(fetch, () => draining) as FetchCallback, {
    errorHandler: (error) => {
      if (error instanceof RequestError) return errorResponse(400, REFUSALS[400])
      console.error(error)
      return errorResponse(500, 'internal server error')
    },
  })
  const server = createServer(
    {
      keepAliveTimeout: KEEP_ALIVE_MS,
      headersTimeout: HEADERS_TIMEOUT_MS, // a slow or silent client is closed...
      requestTimeout: REQUEST_TIMEOUT_MS,
      connectionsCheckingInterval: 2_000, // ...within 2 s of its time running out
      requireHostHeader: false, // Node's refusal has no body; the adapter refuses in the JSON error shape
      // A request without Content-Length or Transfer-Encoding, as every GET, comes with its body stream
      // already ended: nothing to set in motion and tear down again for a body it cannot have.
      optimizeEmptyRequests: true,
    },
    boundPipelining(maxBodyBytes, overCapacityAnswered(hostForHttp10(refusingLargeBodies(maxBodyBytes, listener)))),
  )
  // A client that sends its FIN after a whole request is still answered, then closed, as server/wire.ts
  // does: by default node:http drops an answer not written by then (a follower's forwarded write, a
  // write retried while another process holds the lock), though its request was served.
  ;(server as typeof server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true
  const api: ApiServer = {
    server,
    maxConnections: Infinity,
    idleSince,
    drain(drained) {
      draining = true
      server.close(() => drained())
      setTimeout(() => server.closeAllConnections(), DRAIN_MS).unref()
    },
  }
  server.on('connection', (socket: Connection) => {
    socket[ANSWERED] = lastAnswer()
    stopParsingWhenClosed(socket)
    socket.destroySoon = closeGently
    if (admitted < api.maxConnections) {
      admitted++
      socket.once('close', () => admitted--)
    } else overCapacity(socket)
  })
  // HTTP that cannot be parsed, headers over 16 KB, or a client too slow: the same error shape, then close.
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (error.code === 'ECONNRESET' || !socket.writable) return socket.destroy()
    afterAnswers(socket as Connection, error.code)
  })
  // An expectation other than 100-continue: Node's own 417 has no body.
  server.on('checkExpectation', (_request: IncomingMessage, response: ServerResponse) => refuseAndClose(response, 417))
  return api
}

const CLIENT_ERRORS: Record<string, number> = {
  HPE_HEADER_OVERFLOW: 431,
  ERR_HTTP_REQUEST_TIMEOUT: 408,
  HPE_CHUNK_EXTENSIONS_OVERFLOW: 413,
  HPE_PAUSED: 413, // boundChunks pauses the parser past its bound
}

// The requests read whole before the fault are answered first, in order, as ours answers them: Node
// would write the refusal at once, ahead of answers still on their way, and drop those, though their
// handlers ran (a post committed, and its client told 400). The request the fault is in is not
// answered but refused: one whose head Node handed on in this same read never reaches its handler, and
// one whose handler has begun (its body cut short, or its trailer too large), which waits for a body
// that will not come, is refused through its own response, which Node writes in its turn. Bytes after
// a request with Connection: close are ignored (RFC 9112, 9.6), and its answer closes.
const REFUSAL = Symbol('the refusal to write once its answers are')
const CLOSING = Symbol('an answer of ours closes it')
const COUNTED = Symbol('its answer counts in UNWRITTEN')
const BEGUN = Symbol('its handler has begun')
const RESPONSE = Symbol('its response')
type Incoming = IncomingMessage & {
  [COUNTED]?: true
  [BEGUN]?: true
  [REFUSAL]?: true
  [RESPONSE]?: ServerResponse
  _dump?: () => void // what node:http calls on a body its handler left unread
}
// A connection with what node:http keeps of its parser on it (undocumented, but how it has worked since
// 0.x): the request being parsed, the callback that takes each head, and its hold on the socket's reads.
type Parsing = Connection & {
  parser?: {
    incoming?: Incoming | null
    onIncoming?: (request: IncomingMessage, keepAlive: boolean) => number
    pause(): void
    _consumed?: boolean
    unconsume(): void
  } | null
}

function afterAnswers(socket: Parsing, code: string | undefined) {
  if (socket[REFUSAL] !== undefined) return // refused already: Node reads on, and faults again
  const status = CLIENT_ERRORS[code ?? ''] ?? 400
  // After an answer that closes the connection (Connection: close asked, or a refusal of ours: a 417,
  // say), nothing more is read or said.
  const refuse = () => {
    if (socket.writableEnded) return
    if (code === 'HPE_CLOSED_CONNECTION' || socket[CLOSING]) closeGently.call(socket)
    else closeGently.call(socket, rawError(status, REFUSALS[status]))
  }
  const faulty = socket.parser?.incoming
  if (faulty?.[COUNTED] && !faulty.complete) {
    if (faulty[BEGUN]) return refuseInTurn(socket, faulty[RESPONSE]!, status)
    faulty[REFUSAL] = true
    socket[UNWRITTEN]!--
  }
  if ((socket[UNWRITTEN] ?? 0) === 0) return refuse()
  socket[REFUSAL] = refuse
}

// Nothing more is said once the refusal is: the connection closes after it, or, where the handler's own
// answer has begun, after that.
function refuseInTurn(socket: Parsing, outgoing: ServerResponse, status: number) {
  socket[REFUSAL] = () => closeGently.call(socket)
  if (!outgoing.headersSent) return refuseAndClose(outgoing, status)
  if ((socket[UNWRITTEN] ?? 0) === 0) closeGently.call(socket)
}

// RFC 9112 requires Host of HTTP/1.1 requests only; the adapter needs one of every request, to build its
// URL. An HTTP/1.0 request without one is for this server, by whatever name. A Host that WHATWG URL
// cannot read (127.0..1, 1270.0.1) is a 400: the adapter would fail building the URL of a POST, a 500.
const hostForHttp10 =
  (listener: RequestListener): RequestListener =>
  (incoming, outgoing) => {
    if (incoming.httpVersion === '1.0') incoming.headers.host ??= 'localhost'
    const host = incoming.headers.host
    if (host !== undefined && !PLAIN_HOST.test(host) && !URL.canParse(`http://${host}/`))
      return refuseAndClose(outgoing, 400)
    return listener(incoming, outgoing)
  }

// A body over the limit is refused by its length, whether or not its handler would read it, as ours
// refuses it: unread, node:http would parse all of it, and the adapter wait up to 500 ms for it.
const refusingLargeBodies =
  (maxBodyBytes: number, listener: RequestListener): RequestListener =>
  (incoming, outgoing) => {
    if (Number(incoming.headers['content-length']) > maxBodyBytes) return refuseAndClose(outgoing, 413)
    return listener(incoming, outgoing)
  }

// An answer that comes once the drain has begun closes its connection, though its request came before;
// so does one that comes after the client's FIN, and says so.
function closingWhen(fetch: Fetch, draining: () => boolean): Fetch {
  const closeIfEnding = (env: HttpBindings) => {
    if (draining() || env.incoming.socket.readableEnded) env.outgoing.shouldKeepAlive = false
  }
  return (request, env) => {
    const answer = fetch(request, env)
    if (answer instanceof Promise) return answer.then((response) => (closeIfEnding(env!), response))
    closeIfEnding(env!)
    return answer
  }
}

// Past capacity, a connection is answered once and closed: GET /health as usual, anything else a 503;
// one that asks nothing within a second is sent the 503 all the same.
const OVER = Symbol('past capacity')
type Connection = Socket & {
  [OVER]?: NodeJS.Timeout
  [UNWRITTEN]?: number
  [ANSWERED]?: number
  [READ]?: number
  [REFUSAL]?: () => void
  [CLOSING]?: true
}

function overCapacity(socket: Connection) {
  socket[OVER] = setTimeout(() => {
    if (!socket.destroyed && socket.bytesRead === 0)
      socket.end(rawError(503, REFUSALS[503], { 'retry-after': RETRY_AFTER_S }))
  }, OVER_CAPACITY_MS).unref()
}

const overCapacityAnswered =
  (listener: RequestListener): RequestListener =>
  (incoming, outgoing) => {
    const socket = incoming.socket as Connection
    if (socket[OVER] === undefined) return listener(incoming, outgoing)
    clearTimeout(socket[OVER])
    outgoing.shouldKeepAlive = false
    if (incoming.method === 'GET' && incoming.url?.split('?')[0] === HEALTH_PATH) return listener(incoming, outgoing)
    refuseAndClose(outgoing, 503, { 'retry-after': RETRY_AFTER_S })
  }

function refuseAndClose(outgoing: ServerResponse, status: number, fields: Record<string, string> = {}) {
  const socket: Connection = outgoing.req.socket as Socket
  socket[CLOSING] = true
  const body = errorBody(REFUSALS[status])
  outgoing
    .writeHead(status, { ...JSON_HEADERS, ...fields, 'content-length': Buffer.byteLength(body), connection: 'close' })
    .end(body)
}

// Node parses every request in what it has read from a connection and answers each before it looks at
// whether any are being taken (api-server.ts, MAX_UNWRITTEN). Here the request after the bound closes
// the connection, and the answers still queued are dropped.
const UNWRITTEN = Symbol('answers the kernel has not taken')
// For the memory guard: when a connection last answered (in the order of all answers; one that has yet
// to ask, the last answer of all when it came), and how many bytes it had read by then: more read since
// is a request on its way.
const ANSWERED = Symbol('the number of its last answer')
const READ = Symbol('bytes read at its last answer')

function boundPipelining(maxBodyBytes: number, listener: RequestListener): RequestListener {
  return (incoming, outgoing) => {
    const socket = incoming.socket as Connection
    const ahead = socket[UNWRITTEN] ?? 0
    if (ahead >= MAX_UNWRITTEN || socket.destroyed) return void socket.destroy()
    socket[UNWRITTEN] = ahead + 1
    const counted: Incoming = incoming
    counted[COUNTED] = true
    counted[RESPONSE] = outgoing
    if (incoming.headers['transfer-encoding'] !== undefined) boundChunks(counted, maxBodyBytes)
    outgoing.on('finish', written) // its last byte is with the kernel
    // Answered once Node has parsed all it read (Node runs no microtask inside its parser): a
    // connection that pipelines past the bound is closed by then, and costs no query. A microtask,
    // not setImmediate, which costs an extra turn of the event loop (BENCHMARKS.md, "Counted:
    // instructions, syscalls and CPU time a request").
    queueMicrotask(() => answerIfOpen(listener, incoming, outgoing))
  }
}

// node:http counts no chunked framing: a 16 KB body may come as 16,000 one-byte chunks, each a Buffer
// of its own through the adapter's two web streams; 100,000 of them kept a /health probe waiting 0.6 s.
// A chunk whose data comes in the same read as the chunk before had its framing read whole, at least
// 5 bytes ("1\r\n", then "\r\n" after its data). Past the chunks that ours' 8 KB of framing allows, or
// past the body's limit, the request is refused with ours' 413, nothing more of its body is handed on
// (not even its end), and the parser is paused: Node stops at the end of this read, and reports each
// read after as a client error. Chunks one to a read each cost their client a read.
const MAX_CHUNKS = Math.floor(MAX_FRAMING_BYTES / 5)

function boundChunks(incoming: Incoming, maxBodyBytes: number) {
  const socket = incoming.socket as Parsing
  let read = -1
  let chunks = 0
  let bytes = 0
  incoming.push = (chunk, encoding) => {
    if (chunks > MAX_CHUNKS || bytes > maxBodyBytes) return true // refused
    if (chunk !== null) {
      if (socket.bytesRead === read) chunks++
      bytes += chunk.length
      if (chunks > MAX_CHUNKS || bytes > maxBodyBytes) {
        socket.parser?.pause()
        afterAnswers(socket, 'HPE_PAUSED')
        return true
      }
    }
    read = socket.bytesRead
    return IncomingMessage.prototype.push.call(incoming, chunk, encoding)
  }
  incoming._dump = dropCounted
}

// A body its handler leaves unread (a GET's, a 404's) node:http dumps: it skips push, but llhttp still
// parses every chunk of it and calls into JS for each, counted by nothing: 4 MB of one-byte chunks to
// a 404 cost the core a second. Here it is read as a handler reads it, through the bound above, and
// dropped.
function dropCounted(this: IncomingMessage) {
  this.removeAllListeners('data')
  this.resume()
}

// A Response node:http cannot write (a field value with a CR or LF, say) throws in the adapter past
// its own catch: a 500 here, where the rejection would end the process.
function answerIfOpen(listener: RequestListener, incoming: Incoming, outgoing: ServerResponse) {
  if (incoming.socket.destroyed || incoming[REFUSAL]) return
  incoming[BEGUN] = true
  const answering = listener(incoming, outgoing) as Promise<void> | undefined
  answering?.catch((error: unknown) => {
    console.error(error)
    const body = errorBody('internal server error')
    const fields = { ...JSON_HEADERS, 'content-length': Buffer.byteLength(body), connection: 'close' }
    try {
      if (!outgoing.headersSent) return void outgoing.writeHead(500, fields).end(body)
    } catch {} // what cannot be answered is closed
    outgoing.destroy()
  })
}

function written(this: ServerResponse) {
  const socket = this.req.socket as Connection
  socket[ANSWERED] = nextAnswer()
  socket[READ] = socket.bytesRead
  if (--socket[UNWRITTEN]! === 0) socket[REFUSAL]?.()
}

function idleSince(socket: Connection): number | undefined {
  if ((socket[UNWRITTEN] ?? 0) > 0 || socket.writableLength > 0 || socket.bytesRead !== (socket[READ] ?? 0))
    return undefined
  return socket[ANSWERED] ?? 0
}

// node:http closes a connection after an answer that closes it by destroySoon: a FIN, then, once it is
// written, the close, with what the client still sends unread, which the kernel answers with a reset;
// after a refusal of ours, the next read's fault destroyed it alike. A client still sending (a body
// over 16 KB, a head over 16 KB) met that as a failed write, now and then with the answer lost. Here, as
// on server/wire.ts, the last bytes go, the parser lets go of the connection, and what still comes is
// read and dropped until the client closes too, or LINGER_MS.
function closeGently(this: Parsing, last?: string) {
  if (last === undefined) this.end()
  else this.end(last)
  if (this.parser?._consumed) this.parser.unconsume()
  this.removeAllListeners('data').on('data', () => {})
  this.resume()
  const timer = setTimeout(() => this.destroy(), LINGER_MS).unref()
  this.once('close', () => clearTimeout(timer)) // which would keep the socket another 2 s
}

// Once a connection is closed, Node still parses the rest of what it read, and builds a request and a
// response for each, all kept until the close event: 2,000 per connection, for nothing. Its parser's
// onIncoming callback stops the parse when it returns -1. Without it the bound still holds, but 200
// such connections cost 500 MB again (test/hostile.test.ts fails). So once a refusal is decided, or written: no request after it is read.
function stopParsingWhenClosed(socket: Parsing) {
  const parser = socket.parser
  const onIncoming = parser?.onIncoming
  if (typeof onIncoming === 'function')
    parser!.onIncoming = (request, keepAlive) =>
      socket.destroyed || socket.writableEnded || socket[REFUSAL] !== undefined ? -1 : onIncoming(request, keepAlive)
}
