// The $12 server challenge's feed API: Hono on node:sqlite, where SQLite writes the JSON.
import { createAdaptorServer } from '@hono/node-server'
import { Hono, type Context, type Next } from 'hono'
import { bodyLimit } from 'hono/body-limit'
import { HTTPException } from 'hono/http-exception'
import { verify } from 'hono/jwt'
import type { ContentfulStatusCode } from 'hono/utils/http-status'
import cluster from 'node:cluster'
import { once } from 'node:events'
import { existsSync, mkdirSync } from 'node:fs'
import type { Server } from 'node:http'
import { createServer as createNetServer, type AddressInfo } from 'node:net'
import { dirname } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import schema from './schema.sql' with { type: 'text' }

const SQLITE_PATH = process.env.SQLITE_PATH || 'data/feed.db'
const JWT_SECRET = process.env.JWT_SECRET || 'twelve-dollar-challenge'
const HOST = process.env.HOST || '0.0.0.0'
const PORT = Number(process.env.PORT || 3000)
// More than one only where one process may not hold every connection (its open-file limit).
const WORKERS = Number(process.env.WORKERS || 1)
const MAX_BODY_BYTES = 16 * 1024
const MAX_BODY_CHARS = 500

// Open the database; a new file gets the empty schema so the server can start anywhere.
const isNewFile = !existsSync(SQLITE_PATH)
mkdirSync(dirname(SQLITE_PATH), { recursive: true })
export const db = new DatabaseSync(SQLITE_PATH, { timeout: 5_000 })
db.exec(`
  PRAGMA journal_mode = WAL;    -- readers never wait for the writer
  PRAGMA synchronous = NORMAL;  -- a commit survives a process crash without an fsync of its own
`)
if (isNewFile) {
  db.exec(schema)
  console.log(`created ${SQLITE_PATH} with empty tables; for the challenge data stop the server and run: npm run seed -- --force ${SQLITE_PATH}`)
}

// Every statement is prepared once. Reads return one column: the response body, built by SQLite.
const selectOne = db.prepare('SELECT 1')

const selectFeed = db.prepare(`
  SELECT json_object('posts', json_group_array(json_object(
           'id', p.id, 'body', p.body, 'created_at', p.created_at, 'author', u.username,
           'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
         ) ORDER BY p.created_at DESC, p.id DESC)) AS json
  FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p
  JOIN users AS u ON u.id = p.user_id`)

// No JOIN here: with a JOIN, SQLite's planner looks at the bound id, and every call then prepares the
// statement again (three times the cost, bench/statements.ts). Scalar subqueries do not.
const selectPost = db.prepare(`
  SELECT json_object('post', json_object(
           'id', p.id, 'body', p.body, 'created_at', p.created_at,
           'author', (SELECT username FROM users AS u WHERE u.id = p.user_id),
           'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
         )) AS json
  FROM posts AS p
  WHERE p.id = ?`)

const insertPost = db.prepare(`
  INSERT INTO posts (user_id, body) VALUES ($userId, $body)
  RETURNING json_object('post', json_object(
    'id', id, 'body', body, 'created_at', created_at, 'author', $author, 'like_count', 0
  )) AS json`)

// Inserts only when the post exists, and ignores a repeated like.
const insertLike = db.prepare(`
  INSERT OR IGNORE INTO likes (user_id, post_id) SELECT ?, id FROM posts WHERE id = ?`)

const selectPostExists = db.prepare('SELECT 1 FROM posts WHERE id = ?')

const begin = db.prepare('BEGIN IMMEDIATE')
const commit = db.prepare('COMMIT')
const rollback = db.prepare('ROLLBACK')

// The key is imported once; every request still verifies its token.
const jwtKey = await crypto.subtle.importKey(
  'raw', new TextEncoder().encode(JWT_SECRET), { name: 'HMAC', hash: 'SHA-256' }, false, ['verify'],
)
const utf8 = new TextDecoder('utf-8', { fatal: true })
const JSON_TYPE = { 'content-type': 'application/json' }
const DECIMAL = /^[1-9][0-9]*$/
const SQLITE_CONSTRAINT_FOREIGNKEY = 787
const startedAt = Date.now()

type User = { id: number; username: string }
type JsonRow = { json: string }

