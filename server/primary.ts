// A primary under `litestream replicate` (start.ts), seen from the server: every commit writes page 1
// for the followers, /health and the log say how far behind the replica is, and with
// LITESTREAM_SYNC=wait a write is answered once the replica holds it. The API knows none of this: the
// touch of page 1 is part of the server's setup (replicaSetup), and this wraps its fetch.
import { request } from 'node:http'
import type { DatabaseSync, StatementSync } from 'node:sqlite'
import { ApiError, errorResponse, type ServerSetup, SQLITE_PATH } from '../app.ts'
import type { Fetch } from './api-server.ts'
import { litestreamFiles, litestreamSocket } from './litestream.ts'

// `wait`: a write is acknowledged only once the replica holds it.
const SYNC_WAIT = process.env.LITESTREAM_SYNC === 'wait'
// How long a write waits for the replica (LITESTREAM_SYNC=wait) before it is answered with a 503.
const REPLICA_WAIT_MS = Number(process.env.REPLICA_WAIT_MS || 5_000)
// How long the replica may go without taking what is new before /health says `behind` and the log says
// so (Litestream sends every second or two).
const REPLICA_LAG_MS = Number(process.env.REPLICA_LAG_MS || 10_000)

const files = litestreamFiles(SQLITE_PATH)

// What the API adds under Litestream: each commit touches page 1.
export const replicaSetup = (): ServerSetup => (litestreamSocket ? { beforeCommit: touchHeader } : {})

// Has Litestream take the database before the first request, watches the replica from then on, and
// wraps the API's fetch for LITESTREAM_SYNC=wait. `speaks`: this process says in the log how the
// replica is doing (one process of the service does).
export async function startReplicating(fetch: Fetch, speaks: boolean): Promise<Fetch> {
  if (!litestreamSocket) {
    if (SYNC_WAIT && speaks)
      console.warn(
        'LITESTREAM_SYNC=wait without Litestream (start with LITESTREAM_REPLICA_URL and npm start): writes are acknowledged on commit here',
      )
    return fetch
  }
  replica.speaks = speaks
  await startWatchingReplica()
  return SYNC_WAIT ? answeringOnceReplicated(fetch) : fetch
}

// Every commit writes page 1 (the header's user_version, to the value it has), so each LTX file carries
// it, and a follower's Litestream, applying it, changes the header's counter by which the follower's
// readers know that their cached pages are stale (docs/scale-out.md, "What the start does that
// Litestream 0.5.17 does not").
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

// The replica as this process sees it: written by watchReplica and catchUp, read by /health and the log.
const replica = {
  speaks: false, // this process says in the log how the replica is doing
  syncedAt: Date.now(), // Litestream's last success, or this process's start
  unreachable: undefined as string | undefined, // why Litestream did not answer
  catchUpFailed: undefined as string | undefined, // why the last upload this process asked for failed
  catchingUp: false, // an upload this process asked for is on its way
  worstBehindMs: 0, // since the replica was last ok, for the log
}

// One request to Litestream's control socket, answered with JSON in time, or an error that says why.
function askLitestream<T>(method: 'GET' | 'POST', path: string, timeoutMs: number, body?: object): Promise<T> {
  return new Promise((resolve, reject) => {
    const ask = request(
      {
        socketPath: litestreamSocket,
        method,
        path,
        timeout: timeoutMs,
        headers: { 'content-type': 'application/json' },
      },
      (res) => {
        let text = ''
        res
          .setEncoding('utf8')
          .on('data', (chunk) => (text += chunk))
          .on('end', () => {
            try {
              const answer = JSON.parse(text)
              if (res.statusCode === 200) resolve(answer)
              else reject(new Error(answer.error ?? `status ${res.statusCode}`))
            } catch {
              reject(new Error(`status ${res.statusCode}, ${text.slice(0, 200)}`))
            }
          })
      },
    )
    ask.on('timeout', () => ask.destroy(new Error(`no answer within ${timeoutMs / 1000} s`)))
    ask.on('error', reject)
    ask.end(body && JSON.stringify(body))
  })
}

// Litestream sends what is new in the WAL and answers once the replica holds it (`wait`).
const upload = (timeoutMs: number) =>
  askLitestream('POST', '/sync', timeoutMs, { path: files.db, wait: true, timeout: Math.ceil(timeoutMs / 1000) })

// What /health adds under Litestream. A replica behind does not make /health a 503: the node serves
// every request right, and a load balancer would pull the only primary.
export const replicaHealth = () => (litestreamSocket ? { replica: replicaState() } : {})

