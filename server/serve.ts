// node:http around the API, set for tens of thousands of keep-alive users: its timeouts, the JSON
// error shape for what never reaches Hono, a bound on pipelined answers nobody reads, and the drain.
import { getRequestListener, RequestError, type HttpBindings } from '@hono/node-server'
import { createServer, STATUS_CODES, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { BODY_TOO_LARGE, errorBody, errorResponse, JSON_HEADERS } from '../app.ts'

// What the API answers with: app.fetch, or what wraps it (replica.ts).
export type Fetch = (request: Request, env: HttpBindings) => Response | Promise<Response>
type FetchCallback = Parameters<typeof getRequestListener>[0]

export function createApiServer(fetch: Fetch): Server {
  // A request the adapter cannot even build (a bad Host header, say) still gets the JSON error.
  const listener = boundPipelining(getRequestListener(closingWhenDraining(fetch) as FetchCallback, {
    errorHandler: (error) => {
      if (error instanceof RequestError) return errorResponse(400, 'malformed request')
      console.error(error)
      return errorResponse(500, 'internal server error')
    },
  }))
  const server = createServer(
    {
      keepAliveTimeout: 65_000, // longer than any proxy's idle timeout, so it never reuses a closed socket
      headersTimeout: 10_000, // a slow or silent client is closed...
      requestTimeout: 30_000,
      connectionsCheckingInterval: 2_000, // ...within 2 s of its time running out
      requireHostHeader: false, // Node's refusal has no body; the adapter refuses in the JSON error shape
      // A request without Content-Length or Transfer-Encoding, as every GET, comes with its body stream
      // already ended: nothing to set in motion and tear down again for a body it cannot have.
      optimizeEmptyRequests: true,
    },
    // RFC 9112 requires Host of HTTP/1.1 requests only; the adapter needs one of every request, to build
    // its URL. An HTTP/1.0 request without one is for this server, by whatever name.
    (incoming, outgoing) => {
      if (incoming.httpVersion === '1.0') incoming.headers.host ??= 'localhost'
      return listener(incoming, outgoing)
    },
  )
  server.on('connection', stopParsingWhenClosed)
  // HTTP that cannot be parsed, headers over 16 KB, or a client too slow: the same error shape, then close.
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (error.code === 'ECONNRESET' || !socket.writable) return socket.destroy()
    socket.end(CLIENT_ERRORS[error.code ?? ''] ?? MALFORMED_REQUEST)
  })
  return server
}

// The drain: no new connections; idle ones close now, busy ones right after their answer, which says
// `Connection: close` so that keep-alive clients move on cleanly; what is still open after 10 s closes.
let draining = false

export function drain(server: Server, drained: () => void) {
  draining = true
  server.close(drained)
  setTimeout(() => server.closeAllConnections(), 10_000).unref()
}

// An answer that comes once the drain has begun closes its connection, though its request came before.
function closingWhenDraining(fetch: Fetch): Fetch {
  const closeIfDraining = (env: HttpBindings) => {
    if (draining) env.outgoing.shouldKeepAlive = false
  }
  return (request, env) => {
    const answer = fetch(request, env)
    if (answer instanceof Promise) return answer.then((response) => (closeIfDraining(env), response))
    closeIfDraining(env)
    return answer
  }
}

// Whole responses, written before the HTTP layer could make a request of the bytes it got.
function rawErrorResponse(status: number, message: string) {
  const body = errorBody(message)
  const headers = Object.entries({ ...JSON_HEADERS, 'content-length': Buffer.byteLength(body), connection: 'close' })
  return `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\n${headers.map(([k, v]) => `${k}: ${v}\r\n`).join('')}\r\n${body}`
}
const MALFORMED_REQUEST = rawErrorResponse(400, 'malformed request')
const CLIENT_ERRORS: Record<string, string> = {
  HPE_HEADER_OVERFLOW: rawErrorResponse(431, 'request headers too large'),
  ERR_HTTP_REQUEST_TIMEOUT: rawErrorResponse(408, 'request timed out'),
  HPE_CHUNK_EXTENSIONS_OVERFLOW: rawErrorResponse(413, BODY_TOO_LARGE),
}

// Node parses every request in what it has read from a connection (up to 64 KB: 2,000 small requests)
// and answers each, queueing the answers behind the one being written, before it looks at whether any
// are being taken: 200 connections that pipelined 2,000 requests each and never read took 2 GB. Here a
// connection may have MAX_UNWRITTEN answers the kernel has not taken; the request after them closes it,
// and the answers still queued are dropped. Browsers, curl and k6 do not pipeline; a client that sends
// a few requests ahead is served as before.
const MAX_UNWRITTEN = 4
const UNWRITTEN = Symbol('answers the kernel has not taken')
// For the memory guard: when a connection last answered (in the order of all answers), and how many
// bytes it had read by then: more read since is a request on its way.
const ANSWERED = Symbol('the number of its last answer')
const READ = Symbol('bytes read at its last answer')
type Connection = Socket & { [UNWRITTEN]?: number; [ANSWERED]?: number; [READ]?: number }
let answers = 0

function boundPipelining(listener: RequestListener): RequestListener {
  return (incoming, outgoing) => {
    const socket = incoming.socket as Connection
    const ahead = socket[UNWRITTEN] ?? 0
    if (ahead >= MAX_UNWRITTEN || socket.destroyed) return void socket.destroy()
    socket[UNWRITTEN] = ahead + 1
    outgoing.on('finish', written) // its last byte is with the kernel
    // Answered once Node has parsed all it read (Node runs no microtask inside its parser): a
    // connection that pipelines past the bound is closed by then, and costs no query. A microtask,
    // not setImmediate, which costs an extra turn of the event loop (BENCHMARKS.md, "Counted:
    // instructions, syscalls and CPU time a request").
    queueMicrotask(() => answerIfOpen(listener, incoming, outgoing))
  }
}

function answerIfOpen(listener: RequestListener, incoming: IncomingMessage, outgoing: ServerResponse) {
  if (!incoming.socket.destroyed) listener(incoming, outgoing)
}

function written(this: ServerResponse) {
  const socket = this.req.socket as Connection
  socket[UNWRITTEN]!--
  socket[ANSWERED] = ++answers
  socket[READ] = socket.bytesRead
}

// The number of a connection's last answer, if it is idle: no request on its way, no answer unwritten.
// One that never asked is idle since it connected.
export function idleSince(socket: Connection): number | undefined {
  if ((socket[UNWRITTEN] ?? 0) > 0 || socket.writableLength > 0 || socket.bytesRead !== (socket[READ] ?? 0)) return undefined
  return socket[ANSWERED] ?? 0
}

// Once a connection is closed, Node still parses the rest of what it read, and builds a request and a
// response for each, all kept until the close event: 2,000 per connection, for nothing. Its parser's
// onIncoming callback (undocumented, but how node:http has worked since 0.x) stops the parse when it
// returns -1. Without it the bound still holds, but 200 such connections cost 500 MB again
// (test/hostile.test.ts fails).
type OnIncoming = (request: IncomingMessage, keepAlive: boolean) => number
function stopParsingWhenClosed(socket: Socket & { parser?: { onIncoming?: OnIncoming } }) {
  const parser = socket.parser
  const onIncoming = parser?.onIncoming
  if (typeof onIncoming === 'function') parser!.onIncoming = (request, keepAlive) => (socket.destroyed ? -1 : onIncoming(request, keepAlive))
}