const httpError = (status: ContentfulStatusCode, message: string) => new HTTPException(status, { message })

export const app = new Hono()

app.get('/health', (c) => {
  try {
    selectOne.get()
  } catch (err) {
    return c.json({ status: 'degraded', db: 'unreachable', error: (err as Error).message }, 503)
  }
  return c.json({ status: 'ok', db: 'ok', uptime_s: Math.floor((Date.now() - startedAt) / 1000) })
})

app.get('/feed', (c) => {
  const { json } = selectFeed.get() as JsonRow
  return c.body(json, 200, JSON_TYPE)
})

app.get('/posts/:id', (c) => {
  const row = selectPost.get(parsePostId(c.req.param('id'))) as JsonRow | undefined
  if (!row) throw httpError(404, 'post not found')
  return c.body(row.json, 200, JSON_TYPE)
})

app.post(
  '/posts',
  limitBody,
  async (c) => {
    const user = await authenticate(c)
    const body = await readPostBody(c)
    const [{ json }] = (await rejectUnknownUser(inTransaction(() => insertPost.all({ userId: user.id, body, author: user.username })))) as JsonRow[]
    return c.body(json, 201, JSON_TYPE)
  },
)

app.post('/posts/:id/like', async (c) => {
  const user = await authenticate(c)
  const postId = parsePostId(c.req.param('id'))
  const { changes } = await rejectUnknownUser(inTransaction(() => insertLike.run(user.id, postId)))
  if (changes === 0 && !selectPostExists.get(postId)) throw httpError(404, 'post not found')
  return c.json({ liked: true, already_liked: changes === 0, post_id: postId }, changes ? 201 : 200)
})

// A known path with another method is a 405 that names the methods it takes.
app.notFound((c) => {
  const allowed = ['GET', 'POST'].filter((method) => app.router.match(method, c.req.path)[0].length > 0)
  if (allowed.length === 0) return errorResponse(c, 404, 'not found')
  c.header('allow', allowed.join(', '))
  return errorResponse(c, 405, 'method not allowed')
})

app.onError((err, c) => {
  if (err instanceof HTTPException) return errorResponse(c, err.status as ContentfulStatusCode, err.message)
  console.error(err)
  return errorResponse(c, 500, 'internal server error')
})

function errorResponse(c: Context, status: ContentfulStatusCode, message: string) {
  return c.json({ error: message }, status)
}

// A body over 16 KB is refused unread: by its Content-Length, or, when it comes chunked, by hono's
// bodyLimit counting as it reads. Only the chunked case pays for bodyLimit's web stream.
const limitChunkedBody = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: refuseBody })

function limitBody(c: Context, next: Next) {
  const length = c.req.header('content-length')
  if (length === undefined) return limitChunkedBody(c, next)
  if (Number(length) > MAX_BODY_BYTES) refuseBody(c)
  return next()
}

function refuseBody(c: Context): never {
  // The rest of the body is never read, so the connection cannot be reused.
  c.header('connection', 'close')
  throw httpError(413, 'request body must be at most 16 KB')
}

// A post id is a positive decimal integer. Past 2^53 it is well formed but names no post here.
function parsePostId(param: string): number {
  if (!DECIMAL.test(param)) throw httpError(400, 'invalid post id')
  const id = Number(param)
  if (!Number.isSafeInteger(id)) throw httpError(404, 'post not found')
  return id
}

async function authenticate(c: Context): Promise<User> {
  const header = c.req.header('authorization')
  if (!header?.startsWith('Bearer ')) throw httpError(401, 'missing bearer token')
  let claims
  try {
    claims = await verify(header.slice(7), jwtKey, 'HS256')
  } catch {
    throw httpError(401, 'invalid or expired token')
  }
  // hono/jwt checks exp only when the token has one; a token that never expires is refused.
  if (typeof claims.exp !== 'number') throw httpError(401, 'invalid or expired token')
  const { sub, username } = claims
  if (typeof sub !== 'string' || !DECIMAL.test(sub) || !Number.isSafeInteger(Number(sub)) || typeof username !== 'string') {
    throw httpError(401, 'invalid token payload')
  }
  return { id: Number(sub), username }
}

// Group commit: the writes that arrive in one event-loop turn share one transaction, and each
// request's promise settles only after that transaction has committed (a 201 means committed).
type PendingWrite = { write: () => unknown; resolve: (value: any) => void; reject: (error: unknown) => void }
let pendingWrites: PendingWrite[] = []

