// A follower (npm start with LITESTREAM_REPLICA_URL and PRIMARY_API_URL) serves reads from a plain local
// file that `litestream restore -f` keeps: it applies each LTX file the primary's Litestream uploads,
// about a second after the commit, under SQLite's own locks (a read sees a transaction whole or not at
// all). The file stays in rollback-journal mode and is only read here. Each write goes to the primary's
// API; its answer goes back once this copy holds the row it wrote, so a read after a write here sees it.
// The row, not a TXID: the primary's Litestream numbers a transaction only when it next syncs, after
// the answer has gone. The API knows none of this: it plugs into app.ts's hooks, and wraps its fetch.
import type { HttpBindings } from '@hono/node-server'
import { Hono, type Context } from 'hono'
import { existsSync, readFileSync } from 'node:fs'
import type { DatabaseSync, StatementSync } from 'node:sqlite'
import {
  answerError,
  ApiError,
  BUSY_TIMEOUT_MS,
  authenticate,
  database,
  hooks,
  jsonResponse,
  limitBody,
  SQLITE_PATH,
} from '../app.ts'
import type { Fetch } from './api-server.ts'
import { litestreamFiles } from './litestream.ts'

// A follower's primary: its API, where this node forwards every write.
export const PRIMARY_API_URL = process.env.PRIMARY_API_URL?.replace(/\/+$/, '')

const files = litestreamFiles(SQLITE_PATH)

// Statements of this file's own on the API's connection, prepared once for each connection.
const prepared = new WeakMap<DatabaseSync, Map<string, StatementSync>>()
function statement(db: DatabaseSync, sql: string): StatementSync {
  const statements = prepared.get(db) ?? prepared.set(db, new Map()).get(db)!
  return statements.get(sql) ?? statements.set(sql, db.prepare(sql)).get(sql)!
}

// A follower is a sync interval or two (1 s each by default) and a follow interval (100 ms) behind; past
// this it answers anyway.
const CATCH_UP_MS = 5_000
// Past the primary's own wait for the write lock, it is not coming back: the write's fate is unknown.
const FORWARD_TIMEOUT_MS = BUSY_TIMEOUT_MS + 5_000
// How often the waiting writes look at `<db>-txid`.
const POLL_MS = 10

// Makes this server a follower of the primary at PRIMARY_API_URL: the API reads the copy, and the
// writes go to the primary, past the same body limit as the primary's.
export function forwardWrites(fetch: Fetch): Fetch {
  if (!existsSync(SQLITE_PATH)) {
    console.error(
      `${SQLITE_PATH} is missing: a follower (PRIMARY_API_URL) serves the copy \`litestream restore -f\` keeps; start it with npm start and LITESTREAM_REPLICA_URL`,
    )
    process.exit(1)
  }
  hooks.readOnly = true
  const writes = new Hono<{ Bindings: Partial<HttpBindings> }>()
  writes.post('/posts', limitBody, forward)
  writes.post('/posts/:id/like', limitBody, forward)
  writes.notFound((c) => fetch(c.req.raw, c.env as HttpBindings)) // every other request: the API's
  writes.onError(answerError)
  return (request, env) => (request.method === 'POST' ? writes.fetch(request, env) : fetch(request, env))
}

// The token is checked here before anything is sent (the primary checks it again), and the request
// goes to the primary as it came.
async function forward(c: Context) {
  const user = authenticate(c.req.header('authorization'))
  const body = await c.req.arrayBuffer()
  const headers: Record<string, string> = { authorization: c.req.header('authorization')! }
  const type = c.req.header('content-type')
  if (type) headers['content-type'] = type
  let answer: Response
  try {
    answer = await fetch(PRIMARY_API_URL + c.req.path, {
      method: 'POST',
      headers,
      body: body.byteLength ? body : undefined,
      signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS),
    })
  } catch (error) {
    // Refused: nothing was written. Timed out: the primary may have committed it, or not.
    if ((error as Error).name === 'TimeoutError') throw new ApiError(504, 'primary did not answer in time')
    throw new ApiError(503, 'primary is unreachable')
  }
  const text = await answer.text()
  if (answer.status !== 200 && answer.status !== 201) return jsonResponse(answer.status, text)
  const likedPost = c.req.param('id')
  const here =
    likedPost === undefined
      ? () => rowHere('SELECT 1 FROM posts WHERE id = ?', (JSON.parse(text) as { post: { id: number } }).post.id)
      : () => rowHere('SELECT 1 FROM likes WHERE user_id = ? AND post_id = ?', user.id, Number(likedPost))
  if (await caughtUp(here, CATCH_UP_MS)) return jsonResponse(answer.status, text)
  // Committed on the primary but not here yet: still the primary's answer (an error would invite a
  // retry, and a second post), marked so the client knows a read here may not show it yet.
  console.warn(`follower: a write the primary took is not here after ${CATCH_UP_MS} ms; answered without it`)
  return jsonResponse(answer.status, text, { 'litestream-caught-up': 'false' })
}

// A read that fails here (Litestream holding the locks past the busy timeout) is a row not here yet.
function rowHere(sql: string, ...ids: number[]): boolean {
  try {
    return statement(database().connection, sql).get(...ids) !== undefined
  } catch {
    return false
  }
}

// The TXID Litestream last applied here; empty when it cannot be read.
function position(): string {
  try {
    return readFileSync(files.txid, 'latin1')
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
