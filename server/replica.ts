// Litestream, seen from the server. On a primary under `litestream replicate` (start.ts), every commit
// writes page 1 for the followers, /health and the log say how far behind the replica is, and with
// LITESTREAM_SYNC=wait a write is answered once the replica holds it. On a follower, the server reads
// the copy `litestream restore -f` keeps and forwards every write to the primary. The API knows none of
// this: each part plugs into app.ts's hooks, or wraps its fetch.
import type { HttpBindings } from '@hono/node-server'
import { Hono, type Context } from 'hono'
import { existsSync, readFileSync } from 'node:fs'
import { request } from 'node:http'
import type { DatabaseSync, StatementSync } from 'node:sqlite'
import { answerError, ApiError, BUSY_TIMEOUT_MS, authenticate, database, errorResponse, hooks, jsonResponse, limitBody, SQLITE_PATH } from '../app.ts'
import { litestreamFiles, litestreamSocket } from './litestream.ts'
import type { Fetch } from './api-server.ts'

// `wait`: a write is acknowledged only once the replica holds it.
const SYNC_WAIT = process.env.LITESTREAM_SYNC === 'wait'
// How long a write waits for the replica (LITESTREAM_SYNC=wait) before it is answered with a 503.
const REPLICA_WAIT_MS = Number(process.env.REPLICA_WAIT_MS || 5_000)
// How long the replica may go without taking what is new before /health says `behind` and the log says
// so (Litestream sends every second or two).
const REPLICA_LAG_MS = Number(process.env.REPLICA_LAG_MS || 10_000)
// A follower's primary: its API, where this node forwards every write.
export const PRIMARY_API_URL = process.env.PRIMARY_API_URL?.replace(/\/+$/, '')

const files = litestreamFiles(SQLITE_PATH)

// Statements of this file's own on the API's connection, prepared once for each connection.
const prepared = new WeakMap<DatabaseSync, Map<string, StatementSync>>()
function statement(db: DatabaseSync, sql: string): StatementSync {
  const statements = prepared.get(db) ?? prepared.set(db, new Map()).get(db)!
  return statements.get(sql) ?? statements.set(sql, db.prepare(sql)).get(sql)!
}

// --- A primary under `litestream replicate` -------------------------------------------------------

// Plugs the replica into the API, and has Litestream take the database before the first request.
// `speaks`: this process says in the log how the replica is doing (one process of the service does).
export async function replicate(fetch: Fetch, speaks: boolean): Promise<Fetch> {
  if (!litestreamSocket) {
    if (SYNC_WAIT && speaks) console.warn('LITESTREAM_SYNC=wait without Litestream (start with LITESTREAM_REPLICA_URL and npm start): writes are acknowledged on commit here')
    return fetch
  }
  logs = speaks
  hooks.beforeCommit = touchHeader
  await startFollowingReplica()
  return SYNC_WAIT ? answeringOnceReplicated(fetch) : fetch
}

// Every commit writes page 1 (the header's user_version, to the value it has), so each LTX file carries
// it, and a follower's Litestream, applying it, changes the header's counter by which the follower's
// readers know that their cached pages are stale (README, "Past one box").
const touches = new WeakMap<DatabaseSync, StatementSync>()
function touchHeader(db: DatabaseSync) {
  let touch = touches.get(db)
  if (!touch) {
    const { user_version } = db.prepare('PRAGMA user_version').get() as { user_version: number }
    touches.set(db, (touch = db.prepare(`PRAGMA user_version = ${user_version}`)))
  }
  touch.run()
}

// Litestream's control socket is an HTTP server on a Unix socket. `GET /list` gives, for each database,
// when the replica last took everything Litestream had: it tries every second or two, and an idle
// database with a reachable replica counts as a success. Asking changes nothing in Litestream.
let logs = false
let replicaSyncedAt = Date.now() // Litestream's last success, or this process's start
let litestreamDown: string | undefined // why Litestream did not answer
let uploadFailed: string | undefined // why the last upload this server asked for failed
let worstBehindMs = 0 // since the replica was last ok, for the log

