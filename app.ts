// The $12 server challenge's feed API in one file: Hono on Node.js 26's node:sqlite, where SQLite writes
// each answer's JSON. With schema.sql and types.d.ts beside it, it runs as it is, served by
// @hono/node-server's serve() (the end of this file):
//
//   node --experimental-import-text app.ts     (Node 26.10.0 or later; the flag imports schema.sql)
//
// or a server of your own imports `app`, as this repository's server/ does.
/// <reference path="types.d.ts" />
import { serve, type HttpBindings } from '@hono/node-server'
import { Hono, type Context, type Next } from 'hono'
import { bodyLimit } from 'hono/body-limit'
import { cors } from 'hono/cors'
import { createHmac, createSecretKey, timingSafeEqual } from 'node:crypto'
import { accessSync, constants, existsSync, mkdirSync, statfsSync } from 'node:fs'
import { dirname } from 'node:path'
import { DatabaseSync, type StatementSync } from 'node:sqlite'
import schema from './schema.sql' with { type: 'text' }

export const SQLITE_PATH = process.env.SQLITE_PATH || 'data/feed.db'
const JWT_SECRET = process.env.JWT_SECRET || 'twelve-dollar-challenge'
export const HOST = process.env.HOST || '0.0.0.0'
export const PORT = Number(process.env.PORT || 3000)
// How long a write waits for another connection's write lock before it is refused with a 503.
export const BUSY_TIMEOUT_MS = Number(process.env.BUSY_TIMEOUT_MS || 5_000)
export const MAX_BODY_BYTES = 16 * 1024
const MAX_BODY_CHARS = 500
// Idle keep-alive connections stay open 65 s, as the contract asks: longer than any proxy's idle
// timeout, so that a proxy never reuses one just closed. Defined here, where the starter serves with it;
// server/ serves with the same.
export const KEEP_ALIVE_MS = 65_000
// Off unless set, and then not in a request's path at all: the origins a browser front end may call the
// API from (comma-separated), and a line on stdout for every request the API answers.
const CORS_ORIGIN = process.env.CORS_ORIGIN || ''
const ACCESS_LOG = process.env.ACCESS_LOG === '1'

// The statements, each prepared once on the connection (connect). A read answers with one column: the
// body SQLite wrote. Rows come as arrays, which node:sqlite makes for less than objects with the
// columns' names (BENCHMARKS.md, "Counted: rows as arrays").
//
// The feed as the contract writes it: the 20 newest posts, each with its author and like count, read by
// rowid range when their ids are contiguous, as new posts' are: half the B-tree descents of reading
// them through the index, which the other branch does, and the same bytes either way (BENCHMARKS.md,
// "The feed by rowid range").
const NEWEST_POSTS = 'SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20'
const FEED_JSON = `json_object('posts', json_group_array(json_object(
    'id', p.id, 'body', p.body, 'created_at', p.created_at, 'author', u.username,
    'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
  ) ORDER BY p.created_at DESC, p.id DESC))`
const FEED = `
  SELECT CASE WHEN span.last - span.first + 1 = span.n
    THEN (SELECT ${FEED_JSON} FROM posts AS p JOIN users AS u ON u.id = p.user_id WHERE p.id BETWEEN span.first AND span.last)
    ELSE (SELECT ${FEED_JSON} FROM (${NEWEST_POSTS}) AS p JOIN users AS u ON u.id = p.user_id)
  END AS json
  FROM (SELECT min(id) AS first, max(id) AS last, count(*) AS n
        FROM (SELECT id FROM posts ORDER BY created_at DESC, id DESC LIMIT 20)) AS span`
// No JOIN here: with one, SQLite's planner looks at the bound id and every call prepares the statement
// again (bench/statements.ts). Scalar subqueries do not.
const POST = `
  SELECT json_object('post', json_object(
           'id', p.id, 'body', p.body, 'created_at', p.created_at,
           'author', (SELECT username FROM users AS u WHERE u.id = p.user_id),
           'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
         )) AS json
  FROM posts AS p
  WHERE p.id = ?`
const POST_EXISTS = 'SELECT 1 FROM posts WHERE id = ?'
const INSERT_POST = `
  INSERT INTO posts (user_id, body) VALUES ($userId, $body)
  RETURNING json_object('post', json_object(
    'id', id, 'body', body, 'created_at', created_at, 'author', $author, 'like_count', 0
  )) AS json`
