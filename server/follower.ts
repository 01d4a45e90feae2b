// A follower (npm start with LITESTREAM_REPLICA_URL and PRIMARY_API_URL) serves reads from a plain local
// file that `litestream restore -f` keeps: it applies each LTX file the primary's Litestream uploads,
// about a second after the commit, under SQLite's own locks (a read sees a transaction whole or not at
// all). The file stays in rollback-journal mode and is only read here. Each write goes to the primary's
// API; its answer goes back once this copy holds the row it wrote, so a read after a write here sees it.
// The row, not a TXID: the primary's Litestream numbers a transaction only when it next syncs, after
// the answer has gone. The API knows none of this: it reads the file read-only (server/database.ts), and
// this wraps its fetch.
import type { HttpBindings } from '@hono/node-server'
import { Hono, type Context } from 'hono'
import { existsSync, watch, type FSWatcher } from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import { basename, dirname } from 'node:path'
import type { DatabaseSync, StatementSync } from 'node:sqlite'
import {
  answerError,
  ApiError,
  BUSY_TIMEOUT_MS,
  authenticate,
  database,
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
export const CATCH_UP_MS = 5_000
// Past the primary's own wait for the write lock, it is not coming back: the write's fate is unknown.
const FORWARD_TIMEOUT_MS = BUSY_TIMEOUT_MS + 5_000

// Makes this server a follower of the primary at PRIMARY_API_URL: the writes go to the primary, past
// the same body limit as the primary's, and the API reads the copy (opened read-only: databaseSetup).
export function forwardWrites(fetch: Fetch): Fetch {
  if (!existsSync(SQLITE_PATH)) {
    console.error(
      `${SQLITE_PATH} is missing: a follower (PRIMARY_API_URL) serves the copy \`litestream restore -f\` keeps; start it with npm start and LITESTREAM_REPLICA_URL`,
    )
    process.exit(1)
  }
  const writes = new Hono<{ Bindings: Partial<HttpBindings> }>()
  writes.post('/posts', limitBody, forward)
  writes.post('/posts/:id/like', limitBody, forward)
  writes.notFound((c) => fetch(c.req.raw, c.env as HttpBindings)) // every other request: the API's
  writes.onError(answerError)
  return (request, env) => {
    if (request.method === 'POST') return writes.fetch(request, env)
    readInThisTurn()
    return fetch(request, env)
  }
}

// The reads of one turn of the event loop share one read transaction, ended once the turn's reads are
// done: each transaction on the follower's rollback-journal file takes and drops SQLite's locks (four
// `fcntl`s, two `stat`s, a `pread`), and a busy follower reads for many requests in a turn. Each still
// reads the file as it was after its request came: the transaction starts at the turn's first read.
let turnRead: DatabaseSync | undefined // the connection whose read transaction this turn shares
function readInThisTurn(): DatabaseSync | undefined {
  if (turnRead) return turnRead
  try {
    const db = database().connection
    statement(db, 'BEGIN').run()
    turnRead = db
  } catch {
    return undefined // each read alone, as the API does; it answers for what fails
  }
  setImmediate(endTurnRead)
  return turnRead
}

// ROLLBACK ends a read transaction as COMMIT would, and cannot be refused; a connection closed meanwhile
// has none, and a transaction ended early (lookAll) leaves nothing to end.
function endTurnRead() {
  const db = turnRead
  turnRead = undefined
  if (db?.isOpen && db.isTransaction) statement(db, 'ROLLBACK').run()
}

// The token is checked here before anything is sent (the primary checks it again), and the request
// goes to the primary as it came.
async function forward(c: Context) {
  const user = authenticate(c.req.header('authorization'))
  const body = await c.req.arrayBuffer()
  const headers: Record<string, string> = { authorization: c.req.header('authorization')! }
  const type = c.req.header('content-type')
  if (type) headers['content-type'] = type
  let answer: Answer
  try {
    answer = await postToPrimary(c.req.path, headers, body.byteLength ? new Uint8Array(body) : undefined)
  } catch (error) {
    // Refused: nothing was written. Timed out: the primary may have committed it, or not.
    if (error === TIMED_OUT) throw new ApiError(504, 'primary did not answer in time')
    throw new ApiError(503, 'primary is unreachable')
  }
  const text = answer.text
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

// The primary's answer to a write, over connections kept open to it: node:http's client with an Agent,
// where fetch() cost 4 to 5 x its CPU (BENCHMARKS.md, "A follower's writes over node:http").
type Answer = { status: number; text: string }
const client = PRIMARY_API_URL?.startsWith('https:') ? https : http
const toPrimary = new client.Agent({ keepAlive: true })
const TIMED_OUT = new Error('the primary did not answer within FORWARD_TIMEOUT_MS')

function postToPrimary(path: string, headers: Record<string, string>, body: Uint8Array | undefined): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const length = String(body?.byteLength ?? 0)
    const options = { method: 'POST', agent: toPrimary, headers: { ...headers, 'content-length': length } }
    const sent = client.request(PRIMARY_API_URL + path, options, (res) => {
      let text = ''
      res.setEncoding('utf8')
      res.on('data', (chunk: string) => (text += chunk))
      res.on('end', () => resolve({ status: res.statusCode!, text }))
      res.on('error', reject)
    })
    const timer = setTimeout(() => sent.destroy(TIMED_OUT), FORWARD_TIMEOUT_MS)
    sent.on('error', reject).on('close', () => clearTimeout(timer))
    sent.end(body)
  })
}