function replicaState() {
  const behind_ms = Date.now() - replica.syncedAt
  const state = replica.unreachable ? 'unreachable' : behind_ms > REPLICA_LAG_MS ? 'behind' : 'ok'
  const error = replica.unreachable ?? replica.catchUpFailed
  return { state, behind_ms, ...(error && { error }) }
}

// Litestream first looks at the database a second after it starts, and at shutdown sends only a
// database it has looked at: writes answered before then would not reach the replica on a quick stop.
// So the server has it look (a sync) before it takes a request.
async function startWatchingReplica() {
  try {
    await askLitestream('POST', '/sync', 5_000, { path: files.db })
  } catch (error) {
    console.warn(`replica: Litestream did not take the database at start (${(error as Error).message})`)
  }
  watchReplica()
}

// Once a second: how long ago the replica took everything, for /health (`behind_ms`) and the log, which
// says when that passes REPLICA_LAG_MS and when the replica has caught up.
async function watchReplica() {
  try {
    type List = { databases: { path: string; last_sync_at?: string }[] }
    const { databases } = await askLitestream<List>('GET', '/list', 2_000)
    const syncedAt = Date.parse(databases.find((db) => db.path === files.db)?.last_sync_at ?? '')
    if (syncedAt > replica.syncedAt) replica.syncedAt = syncedAt
    replica.unreachable = undefined
  } catch (error) {
    replica.unreachable = `Litestream does not answer: ${(error as Error).message}`
  }
  const { state, behind_ms, error } = replicaState()
  if (replica.speaks && state !== 'ok' && replica.worstBehindMs === 0) {
    console.warn(
      `replica: ${state === 'unreachable' ? 'unreachable' : `${(behind_ms / 1000).toFixed(0)} s behind`}${error ? ` (${error})` : ''}; the writes since may be on this box only`,
    )
  } else if (replica.speaks && state === 'ok' && replica.worstBehindMs > 0) {
    console.log(`replica: caught up, after ${(replica.worstBehindMs / 1000).toFixed(1)} s behind at most`)
  }
  replica.worstBehindMs = state === 'ok' ? 0 : Math.max(replica.worstBehindMs, behind_ms, 1)
  if (behind_ms <= 3_000) replica.catchUpFailed = undefined
  else if (replica.speaks && !replica.unreachable && !replica.catchingUp) catchUp()
  setTimeout(watchReplica, 1_000).unref()
}

// After a failed upload Litestream waits before it tries again, twice as long each time, up to 5
// minutes. Past 3 s behind, one process asks for the upload itself, one at a time, so the replica
// catches up soon after the store is back.
async function catchUp() {
  replica.catchingUp = true
  try {
    await upload(REPLICA_WAIT_MS)
    replica.catchUpFailed = undefined
  } catch (error) {
    replica.catchUpFailed = `sending to the replica failed: ${(error as Error).message}`
  }
  replica.catchingUp = false
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
      await confirmation()
      return response
    } catch (error) {
      return errorResponse(503, (error as ApiError).message)
    }
  }
  return (request, env) => (request.method === 'POST' ? replicated(fetch(request, env)) : fetch(request, env))
}

// The writes that wait for the replica's confirmation (LITESTREAM_SYNC=wait).
const confirming = {
  next: [] as { resolve: () => void; reject: (error: unknown) => void }[], // the next upload's writes
  uploading: false, // an upload for the writes before them is on its way
  failing: false, // since the last upload that failed, for the log
}

function confirmation(): Promise<void> {
  return new Promise((resolve, reject) => {
    confirming.next.push({ resolve, reject })
    if (!confirming.uploading) confirmRound()
  })
}

async function confirmRound() {
  const round = confirming.next
  confirming.next = []
  confirming.uploading = true
  try {
    await upload(REPLICA_WAIT_MS)
    if (confirming.failing && replica.speaks) console.log('replica: writes are confirmed by the replica again')
    confirming.failing = false
    for (const { resolve } of round) resolve()
  } catch (error) {
    if (!confirming.failing && replica.speaks)
      console.warn(
        `replica: a write was not confirmed (Litestream: ${(error as Error).message}); writes answer 503 until the replica confirms them again`,
      )
    confirming.failing = true
    const refusal = new ApiError(
      503,
      'the replica did not confirm the write; it is committed here, and reaches the replica once the replica is back',
    )
    for (const { reject } of round) reject(refusal)
  }
  confirming.uploading = false
  if (confirming.next.length) confirmRound()
}