// Inserts only when the post exists, and ignores a repeated like.
const INSERT_LIKE = 'INSERT OR IGNORE INTO likes (user_id, post_id) SELECT ?, id FROM posts WHERE id = ?'
const PING = 'SELECT count(*) FROM sqlite_schema' // reads a page, where SELECT 1 would not
type JsonRow = { 0: string } // the one column, the JSON SQLite wrote

const startedAt = Date.now()

// Served by @hono/node-server, a request's env holds Node's own request and response (app.request() and
// server/wire.ts give none).
type Env = { Bindings: Partial<HttpBindings> }
export const app = new Hono<Env>()

if (ACCESS_LOG) app.use(accessLog)
if (CORS_ORIGIN) {
  const origin = CORS_ORIGIN.split(',').map((o) => o.trim())
  app.use(cors({ origin, allowMethods: ['GET', 'POST'], allowHeaders: ['Authorization', 'Content-Type'], maxAge: 600 }))
}

app.get('/health', async () => {
  const problem = await probeDatabase()
  if (problem) return jsonResponse(503, JSON.stringify({ status: 'degraded', db: 'unreachable', error: problem }))
  return jsonResponse(
    200,
    JSON.stringify({
      status: 'ok',
      db: 'ok',
      uptime_s: Math.floor((Date.now() - startedAt) / 1000),
      ...setup?.health?.(),
    }),
  )
})

app.get('/feed', () => jsonResponse(200, (database().feed.get() as JsonRow)[0]))

app.get('/posts/:id', (c) => {
  const row = database().post.get(parsePostId(c.req.param('id'))) as JsonRow | undefined
  if (!row) throw new ApiError(404, 'post not found')
  return jsonResponse(200, row[0])
})

app.post('/posts', limitBody, async (c) => {
  const user = authenticate(c.req.header('authorization'))
  const body = await readPostBody(c)
  const [row] = (await write((db) => db.insertPost.all({ userId: user.id, body, author: user.username }))) as JsonRow[]
  return jsonResponse(201, row[0])
})

app.post('/posts/:id/like', async (c) => {
  await limitBody(c, noBody)
  const user = authenticate(c.req.header('authorization'))
  const postId = parsePostId(c.req.param('id'))
  const { changes } = await write((db) => db.insertLike.run(user.id, postId))
  if (changes === 0 && !database().postExists.get(postId)) throw new ApiError(404, 'post not found')
  return jsonResponse(
    changes ? 201 : 200,
    JSON.stringify({ liked: true, already_liked: changes === 0, post_id: postId }),
  )
})

// A known path with another method is a 405 that names the methods it takes (a route, not the
// middleware every path has).
app.notFound((c) => {
  const routed = (method: string) =>
    app.router.match(method, c.req.path)[0].some(([[, route]]) => route.method !== 'ALL')
  const allowed = ['GET', 'POST'].filter(routed)
  if (allowed.length === 0) return errorResponse(404, 'not found')
  return errorResponse(405, 'method not allowed', { allow: allowed.join(', ') })
})

app.onError(answerError)

// Every response is JSON, never sniffed as anything else and never cached on the way. Frozen, so that a
// server can check these fields once rather than on every answer (server/responses.ts does).
export const JSON_HEADERS = Object.freeze({
  'content-type': 'application/json',
  'x-content-type-options': 'nosniff',
  'cache-control': 'no-store',
})

export function jsonResponse(status: number, body: string, headers?: Record<string, string>) {
  return new Response(body, { status, headers: headers ? { ...JSON_HEADERS, ...headers } : JSON_HEADERS })
}

// Every error is {"error": message}, made here, from whatever layer refuses the request.
export const errorBody = (message: string) => JSON.stringify({ error: message })
export const errorResponse = (status: number, message: string, headers?: Record<string, string>) =>
  jsonResponse(status, errorBody(message), headers)

export class ApiError extends Error {
  status: number
  headers?: Record<string, string>
  constructor(status: number, message: string, headers?: Record<string, string>) {
    super(message)
    this.status = status
    this.headers = headers
  }
}

// A refusal is the error it names; a database in trouble is a 503 that says how; anything unexpected
// is a 500 that says nothing more.
export function answerError(error: Error, c: Context<Env>) {
  if (error instanceof ApiError) return errorResponse(error.status, error.message, error.headers)
  const trouble = unavailable(error)
  if (trouble) return errorResponse(503, trouble)
  // The client closed its connection before the whole body came (Node's "aborted"): no server fault,
  // nobody is left to read the answer, and a log line for each would let any client flood the log.
  if (error === c.env?.incoming?.errored) return errorResponse(400, 'malformed request')
  console.error(error)
  return errorResponse(500, 'internal server error')
}