// A read that fails here (Litestream holding the locks past the busy timeout) is a row not here yet.
function rowHere(sql: string, ...ids: number[]): boolean {
  try {
    return statement(database().connection, sql).get(...ids) !== undefined
  } catch {
    return false
  }
}

// Forwarded writes wait here until this copy has them. `litestream restore -f` applies what the primary
// sent, then renames a new `<db>-txid` into place: a watch on the folder wakes the waiting writes at
// each rename, and each looks for its row then (a poll of the position every 10 ms was most of a
// forwarded write's CPU: BENCHMARKS.md, "A follower's writes, woken by a watch"). While any waits they
// also look every 250 ms, so that a watch that misses an event (inotify drops them when its queue
// overflows) or cannot be had costs at most that. Past its deadline a write looks once more and goes.
const LOOK_AGAIN_MS = 250
const TXID_NAME = basename(files.txid)
type CatchUp = { here: () => boolean; resolve: (caughtUp: boolean) => void; timer: NodeJS.Timeout }

// The process's forwarded writes that wait, and what wakes them.
const waiting = {
  writes: new Set<CatchUp>(),
  watch: undefined as FSWatcher | null | undefined, // on the folder once the first write waited; null: none could be had
  looks: undefined as NodeJS.Timeout | undefined, // the look every LOOK_AGAIN_MS, while any write waits
}

function caughtUp(here: () => boolean, withinMs: number): Promise<boolean> {
  // The watch is on before the first look: a position written after that look wakes this write.
  waiting.watch ??= watchPositions()
  if (here()) return Promise.resolve(true)
  return new Promise((resolve) => {
    const wait: CatchUp = { here, resolve, timer: setTimeout(() => settle(wait, wait.here()), withinMs) }
    waiting.writes.add(wait)
    waiting.looks ??= setInterval(lookAll, LOOK_AGAIN_MS)
  })
}

// Every waiting write looks in one read transaction (dozens wait at once), and none looks while the
// file is as it was at the last look. A look outside the requests' reads (a timer, the watch) ends its
// transaction at once, so that the requests after it read the file as it is when they come.
let lookedAt: number | undefined // the file's data_version at the last look
function lookAll() {
  const requestsRead = turnRead !== undefined
  const db = readInThisTurn()
  if (!db) return // the next look, or each write's deadline, looks again
  try {
    const version = dataVersion(db)
    if (version !== undefined && version === lookedAt) return
    lookedAt = version
    for (const wait of waiting.writes) if (wait.here()) settle(wait, true)
  } finally {
    if (!requestsRead) endTurnRead()
  }
}

// What changes whenever another connection (Litestream, applying) has changed the file; undefined if
// the file cannot be read now.
function dataVersion(db: DatabaseSync): number | undefined {
  try {
    return (statement(db, 'PRAGMA data_version').get() as { data_version: number }).data_version
  } catch {
    return undefined
  }
}

function settle(wait: CatchUp, here: boolean) {
  clearTimeout(wait.timer)
  waiting.writes.delete(wait)
  if (waiting.writes.size === 0) {
    clearInterval(waiting.looks)
    waiting.looks = undefined
  }
  wait.resolve(here)
}

// One watch for the process, on the folder: a watch on the file itself would stay on the inode the
// first rename replaces.
function watchPositions(): FSWatcher | null {
  const failed = (error: Error) =>
    console.error(
      `follower: no watch on ${files.txid} (${error.message}): forwarded writes look every ${LOOK_AGAIN_MS} ms`,
    )
  try {
    const watcher = watch(dirname(files.txid), { persistent: false }, (_, name) => {
      if (name === null || name === TXID_NAME) lookAll()
    })
    watcher.on('error', (error) => {
      failed(error)
      waiting.watch = undefined // the next forwarded write watches again
    })
    return watcher
  } catch (error) {
    failed(error as Error)
    return null
  }
}
