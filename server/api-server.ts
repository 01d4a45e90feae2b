// What the API's two HTTP servers promise alike, so that the processes and the memory guard work with
// either: server/wire.ts on node:net (the default) and server/node-server.ts on node:http with
// @hono/node-server (HTTP_SERVER=node-server). Both keep the same limits and answer in the same JSON
// error shape.
import type { HttpBindings } from '@hono/node-server'
import type { Server, Socket } from 'node:net'
import { BODY_TOO_LARGE } from '../app.ts'

// The keep-alive is app.ts's, whose starter serves with it too.
export { KEEP_ALIVE_MS } from '../app.ts'

// What the API answers with: app.fetch, or what wraps it (server/primary.ts, server/follower.ts). Over
// node:http a request comes with Node's own request and response objects; over node:net with none.
export type Fetch = (request: Request, env?: HttpBindings) => Response | Promise<Response>

export interface ApiServer {
  // Listens, and says 'connection' for each connection it takes.
  readonly server: Server
  // The number of a connection's last answer among all this process gave, if it is idle now: no
  // request on its way and no answer unwritten. One that has yet to ask counts from the last answer of
  // all when it came, so that one just come, its request still in the kernel, is not closed first.
  // Undefined while it is busy.
  idleSince(socket: Socket): number | undefined
  // How many connections it serves at most (the memory guard sets it). A connection past that is
  // answered and closed, never ignored: GET /health as usual, anything else a 503 (server at capacity).
  maxConnections: number
  // No new connections; idle ones close now, busy ones right after their answer, which says
  // `Connection: close`; whatever is still open after DRAIN_MS closes. `drained` once all have closed.
  drain(drained: () => void): void
}

// A client has 10 s to send a request's head and 30 s for all of it.
export const HEADERS_TIMEOUT_MS = 10_000
export const REQUEST_TIMEOUT_MS = 30_000
export const DRAIN_MS = 10_000
export const HEALTH_PATH = '/health'
// After its last answer a connection is closed gently: the answer, a FIN, and what the client still
// sends read and dropped until it closes too, or this long (RFC 9112, 9.6). Closed at once, with
// bytes unread, the kernel would reset it, and the client could lose the answer.
export const LINGER_MS = 2_000

// Node parses every request in what it has read from a connection (up to 64 KB: 2,000 small requests)
// and answers each, queueing the answers behind the one being written: 200 connections that pipelined
// 2,000 requests each and never read took 2 GB. So a connection may have this many answers the kernel
// has not taken, the requests taken from one read counting as such until the next read, whether their
// routes answer at once or from a promise; the request after them closes it. Browsers, curl and k6 do
// not pipeline.
export const MAX_UNWRITTEN = 4

// What each refusal says, in the API's error shape.
export const REFUSALS: Record<number, string> = {
  400: 'malformed request',
  408: 'request timed out',
  413: BODY_TOO_LARGE,
  417: 'expectation failed',
  431: 'request headers too large',
  501: 'transfer coding not implemented',
  503: 'server at capacity',
}
// A client refused for capacity may try again this many seconds later.
export const RETRY_AFTER_S = '1'
// A connection past capacity may send one request, within this long, to be answered.
export const OVER_CAPACITY_MS = 1_000

// This process's answers, numbered in order by both servers: the memory guard closes the connections
// whose last answer is the oldest first.
const answers = { given: 0 }
export const nextAnswer = () => ++answers.given
export const lastAnswer = () => answers.given