// A body over 16 KB is refused unread: by its Content-Length, or, when it comes chunked, by hono's
// bodyLimit counting as it reads. Only the chunked case pays for bodyLimit's web stream. Over HTTP/1 a
// request with neither header has no body (RFC 9112, 6.3), as a like from `curl -X POST`. (A server
// that reads the body first, as server/wire.ts does, gives it with its Content-Length.)
const limitChunkedBody = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: refuseBody })

export function limitBody<Path extends string>(c: Context<Env, Path>, next: Next) {
  const length = c.req.header('content-length')
  if (length !== undefined) return Number(length) > MAX_BODY_BYTES ? refuseBody() : next()
  if (c.env?.incoming?.httpVersionMajor === 1 && c.req.header('transfer-encoding') === undefined) return next()
  return limitChunkedBody(c, next)
}

// A like reads no body, and takes none over 16 KB either: limitBody called at the start of its handler,
// not set as route middleware, with which Hono composes the route's handlers on every request (a like's
// 4,800 instructions: BENCHMARKS.md, "The write path, counted").
const noBody = async () => {}

export const BODY_TOO_LARGE = 'request body must be at most 16 KB'

// The rest of the body is never read, so the connection cannot be reused.
function refuseBody(): never {
  throw new ApiError(413, BODY_TOO_LARGE, { connection: 'close' })
}

// ACCESS_LOG=1: the method, the path as it came (never decoded, so never a line break; never the query,
// never a header), the status and the milliseconds.
async function accessLog(c: Context<Env>, next: Next) {
  const started = performance.now()
  await next()
  const { url } = c.req
  const start = url.indexOf('/', url.indexOf('//') + 2)
  const query = url.indexOf('?', start)
  const path = url.slice(start, query < 0 ? undefined : query)
  console.log(`${c.req.method} ${path} ${c.res.status} ${(performance.now() - started).toFixed(1)}ms`)
}

// A post id is a positive decimal integer. Past 2^53 it is well formed but names no post here.
const DECIMAL = /^[1-9][0-9]*$/

function parsePostId(param: string): number {
  if (!DECIMAL.test(param)) throw new ApiError(400, 'invalid post id')
  const id = Number(param)
  if (!Number.isSafeInteger(id)) throw new ApiError(404, 'post not found')
  return id
}

// The user a request's `Authorization: Bearer <jwt>` names.
export type User = { id: number; username: string }

export function authenticate(authorization: string | undefined): User {
  if (!authorization?.startsWith('Bearer ')) throw new ApiError(401, 'missing bearer token')
  const claims = verifiedClaims(authorization.slice(7))
  if (!claims) throw new ApiError(401, 'invalid or expired token')
  const { sub, username } = claims
  if (
    typeof sub !== 'string' ||
    !DECIMAL.test(sub) ||
    !Number.isSafeInteger(Number(sub)) ||
    typeof username !== 'string'
  ) {
    throw new ApiError(401, 'invalid token payload')
  }
  return { id: Number(sub), username }
}

// HS256 checked on the event loop with node:crypto: WebCrypto's verify is a round trip to the
// threadpool that costs a lone request more than the HMAC itself (BENCHMARKS.md, "Tokens"). The checks
// are hono/jwt's: the signature, a header of HS256 (and JWT, if it names a type) with nothing critical,
// nbf and iat passed where the token has them; and an exp still to come, which hono/jwt does not require.
const jwtKey = createSecretKey(Buffer.from(JWT_SECRET))
// Three base64url parts. The signature (32 bytes) only as base64url writes it, unpadded and its last
// character's unused bits zero, as hono/jwt checks: no second spelling of a signature passes.
const JWT = /^([\w-]+={0,2})\.([\w-]+={0,2})\.([\w-]{43})$/