function inTransaction<T>(write: () => T): Promise<T> {
  return new Promise((resolve, reject) => {
    if (pendingWrites.push({ write, resolve, reject }) === 1) setImmediate(commitPendingWrites)
  })
}

function commitPendingWrites() {
  const batch = pendingWrites
  pendingWrites = []
  const outcomes: { ok: boolean; value: unknown }[] = []
  try {
    begin.run()
    // A statement that fails is undone on its own; the others still commit.
    for (const { write } of batch) {
      try {
        outcomes.push({ ok: true, value: write() })
      } catch (error) {
        outcomes.push({ ok: false, value: error })
      }
    }
    commit.run()
  } catch (error) {
    if (db.isTransaction) rollback.run()
    for (const { reject } of batch) reject(error)
    return
  }
  batch.forEach(({ resolve, reject }, i) => (outcomes[i].ok ? resolve : reject)(outcomes[i].value))
}

// A signed token whose user id has no row cannot write: the foreign key refuses it.
async function rejectUnknownUser<T>(write: Promise<T>): Promise<T> {
  try {
    return await write
  } catch (err) {
    if ((err as { errcode?: number }).errcode === SQLITE_CONSTRAINT_FOREIGNKEY) throw httpError(401, 'invalid token payload')
    throw err
  }
}

async function readPostBody(c: Context): Promise<string> {
  let input
  try {
    input = JSON.parse(utf8.decode(await c.req.arrayBuffer()))
  } catch {
    throw httpError(400, 'malformed JSON body')
  }
  const body = typeof input?.body === 'string' ? input.body.trim() : ''
  if (body === '') throw httpError(400, 'body is required')
  // The schema counts code points; 500 emoji are 1,000 UTF-16 units and still fit.
  if (body.length > MAX_BODY_CHARS && [...body].length > MAX_BODY_CHARS) {
    throw httpError(400, `body must be at most ${MAX_BODY_CHARS} characters`)
  }
  return body
}

// Serve until SIGTERM or SIGINT, then finish in-flight requests, close the database and exit 0.
export function run() {
  if (WORKERS > 1 && cluster.isPrimary) return runWorkers()
  const server = createAdaptorServer({
    fetch: app.fetch,
    serverOptions: {
      keepAliveTimeout: 65_000, // longer than any proxy's idle timeout, so it never reuses a closed socket
      headersTimeout: 10_000,
      requestTimeout: 30_000,
    },
  }) as Server
  // Workers each listen on a socket of their own, and the kernel spreads new connections over them.
  server.listen({ host: HOST, port: PORT, reusePort: WORKERS > 1, exclusive: true }, () => {
    const { address, port } = server.address() as AddressInfo
    console.log(`listening on http://${address}:${port}`)
  })
  const stop = () => {
    server.close(() => {
      db.close()
      process.exit(0)
    })
    setTimeout(() => server.closeAllConnections(), 10_000).unref()
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
}

// WORKERS processes on one port, each with its own database connection; WAL and the busy timeout keep
// their writes safe. A worker that dies is replaced; SIGTERM stops them all and exits 0 once they have.
async function runWorkers() {
  db.close()
  // Port 0 would give every worker a different port: choose one for all of them.
  const port = PORT || (await freePort())
  let stopping = false
  for (let i = 0; i < WORKERS; i++) cluster.fork({ PORT: String(port) })
  cluster.on('exit', (worker, code, signal) => {
    if (stopping) {
      if (Object.keys(cluster.workers ?? {}).length === 0) process.exit(0)
      return
    }
    console.error(`worker ${worker.process.pid} exited (${signal ?? code}); starting another`)
    cluster.fork({ PORT: String(port) })
  })
  const stop = () => {
    stopping = true
    for (const worker of Object.values(cluster.workers ?? {})) worker?.process.kill('SIGTERM')
  }
  process.once('SIGTERM', stop)
  process.once('SIGINT', stop)
}

async function freePort(): Promise<number> {
  const probe = createNetServer().listen(0, HOST)
  await once(probe, 'listening')
  const { port } = probe.address() as AddressInfo
  probe.close()
  return port
}

if (import.meta.main) run()
