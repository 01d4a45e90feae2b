// The $12 server challenge's feed API: Hono on node:sqlite, where SQLite writes the JSON.
import { getRequestListener, RequestError, type HttpBindings } from '@hono/node-server'
import { Hono, type Context, type Next } from 'hono'
import { bodyLimit } from 'hono/body-limit'
import { verify } from 'hono/jwt'
import { fork, type ChildProcess } from 'node:child_process'
import cluster from 'node:cluster'
import { once } from 'node:events'
import { accessSync, chmodSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, statfsSync, statSync } from 'node:fs'
import { createServer, request, STATUS_CODES, type IncomingMessage, type RequestListener, type Server, type ServerResponse } from 'node:http'
import { createServer as createNetServer, Server as NetServer, type AddressInfo, type Socket } from 'node:net'
import { dirname, resolve } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import type { Duplex } from 'node:stream'
import schema from './schema.sql' with { type: 'text' }

const SQLITE_PATH = process.env.SQLITE_PATH || 'data/feed.db'
const JWT_SECRET = process.env.JWT_SECRET || 'twelve-dollar-challenge'
const HOST = process.env.HOST || '0.0.0.0'
const PORT = Number(process.env.PORT || 3000)
// A fixed number of processes sharing the port. Unset: one, and more only while the connections need
// more open files than one process may have ("More connections than one process has files for").
const WORKERS = Number(process.env.WORKERS || 0)
// How long a write waits for another connection's write lock before it is refused with a 503. Litestream
// takes that lock for a moment at its checkpoints, and asks for 5 s (litestream.io/tips, "Busy timeout").
const BUSY_TIMEOUT_MS = Number(process.env.BUSY_TIMEOUT_MS || 5_000)
// How long the start waits for locks another process holds on the database (waitForDatabase).
const START_WAIT_MS = Number(process.env.START_WAIT_MS || 30_000)
// WAL pages after which a commit checkpoints them into the file: SQLite's default, or 0 when another
// process does the checkpoints (start.ts sets 0 under Litestream: litestream.io/tips).
const WAL_AUTOCHECKPOINT = Number(process.env.WAL_AUTOCHECKPOINT || 1000)
// Under `litestream replicate` (start.ts): Litestream's control socket, through which the server follows
// the replica, and with LITESTREAM_SYNC=wait, a write is acknowledged only once the replica holds it.
const LITESTREAM_SOCKET = process.env.LITESTREAM_SOCKET
const SYNC_WAIT = process.env.LITESTREAM_SYNC === 'wait'
// How long a write waits for the replica (LITESTREAM_SYNC=wait) before it is answered with a 503.
const REPLICA_WAIT_MS = Number(process.env.REPLICA_WAIT_MS || 5_000)
// How long the replica may go without taking what is new before /health says `behind` and the log
// says so (Litestream sends every second or two).
const REPLICA_LAG_MS = Number(process.env.REPLICA_LAG_MS || 10_000)
// A Litestream follower (start.ts, with LITESTREAM_REPLICA_URL): the primary's API, where this node
// forwards every write ("Read replicas").
const PRIMARY_API_URL = process.env.PRIMARY_API_URL?.replace(/\/+$/, '')
const MAX_BODY_BYTES = 16 * 1024
const MAX_BODY_CHARS = 500
const HELPER = process.env.HELPER_OF !== undefined // started by the first process, for its connections

// Only `litestream replicate` (npm start with LITESTREAM_REPLICA_URL) gives the server a replica to wait for.
if (SYNC_WAIT && !LITESTREAM_SOCKET && cluster.isPrimary && !HELPER) {
  console.warn('LITESTREAM_SYNC=wait without Litestream (start with LITESTREAM_REPLICA_URL and npm start): writes are acknowledged on commit here')
}

if (!process.env.JWT_SECRET && cluster.isPrimary && !HELPER) {
  console.warn('JWT_SECRET is not set: tokens are checked with the challenge\'s public default secret; set your own')
}

// A new file gets the empty schema, so the server can start anywhere; a follower's comes from the replica.
if (PRIMARY_API_URL && !existsSync(SQLITE_PATH)) {
  console.error(`${SQLITE_PATH} is missing: a follower (PRIMARY_API_URL) serves the copy \`litestream restore -f\` keeps; start it with npm start and LITESTREAM_REPLICA_URL`)
  process.exit(1)
}
if (!existsSync(SQLITE_PATH)) {
  mkdirSync(dirname(SQLITE_PATH), { recursive: true })
  const db = new DatabaseSync(SQLITE_PATH)
  db.exec(schema)
  db.close()
  console.log(`created ${SQLITE_PATH} with empty tables; for the challenge data stop the server and run: npm run seed -- --force ${SQLITE_PATH}`)
}