function verifiedClaims(token: string): Record<string, unknown> | undefined {
  const parts = JWT.exec(token)
  if (!parts) return undefined
  const expected = createHmac('sha256', jwtKey).update(`${parts[1]}.${parts[2]}`).digest('base64url')
  if (!timingSafeEqual(Buffer.from(parts[3], 'latin1'), Buffer.from(expected, 'latin1'))) return undefined
  let header, claims
  try {
    header = JSON.parse(Buffer.from(parts[1], 'base64url').toString())
    claims = JSON.parse(Buffer.from(parts[2], 'base64url').toString())
  } catch {
    return undefined
  }
  if (typeof header !== 'object' || header === null || header.alg !== 'HS256' || 'crit' in header) return undefined
  if (
    'typ' in header &&
    !(typeof header.typ === 'string' && header.typ.toLowerCase().replace(/^application\//, '') === 'jwt')
  )
    return undefined
  if (typeof claims !== 'object' || claims === null) return undefined
  const now = Math.floor(Date.now() / 1000)
  const passed = (time: unknown) =>
    time === undefined || (typeof time === 'number' && Number.isFinite(time) && time <= now)
  if (!passed(claims.nbf) || !passed(claims.iat)) return undefined
  if (typeof claims.exp !== 'number' || !Number.isFinite(claims.exp) || claims.exp <= now) return undefined
  return claims
}

// A token the checks above take: HS256, the user's id as `sub` and its name, good for `seconds`. For a
// database of your own, which has no tokens yet (token.ts); the challenge's seed writes its users'.
export function signToken(user: User, seconds: number): string {
  const now = Math.floor(Date.now() / 1000)
  const part = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const claims = { sub: String(user.id), username: user.username, iat: now, exp: now + seconds }
  const unsigned = `${part({ alg: 'HS256', typ: 'JWT' })}.${part(claims)}`
  return `${unsigned}.${createHmac('sha256', jwtKey).update(unsigned).digest('base64url')}`
}

const utf8 = new TextDecoder('utf-8', { fatal: true })

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

// A signed token whose user id has no row cannot write: the foreign key refuses it.
async function write<T>(statement: (db: Database) => T): Promise<T> {
  try {
    return await inTransaction(statement)
  } catch (error) {
    if ((error as { errcode?: number }).errcode === SQLITE_CONSTRAINT_FOREIGNKEY)
      throw new ApiError(401, 'invalid token payload')
    throw error
  }
}

// Group commit: the writes that arrive in one event-loop turn share one transaction, and each
// request's promise settles only after that transaction has committed (a 201 means committed).
type PendingWrite = {
  statement?: (db: Database) => unknown
  resolve: (value: any) => void
  reject: (error: unknown) => void
}
let pendingWrites: PendingWrite[] = []

function inTransaction<T>(statement?: (db: Database) => T): Promise<T> {
  return new Promise((resolve, reject) => {
    if (pendingWrites.push({ statement, resolve, reject }) === 1) setImmediate(commitPendingWrites)
  })
}

function commitPendingWrites() {
  const batch = pendingWrites
  pendingWrites = []
  commitBatch(batch, Date.now() + BUSY_TIMEOUT_MS, 1)
}

function commitBatch(batch: PendingWrite[], deadline: number, retryMs: number) {
  let outcomes: Outcome[]
  try {
    outcomes = batch.length === 1 && batch[0].statement && !setup?.beforeCommit ? commitAlone(batch[0]) : commit(batch)
  } catch (error) {
    // Another connection holds the write lock: try again soon, serving other requests meanwhile.
    const wait = Math.min(retryMs, deadline - Date.now())
    if (unavailable(error) !== 'database is busy' || wait <= 0) return failBatch(batch, error)
    return void setTimeout(commitBatch, wait, batch, deadline, Math.min(2 * retryMs, 50))
  }
  batch.forEach(({ resolve, reject }, i) => (outcomes[i].ok ? resolve : reject)(outcomes[i].value))
}

// BEGIN IMMEDIATE takes the write lock, or throws at once while another connection holds it.
function commit(batch: PendingWrite[]): Outcome[] {
  const db = database()
  db.begin.run()
  try {
    const outcomes = batch.map(({ statement }) => attempt(db, statement))
    expectFile()
    if (setup?.beforeCommit && batch.some(({ statement }) => statement)) setup.beforeCommit(db.connection)
    db.commit.run()
    return outcomes
  } catch (error) {
    if (db.connection.isTransaction) db.rollback.run()
    throw error
  }
}

// A write alone in its turn is a transaction of its own (autocommit), which takes the lock as
// BEGIN IMMEDIATE does: no BEGIN and COMMIT to run, and no journal to undo it apart from others
// (BENCHMARKS.md, "The write path, counted"). The empty write of /health takes the lock above.
function commitAlone({ statement }: PendingWrite): Outcome[] {
  const db = database()
  expectFile()
  return [attempt(db, statement)]
}

// A file unlinked while open would take the writes with it when the process ends.
function expectFile() {
  if (!existsSync(SQLITE_PATH)) throw new ApiError(503, 'database file is missing')
}

// One request's statement in the batch's transaction: a constraint undoes only that statement; any
// other failure ends the whole transaction.
type Outcome = { ok: boolean; value: unknown }
function attempt(db: Database, statement: PendingWrite['statement']): Outcome {
  try {
    return { ok: true, value: statement?.(db) }
  } catch (error) {
    if (unavailable(error)) throw error
    return { ok: false, value: error }
  }
}

function failBatch(batch: PendingWrite[], error: unknown) {
  forgetConnectionAfter(error)
  for (const { reject } of batch) reject(error)
}

// A connection that cannot open its files is closed: the next request opens another.
function forgetConnectionAfter(error: unknown) {
  if ((error as { errcode?: number } | undefined)?.errcode === SQLITE_CANTOPEN) closeDatabase()
}

// SQLite's result codes that the API tells apart (sqlite.org/rescode.html).
const SQLITE_BUSY = 5
const SQLITE_LOCKED = 6
const SQLITE_READONLY = 8
const SQLITE_IOERR = 10
const SQLITE_FULL = 13
const SQLITE_CANTOPEN = 14
const SQLITE_PROTOCOL = 15 // the WAL index's locks cannot be had: its file system is gone
const SQLITE_CONSTRAINT_FOREIGNKEY = 787
const SQLITE_READONLY_DBMOVED = 1032 // the file was moved or deleted since it was opened

// The codes (an extended code's low byte) that mean the database, not the request, is in trouble: a
// 503 that says how.
const TROUBLE = new Map([
  [SQLITE_BUSY, 'database is busy'],
  [SQLITE_LOCKED, 'database is busy'],
  [SQLITE_READONLY, 'database is read-only'],
  [SQLITE_IOERR, 'database disk I/O error'],
  [SQLITE_FULL, 'database or disk is full'],
  [SQLITE_CANTOPEN, 'database file cannot be opened'],
  [SQLITE_PROTOCOL, 'database is unavailable'],
])

// The 503 message for an error that means the database cannot serve now; undefined for any other.
function unavailable(error: unknown): string | undefined {
  if (error instanceof ApiError) return error.status === 503 ? error.message : undefined
  const code = (error as { errcode?: number } | undefined)?.errcode
  if (code === SQLITE_READONLY_DBMOVED) return 'database file is missing'
  return code === undefined ? undefined : TROUBLE.get(code & 0xff)
}

// /health's question, asked on every call: what stands between the database and a read or a write now?
async function probeDatabase(): Promise<string | undefined> {
  try {
    database().ping.get()
    if (!existsSync(SQLITE_PATH)) return 'database file is missing'
    if (setup?.readOnly) return undefined // nothing is written here
    // SQLite lets a read-only connection take the write lock; only the first write would fail.
    if (!isWritable(SQLITE_PATH)) return 'database is read-only'
    const { bavail, bsize } = statfsSync(dirname(SQLITE_PATH))
    if (bavail * bsize < 1024 * 1024) return 'disk is full'
    // An empty write joins the next group commit: it waits for a lock another connection holds as long
    // as a write would, and fails only where a write would fail.
    await inTransaction()
    return undefined
  } catch (error) {
    forgetConnectionAfter(error)
    const trouble = unavailable(error)
    if (trouble) return trouble
    console.error(error)
    return 'database error'
  }
}

// What a server around the API adds to it, given once by configure() before the API serves; the API
// alone (this file run as a script, or app.request() in a test) needs none of it.
export type ServerSetup = {
  readOnly?: boolean // only read the file: open it read-only, never create it or set its journal mode
  afterOpen?: (db: DatabaseSync) => void // runs on each new connection, before its statements are prepared
  whileReadOnly?: () => void // runs before each use of a read-only connection; may closeDatabase()
  beforeCommit?: (db: DatabaseSync) => void // runs in every transaction that writes, before COMMIT
  health?: () => object // more for a healthy /health to say
}
let setup: Readonly<ServerSetup> | undefined // fixed by configure(), or as none by the first connection

// Refused once given, and once a connection has opened: one opened without it (read-write where the
// server only reads, say) would serve on.
export function configure(given: ServerSetup) {
  if (setup) throw new Error('configure() is called once, before the API opens its database')
  setup = Object.freeze({ ...given })
}

// One connection takes the reads and the writes: a second one for the reads would lose its page cache
// at every commit of the first (BENCHMARKS.md, "One connection").
function connect() {
  if (!existsSync(SQLITE_PATH)) throw new ApiError(503, 'database file is missing') // opening would create it
  // A connection that writes never sleeps in SQLite's busy handler, which would stop the whole event
  // loop: it opens without waiting (a start that must wait does so around openDatabase()), its BEGIN
  // IMMEDIATE throws at once while another connection holds the write lock (commitBatch retries on a
  // timer), and in WAL mode its reads wait for no other connection (only a recovery after a crash would
  // hold them up: a 503 at once). A read-only one, a follower's, waits up to BUSY_TIMEOUT_MS for its
  // locks, which Litestream takes as it applies the primary's changes.
  const { readOnly = false, afterOpen } = (setup ??= {})
  const db = new DatabaseSync(SQLITE_PATH, { timeout: 0, readOnly })
  try {
    // WAL, so that readers never wait for the writer. It is stored in the file and setting it is a
    // write: set only where it is not, and never where the API only reads.
    if (!readOnly && (db.prepare('PRAGMA journal_mode').get() as { journal_mode: string }).journal_mode !== 'wal')
      db.exec('PRAGMA journal_mode = WAL')
    db.exec('PRAGMA synchronous = NORMAL') // a commit survives a process crash without an fsync of its own
    afterOpen?.(db)
    const database = {
      connection: db,
      // SQLite opens a file it may not write read-only, and such a connection stays so.
      readOnly: readOnly || !isWritable(SQLITE_PATH),
      feed: rowsAsArrays(db.prepare(FEED)),
      post: rowsAsArrays(db.prepare(POST)),
      postExists: rowsAsArrays(db.prepare(POST_EXISTS)),
      insertPost: rowsAsArrays(db.prepare(INSERT_POST)),
      insertLike: db.prepare(INSERT_LIKE),
      ping: db.prepare(PING),
      begin: db.prepare('BEGIN IMMEDIATE'),
      commit: db.prepare('COMMIT'),
      rollback: db.prepare('ROLLBACK'),
    }
    if (readOnly) db.exec(`PRAGMA busy_timeout = ${BUSY_TIMEOUT_MS}`)
    return database
  } catch (error) {
    db.close()
    throw error
  }
}

type Database = ReturnType<typeof connect>

function rowsAsArrays(statement: StatementSync): StatementSync {
  statement.setReturnArrays(true)
  return statement
}

// The open connection: opened at the start (openDatabase), or else by the first request. After a fault
// that only a new connection gets past it is closed, and the next request opens another.
let opened: Database | undefined

export function database(): Database {
  if (opened?.readOnly) setup?.whileReadOnly?.()
  return (opened ??= connect())
}

export function closeDatabase() {
  opened?.connection.close()
  opened = undefined
}

function isWritable(path: string) {
  try {
    accessSync(path, constants.W_OK)
    return true
  } catch {
    return false
  }
}

// At the start: a missing file gets the empty schema, so the server can start anywhere; then the
// connection opens. False when another connection holds the database's locks: then the first request
// that finds them free opens it, and until then /health and every request say the database is busy.
export function openDatabase(): boolean {
  if (!existsSync(SQLITE_PATH) && !setup?.readOnly) {
    mkdirSync(dirname(SQLITE_PATH), { recursive: true })
    const db = new DatabaseSync(SQLITE_PATH)
    db.exec(schema)
    db.close()
    console.error(
      `created ${SQLITE_PATH} with empty tables; a user and a token to post with: node --experimental-import-text token.ts <username>`,
    )
  }
  try {
    database()
    return true
  } catch (error) {
    if (unavailable(error) === 'database is busy') return false
    throw error
  }
}

// Run as a script, the API serves itself, idle connections kept KEEP_ALIVE_MS. On SIGTERM or SIGINT it
// finishes the requests in flight, closes the database and exits 0.
if (import.meta.main) {
  openDatabase()
  const options = { fetch: app.fetch, hostname: HOST, port: PORT, serverOptions: { keepAliveTimeout: KEEP_ALIVE_MS } }
  const server = serve(options, ({ address, port }) => console.log(`listening on http://${address}:${port}`))
  const stop = () =>
    server.close(() => {
      closeDatabase()
      process.exit(0)
    })
  process.once('SIGTERM', stop).once('SIGINT', stop)
}