// One request to Litestream's control socket, answered with JSON in time, or an error that says why.
function askLitestream<T>(method: 'GET' | 'POST', path: string, timeoutMs: number, body?: object): Promise<T> {
  return new Promise((resolve, reject) => {
    const ask = request({ socketPath: litestreamSocket, method, path, timeout: timeoutMs, headers: { 'content-type': 'application/json' } }, (res) => {
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
const sendToReplica = (timeoutMs: number) => askLitestream('POST', '/sync', timeoutMs, { path: files.db, wait: true, timeout: Math.ceil(timeoutMs / 1000) })

// What /health adds under Litestream. A replica behind does not make /health a 503: the node serves
// every request right, and a load balancer would pull the only primary.
export const replicaHealth = () => (litestreamSocket ? { replica: replicaState() } : {})

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
    await askLitestream('POST', '/sync', 5_000, { path: files.db })
  } catch (error) {
    console.warn(`replica: Litestream did not take the database at start (${(error as Error).message})`)
  }
  followReplica()
}

// Once a second: how long ago the replica took everything, for /health (`behind_ms`) and the log, which
// says when that passes REPLICA_LAG_MS and when the replica has caught up.
async function followReplica() {
  try {
    type List = { databases: { path: string; last_sync_at?: string }[] }
    const { databases } = await askLitestream<List>('GET', '/list', 2_000)
    const syncedAt = Date.parse(databases.find((db) => db.path === files.db)?.last_sync_at ?? '')
    if (syncedAt > replicaSyncedAt) replicaSyncedAt = syncedAt
    litestreamDown = undefined
  } catch (error) {
    litestreamDown = `Litestream does not answer: ${(error as Error).message}`
  }
  const { state, behind_ms, error } = replicaState()
  if (logs && state !== 'ok' && worstBehindMs === 0) {
    console.warn(`replica: ${state === 'unreachable' ? 'unreachable' : `${(behind_ms / 1000).toFixed(0)} s behind`}${error ? ` (${error})` : ''}; the writes since may be on this box only`)
  } else if (logs && state === 'ok' && worstBehindMs > 0) {
    console.log(`replica: caught up, after ${(worstBehindMs / 1000).toFixed(1)} s behind at most`)
  }
  worstBehindMs = state === 'ok' ? 0 : Math.max(worstBehindMs, behind_ms, 1)
  if (behind_ms <= 3_000) uploadFailed = undefined
  else if (logs && !litestreamDown && !sending) sendWhatTheReplicaLacks()
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

// LITESTREAM_SYNC=wait: a write's answer waits until the replica holds its transaction. One sync with
// `wait` is in flight at a time, for every write committed before it was asked for (Litestream reads
// the WAL once asked, and answers once the replica holds all it read); the writes committed meanwhile
// wait for the next, so the syncs come from batches, not from writes. A write the replica has not
// confirmed within REPLICA_WAIT_MS is a 503: it stays committed here, and Litestream sends it once the
// replica is back.
function answeringOnceReplicated(fetch: Fetch): Fetch {
  const replicated = async (answer: Response | Promise<Response>) => {
    const response = await answer
    if (response.status !== 200 && response.status !== 201) return response
    try {
      await replicaHolds()
      return response
    } catch (error) {
      return errorResponse(503, (error as ApiError).message)
    }
  }
  return (request, env) => (request.method === 'POST' ? replicated(fetch(request, env)) : fetch(request, env))
}

let awaitingReplica: { resolve: () => void; reject: (error: unknown) => void }[] = []
let syncing = false
let syncFailing = false // since the last sync that failed, for the log

function replicaHolds(): Promise<void> {
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
    if (syncFailing && logs) console.log('replica: writes are confirmed by the replica again')
    syncFailing = false
    for (const { resolve } of round) resolve()
  } catch (error) {
    if (!syncFailing && logs) console.warn(`replica: a write was not confirmed (Litestream: ${(error as Error).message}); writes answer 503 until the replica confirms them again`)
    syncFailing = true
    const refusal = new ApiError(503, 'the replica did not confirm the write; it is committed here, and reaches the replica once the replica is back')
    for (const { reject } of round) reject(refusal)
  }
  syncing = false
  if (awaitingReplica.length) syncReplica()
}

// --- A follower -----------------------------------------------------------------------------------
// A follower (npm start with LITESTREAM_REPLICA_URL and PRIMARY_API_URL) serves reads from a plain local
// file that `litestream restore -f` keeps: it applies each LTX file the primary's Litestream uploads,
// about a second after the commit, under SQLite's own locks (a read sees a transaction whole or not at
// all). The file stays in rollback-journal mode and is only read here. Each write goes to the primary's
// API; its answer goes back once this copy holds the row it wrote, so a read after a write here sees it.
// The row, not a TXID: the primary's Litestream numbers a transaction only when it next syncs, after
// the answer has gone.

// A follower is a sync interval or two (1 s each by default) and a follow interval (100 ms) behind; past
// this it answers anyway.
const FOLLOW_CATCH_UP_MS = 5_000
// Past the primary's own wait for the write lock, it is not coming back: the write's fate is unknown.
const FORWARD_TIMEOUT_MS = BUSY_TIMEOUT_MS + 5_000
// How often the waiting writes look at `<db>-txid`.
const POLL_MS = 10

// Makes this server a follower of the primary at PRIMARY_API_URL: the API reads the copy, and the
// writes go to the primary, past the same body limit as the primary's.
export function follow(fetch: Fetch): Fetch {
  if (!existsSync(SQLITE_PATH)) {
    console.error(`${SQLITE_PATH} is missing: a follower (PRIMARY_API_URL) serves the copy \`litestream restore -f\` keeps; start it with npm start and LITESTREAM_REPLICA_URL`)
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
    ? () => rowHere('SELECT 1 FROM posts WHERE id = ?', (JSON.parse(text) as { post: { id: number } }).post.id)
    : () => rowHere('SELECT 1 FROM likes WHERE user_id = ? AND post_id = ?', user.id, Number(likedPost))
  if (await caughtUp(here, FOLLOW_CATCH_UP_MS)) return jsonResponse(answer.status, text)
  // Committed on the primary but not here yet: still the primary's answer (an error would invite a
  // retry, and a second post), marked so the client knows a read here may not show it yet.
  console.warn(`follower: a write the primary took is not here after ${FOLLOW_CATCH_UP_MS} ms; answered without it`)
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