// One connection takes the reads and the writes. A second one for the reads would lose its page cache
// at every commit of the first (SQLite empties a connection's cache whenever the WAL changed under it),
// and the reads after each write would fetch their pages again (BENCHMARKS.md, "One connection").
// Every statement is prepared once. Reads return one column: the body SQLite built.
function openDatabase() {
  if (!existsSync(SQLITE_PATH)) throw new ApiError(503, 'database file is missing') // opening would create it
  // Opening never waits on a lock another process holds: the start waits on its own (waitForDatabase).
  // A follower's file is Litestream's to write, in rollback-journal mode: it is only ever read here.
  const db = new DatabaseSync(SQLITE_PATH, { timeout: 0, readOnly: Boolean(PRIMARY_API_URL) })
  try {
    // Stored in the file: readers never wait for the writer. Set only where it is not, since setting it
    // is a write, and a follower's file is Litestream's to write.
    if (!PRIMARY_API_URL && (db.prepare('PRAGMA journal_mode').get() as { journal_mode: string }).journal_mode !== 'wal') db.exec('PRAGMA journal_mode = WAL')
    db.exec(`
      PRAGMA synchronous = NORMAL;  -- a commit survives a process crash without an fsync of its own
      PRAGMA wal_autocheckpoint = ${WAL_AUTOCHECKPOINT};
    `)
    const statements = {
      db,
      // SQLite opens a file it may not write read-only, and such a connection stays so.
      readOnly: Boolean(PRIMARY_API_URL) || !isWritable(SQLITE_PATH),
      feed: db.prepare(`
        SELECT json_object('posts', json_group_array(json_object(
                 'id', p.id, 'body', p.body, 'created_at', p.created_at, 'author', u.username,
                 'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
               ) ORDER BY p.created_at DESC, p.id DESC)) AS json
        FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p
        JOIN users AS u ON u.id = p.user_id`),
      // No JOIN here: with a JOIN, SQLite's planner looks at the bound id, and every call then prepares
      // the statement again (three times the cost, bench/statements.ts). Scalar subqueries do not.
      post: db.prepare(`
        SELECT json_object('post', json_object(
                 'id', p.id, 'body', p.body, 'created_at', p.created_at,
                 'author', (SELECT username FROM users AS u WHERE u.id = p.user_id),
                 'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
               )) AS json
        FROM posts AS p
        WHERE p.id = ?`),
      postExists: db.prepare('SELECT 1 FROM posts WHERE id = ?'),
      likeExists: db.prepare('SELECT 1 FROM likes WHERE user_id = ? AND post_id = ?'),
      // Reads a page of the file, where SELECT 1 would not touch it.
      ping: db.prepare('SELECT count(*) FROM sqlite_schema'),
      // Reads wait for another process's locks up to BUSY_TIMEOUT_MS (a follower's Litestream applying a
      // transaction holds them a moment). Taking the write lock never waits: a write that finds it
      // taken is retried on a timer (commitBatch), so the event loop never sleeps in SQLite's busy handler.
      noWait: db.prepare('PRAGMA busy_timeout = 0'),
      wait: db.prepare(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`),
      begin: db.prepare('BEGIN IMMEDIATE'),
      commit: db.prepare('COMMIT'),
      rollback: db.prepare('ROLLBACK'),
      insertPost: db.prepare(`
        INSERT INTO posts (user_id, body) VALUES ($userId, $body)
        RETURNING json_object('post', json_object(
          'id', id, 'body', body, 'created_at', created_at, 'author', $author, 'like_count', 0
        )) AS json`),
      // Inserts only when the post exists, and ignores a repeated like.
      insertLike: db.prepare('INSERT OR IGNORE INTO likes (user_id, post_id) SELECT ?, id FROM posts WHERE id = ?'),
      // Writes page 1 (the header's user_version, to the value it has): under Litestream each commit does,
      // so each LTX file carries page 1, and a follower's Litestream, applying it, changes the header's
      // counter by which its readers know their cached pages are stale ("Read replicas").
      touchHeader: db.prepare(`PRAGMA user_version = ${(db.prepare('PRAGMA user_version').get() as { user_version: number }).user_version}`),
    }
    statements.wait.run()
    return statements
  } catch (error) {
    db.close()
    throw error
  }
}

// Opened at start (run), or else by the first request. After a fault that only a new connection gets
// past (a file that was read-only, say) it is closed, and the next request opens another.
type Database = ReturnType<typeof openDatabase>
let connection: Database | undefined

function database(): Database {
  if (connection?.readOnly && !PRIMARY_API_URL && isWritable(SQLITE_PATH)) reopenWritable()
  return (connection ??= openDatabase())
}

// The file is writable again: a new connection replaces the read-only one. SQLite made the WAL and its
// index with the file's mode of then, read-only, and a connection could not write through them.
function reopenWritable() {
  closeDatabase()
  const { mode } = statSync(SQLITE_PATH)
  for (const file of [`${SQLITE_PATH}-wal`, `${SQLITE_PATH}-shm`]) {
    try {
      chmodSync(file, mode & 0o777)
    } catch {} // gone, or another user's: the writes will say read-only, as they do now
  }
}

// The key is imported once; every request still verifies its token.
const jwtKey = await crypto.subtle.importKey(
  'raw', new TextEncoder().encode(JWT_SECRET), { name: 'HMAC', hash: 'SHA-256' }, false, ['verify'],
)
const utf8 = new TextDecoder('utf-8', { fatal: true })
const DECIMAL = /^[1-9][0-9]*$/
const SQLITE_CONSTRAINT_FOREIGNKEY = 787
const SQLITE_READONLY = 8
const SQLITE_CANTOPEN = 14
const SQLITE_READONLY_DBMOVED = 1032 // the file was moved or deleted since it was opened
// SQLite's primary result codes that mean the database, not the request, is in trouble: a 503.
const TROUBLE = new Map([
  [5, 'database is busy'],
  [6, 'database is busy'],
  [SQLITE_READONLY, 'database is read-only'],
  [10, 'database disk I/O error'],
  [13, 'database or disk is full'],
  [SQLITE_CANTOPEN, 'database file cannot be opened'],
  [15, 'database is unavailable'], // the WAL index's locks cannot be had: its file system is gone
])
const startedAt = Date.now()

// Every response is JSON, never sniffed as anything else and never cached on the way. Once the server
// is stopping, every response also closes its connection, so keep-alive clients move on cleanly.
const JSON_HEADERS = { 'content-type': 'application/json', 'x-content-type-options': 'nosniff', 'cache-control': 'no-store' }
let stopping = false

function jsonResponse(status: number, body: string, headers?: Record<string, string>) {
  if (stopping) headers = { ...headers, connection: 'close' }
  return new Response(body, { status, headers: headers ? { ...JSON_HEADERS, ...headers } : JSON_HEADERS })
}

// Every error is {"error": message}, made here, from whatever layer refuses the request.
const errorBody = (message: string) => JSON.stringify({ error: message })
const errorResponse = (status: number, message: string, headers?: Record<string, string>) =>
  jsonResponse(status, errorBody(message), headers)

class ApiError extends Error {
  status: number
  headers?: Record<string, string>
  constructor(status: number, message: string, headers?: Record<string, string>) {
    super(message)
    this.status = status
    this.headers = headers
  }
}

type User = { id: number; username: string }
type JsonRow = { json: string }

// Served by @hono/node-server, a request's env holds Node's own request and response (app.request() has none).
export const app = new Hono<{ Bindings: Partial<HttpBindings> }>()

app.get('/health', async () => {
  const problem = await databaseProblem()
  if (problem) return jsonResponse(503, JSON.stringify({ status: 'degraded', db: 'unreachable', error: problem }))
  return jsonResponse(200, JSON.stringify({ status: 'ok', db: 'ok', uptime_s: Math.floor((Date.now() - startedAt) / 1000), ...(LITESTREAM_SOCKET && { replica: replicaState() }) }))
})

app.get('/feed', () => jsonResponse(200, (database().feed.get() as JsonRow).json))

app.get('/posts/:id', (c) => {
  const row = database().post.get(parsePostId(c.req.param('id'))) as JsonRow | undefined
  if (!row) throw new ApiError(404, 'post not found')
  return jsonResponse(200, row.json)
})

app.post('/posts', limitBody, forwardOnFollower, async (c) => {
  const user = await authenticate(c)
  const body = await readPostBody(c)
  const [{ json }] = (await rejectUnknownUser(inTransaction((w) => w.insertPost.all({ userId: user.id, body, author: user.username })))) as JsonRow[]
  await replicaHolds()
  return jsonResponse(201, json)
})

app.post('/posts/:id/like', forwardOnFollower, async (c) => {
  const user = await authenticate(c)
  const postId = parsePostId(c.req.param('id'))
  const { changes } = await rejectUnknownUser(inTransaction((w) => w.insertLike.run(user.id, postId)))
  if (changes === 0 && !database().postExists.get(postId)) throw new ApiError(404, 'post not found')
  await replicaHolds()
  return jsonResponse(changes ? 201 : 200, JSON.stringify({ liked: true, already_liked: changes === 0, post_id: postId }))
})

// A known path with another method is a 405 that names the methods it takes.
app.notFound((c) => {
  const allowed = ['GET', 'POST'].filter((method) => app.router.match(method, c.req.path)[0].length > 0)
  if (allowed.length === 0) return errorResponse(404, 'not found')
  return errorResponse(405, 'method not allowed', { allow: allowed.join(', ') })
})

// A database in trouble is a 503 that says how; anything unexpected is a 500 that says nothing more.
app.onError((err, c) => {
  if (err instanceof ApiError) return errorResponse(err.status, err.message, err.headers)
  const trouble = databaseTrouble(err)
  if (trouble) return errorResponse(503, trouble)
  // The request's own stream failed: its client closed the connection before the whole body came
  // (Node's "aborted"). No server fault, and nobody is left to read the answer; a log line for each
  // would let any client flood the log.
  if (err === c.env?.incoming?.errored) return errorResponse(400, 'malformed request')
  console.error(err)
  return errorResponse(500, 'internal server error')
})

// A body over 16 KB is refused unread: by its Content-Length, or, when it comes chunked, by hono's
// bodyLimit counting as it reads. Only the chunked case pays for bodyLimit's web stream.
const limitChunkedBody = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: refuseBody })

function limitBody(c: Context, next: Next) {
  const length = c.req.header('content-length')
  if (length === undefined) return limitChunkedBody(c, next)
  if (Number(length) > MAX_BODY_BYTES) refuseBody()
  return next()
}

// The rest of the body is never read, so the connection cannot be reused.
function refuseBody(): never {
  throw new ApiError(413, 'request body must be at most 16 KB', { connection: 'close' })
}

// A post id is a positive decimal integer. Past 2^53 it is well formed but names no post here.
function parsePostId(param: string): number {
  if (!DECIMAL.test(param)) throw new ApiError(400, 'invalid post id')
  const id = Number(param)
  if (!Number.isSafeInteger(id)) throw new ApiError(404, 'post not found')
  return id
}

async function authenticate(c: Context): Promise<User> {
  const header = c.req.header('authorization')
  if (!header?.startsWith('Bearer ')) throw new ApiError(401, 'missing bearer token')
  let claims
  try {
    claims = await verify(header.slice(7), jwtKey, 'HS256')
  } catch {
    throw new ApiError(401, 'invalid or expired token')
  }
  // hono/jwt checks exp only when the token has one; a token that never expires is refused.
  if (typeof claims.exp !== 'number') throw new ApiError(401, 'invalid or expired token')
  const { sub, username } = claims
  if (typeof sub !== 'string' || !DECIMAL.test(sub) || !Number.isSafeInteger(Number(sub)) || typeof username !== 'string') {
    throw new ApiError(401, 'invalid token payload')
  }
  return { id: Number(sub), username }
}

// A body cut off on its way is not malformed JSON: a failed read goes on to onError.
async function readPostBody(c: Context): Promise<string> {
  const bytes = await c.req.arrayBuffer()
  let input
  try {
    input = JSON.parse(utf8.decode(bytes))
  } catch {
    throw new ApiError(400, 'malformed JSON body')
  }
  const body = typeof input?.body === 'string' ? input.body.trim() : ''
  if (body === '') throw new ApiError(400, 'body is required')
  // The schema counts code points; 500 emoji are 1,000 UTF-16 units and still fit.
  if (body.length > MAX_BODY_CHARS && [...body].length > MAX_BODY_CHARS) {
    throw new ApiError(400, `body must be at most ${MAX_BODY_CHARS} characters`)
  }
  return body
}

// Group commit: the writes that arrive in one event-loop turn share one transaction, and each
// request's promise settles only after that transaction has committed (a 201 means committed).
type PendingWrite = { write: (w: Database) => unknown; resolve: (value: any) => void; reject: (error: unknown) => void }
let pendingWrites: PendingWrite[] = []

const noWrite = () => undefined // /health's: would a write go through now?

function inTransaction<T>(write: (w: Database) => T): Promise<T> {
  return new Promise((resolve, reject) => {
    if (pendingWrites.push({ write, resolve, reject }) === 1) setImmediate(commitPendingWrites)
  })
}

function commitPendingWrites() {
  const batch = pendingWrites
  pendingWrites = []
  commitBatch(batch, Date.now() + BUSY_TIMEOUT_MS, 1)
}

function commitBatch(batch: PendingWrite[], deadline: number, retryMs: number) {
  let w: Database | undefined
  const outcomes: { ok: boolean; value: unknown }[] = []
  try {
    w = database()
    w.noWait.run()
    try {
      w.begin.run()
    } finally {
      w.wait.run()
    }
  } catch (error) {
    // Another process holds the write lock: try again soon, serving other requests meanwhile.
    const wait = Math.min(retryMs, deadline - Date.now())
    if (databaseTrouble(error) === 'database is busy' && wait > 0) {
      setTimeout(commitBatch, wait, batch, deadline, Math.min(2 * retryMs, 50))
      return
    }
    return failBatch(batch, error)
  }
  try {
    for (const { write } of batch) {
      try {
        outcomes.push({ ok: true, value: write(w) })
      } catch (error) {
        // A constraint undoes only its own statement; any other failure ends the whole transaction.
        if (databaseTrouble(error)) throw error
        outcomes.push({ ok: false, value: error })
      }
    }
    // A file unlinked while open would take these writes with it when the process ends.
    if (!existsSync(SQLITE_PATH)) throw new ApiError(503, 'database file is missing')
    if (LITESTREAM_SOCKET && batch.some(({ write }) => write !== noWrite)) w.touchHeader.run()
    w.commit.run()
  } catch (error) {
    if (w.db.isTransaction) w.rollback.run()
    return failBatch(batch, error)
  }
  batch.forEach(({ resolve, reject }, i) => (outcomes[i].ok ? resolve : reject)(outcomes[i].value))
}

function failBatch(batch: PendingWrite[], error: unknown) {
  forgetConnectionAfter(error)
  for (const { reject } of batch) reject(error)
}

// A connection that cannot open its files is closed: the next request opens another. (One that opened
// the file read-only is replaced once the file is writable: database().)
function forgetConnectionAfter(error: unknown) {
  if ((error as { errcode?: number } | undefined)?.errcode === SQLITE_CANTOPEN) closeDatabase()
}

// A signed token whose user id has no row cannot write: the foreign key refuses it.
async function rejectUnknownUser<T>(write: Promise<T>): Promise<T> {
  try {
    return await write
  } catch (err) {
    if ((err as { errcode?: number }).errcode === SQLITE_CONSTRAINT_FOREIGNKEY) throw new ApiError(401, 'invalid token payload')
    throw err
  }
}

function databaseTrouble(error: unknown): string | undefined {
  if (error instanceof ApiError && error.status === 503) return error.message
  const code = (error as { errcode?: number } | undefined)?.errcode
  if (code === SQLITE_READONLY_DBMOVED) return 'database file is missing'
  return code === undefined ? undefined : TROUBLE.get(code & 0xff)
}

// --- Read replicas: Litestream followers ---------------------------------------------------------
// A follower (npm start with LITESTREAM_REPLICA_URL and PRIMARY_API_URL) serves reads from a plain local
// file that `litestream restore -f` keeps: it applies each LTX file the primary's Litestream uploads,
// about a second after the commit, under SQLite's own locks (a read sees a transaction whole or not at
// all), and writes the TXID it reached to `<db>-txid`. The file stays in rollback-journal mode and is
// only read here. Each write goes to the primary's API; its answer goes back once this copy holds the
// row it wrote, so a read after a write here sees it. The row, not a TXID: the primary's Litestream
// numbers a transaction only when it next syncs, after the answer has gone. On the primary, and on a
// server without PRIMARY_API_URL, none of this runs.
const FOLLOWED_FILE = `${SQLITE_PATH}-txid`
// A follower is a sync interval or two (1 s each by default) and a follow interval (100 ms) behind; past
// this it answers anyway.
const FOLLOW_CATCH_UP_MS = 5_000
// Past the primary's own wait for the write lock, it is not coming back: the write's fate is unknown.
const FORWARD_TIMEOUT_MS = BUSY_TIMEOUT_MS + 5_000
// How often the waiting writes look at `<db>-txid`.
const POLL_MS = 10

// The token is checked here before anything is sent (the primary checks it again), and the request
// goes to the primary as it came. (Generic over the route's path so that the handler after it still
// knows its params, like `:id`.)
async function forwardOnFollower<Path extends string>(c: Context<any, Path>, next: Next) {
  if (!PRIMARY_API_URL) return next()
  const user = await authenticate(c)
  const body = await c.req.arrayBuffer()
  const headers: Record<string, string> = { authorization: c.req.header('authorization')! }
  const type = c.req.header('content-type')
  if (type) headers['content-type'] = type
  let answer: Response
  try {
    answer = await fetch(PRIMARY_API_URL + c.req.path, {
      method: 'POST', headers, body: body.byteLength ? body : undefined, signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS),
    })
  } catch (error) {
    // Refused: nothing was written. Timed out: the primary may have committed it, or not.
    if ((error as Error).name === 'TimeoutError') throw new ApiError(504, 'primary did not answer in time')
    throw new ApiError(503, 'primary is unreachable')
  }
  const text = await answer.text()
  if (answer.status !== 200 && answer.status !== 201) return jsonResponse(answer.status, text)
  const likedPost = c.req.param('id')
  const here = likedPost === undefined
    ? () => rowHere('postExists', (JSON.parse(text) as { post: { id: number } }).post.id)
    : () => rowHere('likeExists', user.id, Number(likedPost))
  if (await caughtUp(here, FOLLOW_CATCH_UP_MS)) return jsonResponse(answer.status, text)
  // Committed on the primary but not here yet: still the primary's answer (an error would invite a
  // retry, and a second post), marked so the client knows a read here may not show it yet.
  console.warn(`follower: a write the primary took is not here after ${FOLLOW_CATCH_UP_MS} ms; answered without it`)
  return jsonResponse(answer.status, text, { 'litestream-caught-up': 'false' })
}

// A read that fails here (Litestream holding the locks past the busy timeout) is a row not here yet.
function rowHere(statement: 'postExists' | 'likeExists', ...ids: number[]): boolean {
  try {
    return database()[statement].get(...ids) !== undefined
  } catch {
    return false
  }
}

// The TXID Litestream last applied here; empty when it cannot be read.
function position(): string {
  try {
    return readFileSync(FOLLOWED_FILE, 'latin1')
  } catch {
    return ''
  }
}

// Forwarded writes wait here until this copy has them. One timer reads the position for all of them,
// and looks again at a write only when the position has moved.
type CatchUp = { here: () => boolean; deadline: number; resolve: (caughtUp: boolean) => void }
const catchingUp = new Set<CatchUp>()
let lastPosition = ''

function caughtUp(here: () => boolean, withinMs: number): Promise<boolean> {
  // The position is read before the first look: a move right after that look is one the timer sees.
  // (With a timer running, its last read came before this look.)
  if (catchingUp.size === 0) lastPosition = position()
  if (here()) return Promise.resolve(true)
  return new Promise((resolve) => {
    if (catchingUp.add({ here, deadline: Date.now() + withinMs, resolve }).size === 1) setTimeout(pollPosition, POLL_MS)
  })
}

function pollPosition() {
  const now = position()
  const moved = now !== lastPosition
  lastPosition = now
  for (const wait of catchingUp) {
    const here = moved && wait.here()
    if (here || Date.now() >= wait.deadline) {
      catchingUp.delete(wait)
      wait.resolve(here)
    }
  }
  if (catchingUp.size) setTimeout(pollPosition, POLL_MS)
}

// --- The Litestream replica ------------------------------------------------------------------------
// Under `litestream replicate` (start.ts, with LITESTREAM_REPLICA_URL) the server asks Litestream's
// control socket (an HTTP server on a Unix socket) about the replica. `GET /list` gives, for each
// database, when the replica last took everything Litestream had for it: Litestream tries every second
// or two, and an idle database with a reachable replica counts as a success. Asked once a second, it
// gives /health how long ago that was (`behind_ms`), and the log says when that passes REPLICA_LAG_MS
// and when the replica has caught up. Asking changes nothing in Litestream (`POST /sync` would make an
// LTX file, one more upload). A replica behind does not make /health a 503: the node serves every
// request right, and a load balancer would pull the only primary.
const REPLICA_DB = resolve(SQLITE_PATH) // the path start.ts gave Litestream
const logsReplica = !HELPER && (cluster.isPrimary || cluster.worker?.id === 1) // one process says it
let replicaSyncedAt = Date.now() // Litestream's last success, or this process's start
let litestreamDown: string | undefined // why Litestream did not answer
let uploadFailed: string | undefined // why the last upload this server asked for failed
let worstBehindMs = 0 // since the replica last was ok, for the log

// One request to Litestream's control socket, answered with JSON in time, or an error that says why.
function askLitestream<T>(method: 'GET' | 'POST', path: string, timeoutMs: number, body?: object): Promise<T> {
  return new Promise((resolve, reject) => {
    const ask = request({ socketPath: LITESTREAM_SOCKET, method, path, timeout: timeoutMs, headers: { 'content-type': 'application/json' } }, (res) => {
      let text = ''
      res.setEncoding('utf8').on('data', (chunk) => (text += chunk)).on('end', () => {
        try {
          const answer = JSON.parse(text)
          if (res.statusCode === 200) resolve(answer)
          else reject(new Error(answer.error ?? `status ${res.statusCode}`))
        } catch {
          reject(new Error(`status ${res.statusCode}, ${text.slice(0, 200)}`))
        }
      })
    })
    ask.on('timeout', () => ask.destroy(new Error(`no answer within ${timeoutMs / 1000} s`)))
    ask.on('error', reject)
    ask.end(body && JSON.stringify(body))
  })
}

// Litestream sends what is new in the WAL and answers once the replica holds it (`wait`).
const sendToReplica = (timeoutMs: number) => askLitestream('POST', '/sync', timeoutMs, { path: REPLICA_DB, wait: true, timeout: Math.ceil(timeoutMs / 1000) })

function replicaState() {
  const behind_ms = Date.now() - replicaSyncedAt
  const state = litestreamDown ? 'unreachable' : behind_ms > REPLICA_LAG_MS ? 'behind' : 'ok'
  const error = litestreamDown ?? uploadFailed
  return { state, behind_ms, ...(error && { error }) }
}

// Litestream first looks at the database a second after it starts, and at shutdown sends only a
// database it has looked at: writes answered before then would not reach the replica on a quick stop.
// So the server has it look (a sync) before it takes a request.
async function startFollowingReplica() {
  try {
    await askLitestream('POST', '/sync', 5_000, { path: REPLICA_DB })
  } catch (error) {
    console.warn(`replica: Litestream did not take the database at start (${(error as Error).message})`)
  }
  followReplica()
}

async function followReplica() {
  try {
    type List = { databases: { path: string; last_sync_at?: string }[] }
    const { databases } = await askLitestream<List>('GET', '/list', 2_000)
    const syncedAt = Date.parse(databases.find((db) => db.path === REPLICA_DB)?.last_sync_at ?? '')
    if (syncedAt > replicaSyncedAt) replicaSyncedAt = syncedAt
    litestreamDown = undefined
  } catch (error) {
    litestreamDown = `Litestream does not answer: ${(error as Error).message}`
  }
  const { state, behind_ms, error } = replicaState()
  if (logsReplica && state !== 'ok' && worstBehindMs === 0) {
    console.warn(`replica: ${state === 'unreachable' ? 'unreachable' : `${(behind_ms / 1000).toFixed(0)} s behind`}${error ? ` (${error})` : ''}; the writes since may be on this box only`)
  } else if (logsReplica && state === 'ok' && worstBehindMs > 0) {
    console.log(`replica: caught up, after ${(worstBehindMs / 1000).toFixed(1)} s behind at most`)
  }
  worstBehindMs = state === 'ok' ? 0 : Math.max(worstBehindMs, behind_ms, 1)
  if (behind_ms <= 3_000) uploadFailed = undefined
  else if (logsReplica && !litestreamDown && !sending) sendWhatTheReplicaLacks()
  setTimeout(followReplica, 1_000).unref()
}

// After a failed upload Litestream waits before it tries again, twice as long each time, up to 5
// minutes. Past 3 s behind, one process asks for the upload itself, one at a time, so the replica
// catches up soon after the store is back.
let sending = false
async function sendWhatTheReplicaLacks() {
  sending = true
  try {
    await sendToReplica(REPLICA_WAIT_MS)
    uploadFailed = undefined
  } catch (error) {
    uploadFailed = `sending to the replica failed: ${(error as Error).message}`
  }
  sending = false
}

// LITESTREAM_SYNC=wait: a write's answer waits until the replica holds its transaction. One sync
// with `wait` is in flight at a time, for every write committed before it was asked for (Litestream
// reads the WAL once asked, and answers once the replica holds all it read); the writes committed
// meanwhile wait for the next, so the syncs come from batches, not from writes. A write the replica
// has not confirmed within REPLICA_WAIT_MS is a 503: it stays committed here, and Litestream sends it
// once the replica is back.
let awaitingReplica: { resolve: () => void; reject: (error: unknown) => void }[] = []
let syncing = false
let syncFailing = false // since the last sync that failed, for the log

function replicaHolds(): Promise<void> | undefined {
  if (!SYNC_WAIT || !LITESTREAM_SOCKET) return
  return new Promise((resolve, reject) => {
    awaitingReplica.push({ resolve, reject })
    if (!syncing) syncReplica()
  })
}

async function syncReplica() {
  const round = awaitingReplica
  awaitingReplica = []
  syncing = true
  try {
    await sendToReplica(REPLICA_WAIT_MS)
    if (syncFailing && logsReplica) console.log('replica: writes are confirmed by the replica again')
    syncFailing = false
    for (const { resolve } of round) resolve()
  } catch (error) {
    if (!syncFailing && logsReplica) console.warn(`replica: a write was not confirmed (Litestream: ${(error as Error).message}); writes answer 503 until the replica confirms them again`)
    syncFailing = true
    const refusal = new ApiError(503, 'the replica did not confirm the write; it is committed here, and reaches the replica once the replica is back')
    for (const { reject } of round) reject(refusal)
  }
  syncing = false
  if (awaitingReplica.length) syncReplica()
}

// Whatever stands between the database and a read or a write right now; /health asks on every call.
async function databaseProblem(): Promise<string | undefined> {
  try {
    database().ping.get()
    if (!existsSync(SQLITE_PATH)) return 'database file is missing'
    if (PRIMARY_API_URL) return undefined // a follower's writes are the primary's to take
    // SQLite lets a read-only connection take the write lock; only the first write would fail.
    if (!isWritable(SQLITE_PATH)) return 'database is read-only'
    const { bavail, bsize } = statfsSync(dirname(SQLITE_PATH))
    if (bavail * bsize < 1024 * 1024) return 'disk is full'
    // Could a write go through now? An empty one joins the next group commit: it waits for a lock
    // another process holds (Litestream's checkpoint, another worker's commit) as long as a write
    // would, and fails only where a write would fail.
    await inTransaction(noWrite)
    return undefined
  } catch (error) {
    forgetConnectionAfter(error)
    const trouble = databaseTrouble(error)
    if (trouble) return trouble
    console.error(error)
    return 'database error'
  }
}

function isWritable(path: string) {
  try {
    accessSync(path, constants.W_OK)
    return true
  } catch {
    return false
  }
}

function closeDatabase() {
  connection?.db.close()
  connection = undefined
}

// Another process may hold the database's locks for a while at start: a long transaction elsewhere, or
// a follower's Litestream applying a large one. The start waits for them, and says so, for up to
// START_WAIT_MS; then it serves anyway: /health says the database is busy, and the first request to
// find it free opens the connection.
async function waitForDatabase() {
  const started = Date.now()
  for (let waited = false; ; waited = true) {
    try {
      database()
      if (waited) console.log(`start: ${SQLITE_PATH} is free after ${((Date.now() - started) / 1000).toFixed(1)} s`)
      return
    } catch (error) {
      if (databaseTrouble(error) !== 'database is busy') throw error
      if (Date.now() - started >= START_WAIT_MS) {
        return console.warn(`start: ${SQLITE_PATH} is still locked after ${START_WAIT_MS / 1000} s; serving, and /health says the database is busy until it is free`)
      }
      if (!waited) console.log(`start: ${SQLITE_PATH} is locked by another process (a long transaction); waiting up to ${START_WAIT_MS / 1000} s`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
  }
}

// Open the database, serve until SIGTERM or SIGINT, then finish in-flight requests, close the database
// and exit 0.
export async function run() {
  if (WORKERS > 1 && cluster.isPrimary) return runWorkers()
  await waitForDatabase()
  if (LITESTREAM_SOCKET) await startFollowingReplica()
  // A request the adapter cannot even build (a bad Host header, say) still gets the JSON error.
  const listener = boundPipelining(getRequestListener(app.fetch, {
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
    },
    // RFC 9112 requires Host of HTTP/1.1 requests only; the adapter needs one of every request, to build
    // its URL. An HTTP/1.0 request without one is for this server, by whatever name.
    (incoming, outgoing) => {
      if (incoming.httpVersion === '1.0') incoming.headers.host ??= 'localhost'
      return listener(incoming, outgoing)
    },
  )
  server.on('connection', stopParsingWhenClosed)
  server.on('connection', counted)
  // HTTP that cannot be parsed, headers over 16 KB, or a client too slow: the same error shape, then close.
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (error.code === 'ECONNRESET' || !socket.writable) return socket.destroy()
    socket.end(CLIENT_ERRORS[error.code ?? ''] ?? MALFORMED_REQUEST)
  })
  if (HELPER) takeOrders(server)
  else listenOnPort((firstServer = server))
  const stop = () => {
    if (stopping) return // a second signal changes nothing: the drain is under way, bounded at 10 s
    // No new connections; idle ones close now, busy ones right after their response.
    stopping = true
    for (const helper of helpers) helper.kill('SIGTERM')
    server.close(() => {
      stopped = true
      exitWhenDone()
    })
    setTimeout(() => server.closeAllConnections(), 10_000).unref()
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  if (HELPER) process.on('disconnect', stop) // the first process is gone: nobody would start the next
}

// The first process listens on PORT. WORKERS workers each listen on a socket of their own, and the
// kernel spreads new connections over them.
let boundPort = PORT // and once listening, the port it got (PORT=0), for listening again on the same
function listenOnPort(server: Server) {
  server.listen({ host: HOST, port: boundPort, reusePort: WORKERS > 1, exclusive: true }, () => {
    const { address, port } = server.address() as AddressInfo
    boundPort = port
    console.log(`listening on http://${address}:${port}`)
    accepting = server
    if (!WORKERS) capacity = FILE_LIMIT - filesOpen() - SPARE_FILES
  })
}

let stopped = false // every connection of this process closed
function exitWhenDone() {
  if (!stopped || helpers.size > 0) return
  closeDatabase()
  process.exit(0)
}

// --- More connections than one process has files for ---------------------------------------------
// Each connection is an open file, and a process may have only so many: 65,535 under the challenge's
// systemd, 20,000 on these machines. One process serves a request for the least CPU, so the first
// serves alone while it has room. Nearly full, it starts a helper: this script again, with database
// connections of its own, as a WORKERS worker has, born with a copy of the listening socket. Full, it
// stops accepting, and the helper accepts from the same socket: the kernel queues what arrives
// between the two, and refuses nothing. The first process runs this for every helper in turn: it
// starts the next when the one accepting is nearly full (with a copy of the socket from it), and moves
// the accepting on when that one is full. A connection stays where it was taken; a helper that no
// longer accepts exits with its last connection. No setting: the processes follow the connections.
const FILE_LIMIT = openFileLimit()
// Files of a process that are not its connections (the database, its WAL, the event loop, a replica's
// forwarded writes), and connections accepted until its listener is closed.
const SPARE_FILES = Math.max(64, Math.floor(FILE_LIMIT / 16))
// Nearly full: the room a helper's start (about 0.3 s) needs at the challenge's fastest arrivals, 1,700
// connections a second, many times over; 2,300 under a limit of 20,000 and 7,700 under 65,535.
const NEARLY_FULL = 7 / 8
const SOCKET_FD = 4 // where a helper has its copy: after stdin, stdout, stderr and the IPC channel
type Order = 'ready' | 'nearly full' | 'full' | 'copy' | 'stop' | 'accept'
let capacity = Infinity // connections this process takes before it stops accepting
let connections = 0
let accepting: Server | undefined
let nearlySaid = false
let fullSaid = false
let steppedOut = false

function counted(socket: Socket) {
  connections++
  socket.once('close', uncounted)
  if (!accepting) return
  if (connections >= capacity * NEARLY_FULL && !nearlySaid) {
    nearlySaid = true
    tellFirst('nearly full')
  }
  if (connections >= capacity && !fullSaid) {
    fullSaid = true
    tellFirst('full')
  }
}

function uncounted() {
  connections--
  if (HELPER && steppedOut && connections === 0 && !stopping) {
    stopping = true
    stopped = true
    exitWhenDone()
  }
}

// node:http's close() would also close the idle connections: only the listener closes.
function stopAccepting() {
  steppedOut = true
  nearlySaid = fullSaid = false
  NetServer.prototype.close.call(accepting!)
  accepting = undefined
  console.log(`process ${process.pid} is full (${connections} connections, ${FILE_LIMIT} open files at most): the next takes new ones`)
}

// A helper tells the first process over IPC; the first tells itself.
function tellFirst(what: Order) {
  if (HELPER) process.send!(what)
  else if (what === 'nearly full') prepareNext(undefined)
  else if (what === 'full') moveOn(undefined)
}

// In the first process: the helpers, the one accepting (undefined: the first itself) and the next.
let firstServer: Server | undefined
const helpers = new Set<ChildProcess>()
const ready = new Set<ChildProcess>()
let acceptor: ChildProcess | undefined
let next: ChildProcess | undefined
let copyAsked = false
let fullWaiting = false // the one accepting is full, and the next is not started yet

function prepareNext(from: ChildProcess | undefined) {
  if (next || copyAsked || stopping) return
  if (!from) next = startHelper(accepting!)
  else {
    copyAsked = true
    from.send('copy') // it answers with its listening server
  }
}

function moveOn(from: ChildProcess | undefined) {
  prepareNext(from)
  fullWaiting = !next
  if (!next) return
  if (from) from.send('stop')
  else stopAccepting()
  promoteNext()
}

function promoteNext() {
  acceptor = next!
  next = undefined
  if (ready.has(acceptor)) acceptor.send('accept')
}

// node:net has no public way to a listening socket's file descriptor; its handle has it.
type Listener = NetServer & { _handle: { fd: number } }

function startHelper(copy: NetServer): ChildProcess {
  const helper = fork(process.argv[1], process.argv.slice(2), {
    env: { ...process.env, HELPER_OF: String(process.pid) },
    stdio: ['inherit', 'inherit', 'inherit', 'ipc', { fd: (copy as Listener)._handle.fd } as never],
  })
  helpers.add(helper)
  helper.on('message', (message: Order, server?: NetServer) => {
    if (message === 'ready') {
      ready.add(helper)
      if (helper === acceptor) helper.send('accept')
    } else if (message === 'copy' && server) {
      copyAsked = false
      next = startHelper(server)
      server.close() // the new helper has its own copy now
      if (fullWaiting) moveOn(helper)
    } else if (helper === acceptor) {
      if (message === 'nearly full') prepareNext(helper)
      else if (message === 'full') moveOn(helper)
    }
  })
  // An order sent as it dies fails; its 'close' below says what happens next.
  helper.on('error', () => {})
  // 'close', not 'exit': by then every message it sent has arrived, a copy of the socket included, so
  // whether anyone else still holds the socket is known.
  helper.on('close', (code, signal) => {
    helpers.delete(helper)
    ready.delete(helper)
    if (helper === next) next = undefined
    if (stopping) return exitWhenDone()
    if (code !== 0) console.error(`process ${helper.pid} exited (${signal ?? code}), and its connections with it`)
    if (helper === acceptor) acceptAgain()
  })
  return helper
}

// The helper accepting died: the next accepts, or else the first listens again, on a new socket (what
// was queued on the old one is reset with it, as it would be with a single process that died).
function acceptAgain() {
  copyAsked = fullWaiting = false
  acceptor = undefined
  if (next) promoteNext()
  else listenOnPort(firstServer!)
}

// In a helper: what the first process asks of it.
function takeOrders(server: Server) {
  process.on('message', (message: Order) => {
    if (message === 'copy') process.send!('copy', accepting)
    else if (message === 'stop') stopAccepting()
    else if (message === 'accept') {
      server.listen({ fd: SOCKET_FD }, () => {
        accepting = server
        capacity = FILE_LIMIT - filesOpen() - SPARE_FILES
        console.log(`process ${process.pid} takes new connections`)
      })
    }
  })
  process.send!('ready')
}

function openFileLimit(): number {
  try {
    const soft = /^Max open files +(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]
    return soft ? Number(soft) : Infinity
  } catch {
    return Infinity // not Linux: the limit is the operator's to know, and WORKERS theirs to set
  }
}

function filesOpen(): number {
  try {
    return readdirSync('/proc/self/fd').length
  } catch {
    return 0
  }
}

// --- Pipelined requests nobody reads --------------------------------------------------------------
// Node parses every request in what it has read from a connection (up to 64 KB: 2,000 small requests)
// and answers each, queueing the answers behind the one being written, before it looks at whether any
// are being taken. 200 connections that pipeline 2,000 requests each and never read took 2 GB. Here a
// connection may have MAX_UNWRITTEN answers that the kernel has not taken yet; the request after them
// closes it, and the answers still queued are dropped. No client in use sends ahead that far (browsers
// and curl do not pipeline, k6 sends one request at a time), and the few that pipeline are served.
const MAX_UNWRITTEN = 4
const UNWRITTEN = Symbol('answers the kernel has not taken')
type Connection = Socket & { [UNWRITTEN]?: number }

function boundPipelining(listener: RequestListener): RequestListener {
  return (incoming, outgoing) => {
    const socket = incoming.socket as Connection
    const ahead = socket[UNWRITTEN] ?? 0
    if (ahead >= MAX_UNWRITTEN || socket.destroyed) return void socket.destroy()
    socket[UNWRITTEN] = ahead + 1
    outgoing.on('finish', written) // its last byte is with the kernel
    // Answered once Node has parsed all it read (Node runs no microtask inside its parser): a
    // connection that pipelines past the bound is closed by then, and costs no query. A microtask,
    // not setImmediate, which costs an extra turn of the event loop: 4% more instructions a request.
    queueMicrotask(() => answerIfOpen(listener, incoming, outgoing))
  }
}

function answerIfOpen(listener: RequestListener, incoming: IncomingMessage, outgoing: ServerResponse) {
  if (!incoming.socket.destroyed) listener(incoming, outgoing)
}

function written(this: ServerResponse) {
  ;(this.req.socket as Connection)[UNWRITTEN]!--
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
  HPE_CHUNK_EXTENSIONS_OVERFLOW: rawErrorResponse(413, 'request body must be at most 16 KB'),
}

// WORKERS processes on one port, each with its own database connections; WAL and the lock retries
// keep their writes safe. A worker that dies is replaced; SIGTERM stops them all and exits 0.
async function runWorkers() {
  // Port 0 would give every worker a different port: choose one for all of them.
  const port = PORT || (await freePort())
  let stoppingWorkers = false
  for (let i = 0; i < WORKERS; i++) cluster.fork({ PORT: String(port) })
  cluster.on('exit', (worker, code, signal) => {
    if (stoppingWorkers) {
      if (Object.keys(cluster.workers ?? {}).length === 0) process.exit(0)
      return
    }
    console.error(`worker ${worker.process.pid} exited (${signal ?? code}); starting another`)
    cluster.fork({ PORT: String(port) })
  })
  const stop = () => {
    if (stoppingWorkers) return
    stoppingWorkers = true
    for (const worker of Object.values(cluster.workers ?? {})) worker?.process.kill('SIGTERM')
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

async function freePort(): Promise<number> {
  const probe = createNetServer().listen(0, HOST)
  await once(probe, 'listening')
  const { port } = probe.address() as AddressInfo
  probe.close()
  return port
}

if (import.meta.main) run()
