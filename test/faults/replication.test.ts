// Losing the box. The server runs as `npm start` runs it with LITESTREAM_REPLICA_URL set (dist/start.js:
// restore a missing database, seed only when there is nothing to restore, then serve under
// `litestream replicate`), with the real Litestream. A replica in another folder stands for the remote
// store, and s3rver (an S3 stand-in on npm) for S3. Litestream replicates to s3rver, but cannot restore
// from it: s3rver lists no common prefix that holds only deeper keys, as each of Litestream's
// generations/<id>/ does, so Litestream finds no generation there. Over s3:// the objects that reached
// s3rver are read back through a file replica of the same layout.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { createHash } from 'node:crypto'
import { once } from 'node:events'
import { cpSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test, type TestContext } from 'node:test'
import { processTree } from '../../bench/lib.ts'
import { claims, freePort, makeToken, ROOT, sleep, smallDatabase, startServer, type Server, type Token } from '../helpers.ts'
import { notIn, percentile, restoreByHand, SYNC_INTERVAL_MS, writeStream, type Write } from '../replication.ts'

const folders: string[] = []
const servers: Server[] = []
// Whatever a failed test left running is killed, so the file still ends.
after(async () => {
  for (const server of servers) if (server.child.exitCode === null && server.child.signalCode === null) await killEverything(server.child.pid!)
  folders.forEach((dir) => rmSync(dir, { recursive: true, force: true }))
})
const folder = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), `feed-${name}-`))
  folders.push(dir)
  return dir
}

async function startReplicated(dir: string, url: string, env: Record<string, string> = {}) {
  const server = await startServer(process.execPath, ['dist/start.js'], { env: { SQLITE_PATH: join(dir, 'feed.db'), LITESTREAM_REPLICA_URL: url, ...env } })
  servers.push(server)
  return server
}

// The small test database's users, with tokens.
async function smallBox() {
  const db = smallDatabase()
  folders.push(db.dir)
  const tokens: Token[] = await Promise.all(Array.from({ length: 50 }, async (_, i) => ({ id: i + 1, username: `user_${i + 1}`, token: await makeToken(claims(String(i + 1))) })))
  return { dir: db.dir, tokens }
}

// SIGKILL to Litestream and the server under it, at once: nothing gets to send a last frame.
async function killEverything(pid: number) {
  const tree = processTree(pid)
  for (const p of tree) process.kill(p, 'SIGKILL')
  while (tree.some((p) => existsSync(`/proc/${p}`) && !/\) Z /.test(readFileSync(`/proc/${p}/stat`, 'utf8')))) await sleep(10)
}

// The restored file passes integrity_check and holds every write acknowledged more than the sync
// interval plus one second before the loss; what it lacks of the last second's is reported.
function assertRestored(t: TestContext, label: string, path: string, written: Write[], stream: Write[], lostAt: number) {
  const { integrity, missing } = notIn(path, written)
  assert.equal(integrity, 'ok')
  const due = lostAt - SYNC_INTERVAL_MS - 1_000
  assert.deepEqual(missing.filter((w) => w.at < due), [], `writes acknowledged more than ${(SYNC_INTERVAL_MS + 1_000) / 1000} s before the loss are all restored`)
  const recent = stream.filter((w) => w.at >= lostAt - 1_000)
  const recentLost = missing.filter((w) => w.at >= lostAt - 1_000)
  const oldest = missing.length ? `, the oldest acknowledged ${((lostAt - Math.min(...missing.map((w) => w.at))) / 1000).toFixed(2)} s before the loss` : ''
  t.diagnostic(`${label}: ${stream.length} writes acknowledged, ${recent.length} in the last second; lost ${missing.length}, ${recentLost.length} of the last second's (${((100 * recentLost.length) / Math.max(1, recent.length)).toFixed(0)}%)${oldest}`)
  return missing
}

// Streams writes at a box for 4 s, kills everything on it, deletes the database, its -wal and -shm, and
// starts again on an empty data folder with the same URL, `runs` times in a row. Each new box must
// restore (not seed) a file that passes integrity_check and holds every write acknowledged more than
// the sync interval plus one second before the loss, on this box or any before it.
async function loseTheBox(t: TestContext, url: string, runs: number) {
  const box = await smallBox()
  let dir = box.dir
  let server = await startReplicated(dir, url)
  let kept: Write[] = []
  const lastSecond = { acknowledged: 0, lost: 0 }
  for (let run = 1; run <= runs; run++) {
    const stream = writeStream(server.url, box.tokens, `box ${run}`)
    await sleep(4_000)
    const lostAt = performance.now()
    await killEverything(server.child.pid!)
    await stream.done
    assert.deepEqual(stream.errors, [], 'every write was answered 201 until the loss')
    for (const suffix of ['', '-wal', '-shm']) rmSync(join(dir, `feed.db${suffix}`))
    rmSync(dir, { recursive: true })

    dir = folder('new-box')
    server = await startReplicated(dir, url)
    assert.match(server.output(), /start: restored .*feed\.db \([\d.]+ MB\) from the replica/)
    assert.doesNotMatch(server.output(), /nothing to restore|seed: users/)

    const written = [...kept, ...stream.acknowledged]
    const missing = assertRestored(t, `box ${run}`, join(dir, 'feed.db'), written, stream.acknowledged, lostAt)
    lastSecond.acknowledged += stream.acknowledged.filter((w) => w.at >= lostAt - 1_000).length
    lastSecond.lost += missing.filter((w) => w.at >= lostAt - 1_000).length
    const lost = new Set(missing)
    kept = written.filter((w) => !lost.has(w))
  }
  t.diagnostic(`RPO over ${runs} losses: ${lastSecond.lost} of ${lastSecond.acknowledged} writes acknowledged in the last second before a loss were lost`)
  assert.equal(await server.stop(), 0)
}

// s3rver in a process of its own, one bucket, its objects in a folder; stop() ends it.
async function startS3rver(port: number, directory: string) {
  const script = `
    import S3rver from 's3rver'
    const [directory, port] = process.argv.slice(1)
    await new S3rver({ address: '127.0.0.1', port: Number(port), silent: true, directory, configureBuckets: [{ name: 'feed' }] }).run()
    console.log('ready')`
  const child = spawn(process.execPath, ['--input-type=module', '-e', script, directory, String(port)], { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] })
  await once(child.stdout, 'data')
  return {
    env: { AWS_ENDPOINT_URL_S3: `http://127.0.0.1:${port}`, AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER' },
    stop: () => {
      child.kill()
      return once(child, 'exit')
    },
  }
}

// What reached s3rver, as a file replica: s3rver keeps each object in a file named <key>._S3rver_object.
// It writes that file as the upload arrives and its MD5 beside it once the upload is whole, so an
// upload cut off by the loss leaves half an object with no MD5. On S3 a PUT that never completed
// leaves no object, so only objects whose MD5 is there and matches are copied.
function fileReplicaOf(objects: string) {
  const replica = folder('replica')
  const prefix = join(objects, 'feed', 'feed.db')
  const cutOff: string[] = []
  for (const file of readdirSync(prefix, { recursive: true }) as string[]) {
    if (!file.endsWith('._S3rver_object')) continue
    const md5 = join(prefix, `${file}.md5`)
    const whole = existsSync(md5) && readFileSync(md5, 'utf8') === createHash('md5').update(readFileSync(join(prefix, file))).digest('hex')
    if (whole) cpSync(join(prefix, file), join(replica, file.slice(0, -'._S3rver_object'.length)))
    else cutOff.push(file)
  }
  return { url: `file://${replica}`, cutOff }
}

describe('a box lost under a stream of writes (SIGKILL to every process, the data folder deleted)', () => {
  test('restores on an empty folder from a file replica, 5 losses in a row', (t) => loseTheBox(t, `file://${folder('replica')}`, 5))

  test('over s3:// (s3rver), a restore holds every write acknowledged more than the sync interval plus 1 s before the loss', async (t) => {
    const objects = folder('s3rver')
    const s3 = await startS3rver(await freePort(), objects)
    try {
      const box = await smallBox()
      const server = await startReplicated(box.dir, 's3://feed/feed.db', s3.env)
      const stream = writeStream(server.url, box.tokens, 's3 box')
      await sleep(4_000)
      const lostAt = performance.now()
      await killEverything(server.child.pid!)
      await stream.done
      assert.deepEqual(stream.errors, [])
      const restored = join(folder('new-box'), 'feed.db')
      const replica = fileReplicaOf(objects)
      t.diagnostic(`uploads cut off by the loss, left out: ${replica.cutOff.length ? replica.cutOff.join(', ') : 'none'}`)
      restoreByHand(replica.url, restored)
      assertRestored(t, 's3 box', restored, stream.acknowledged, stream.acknowledged, lostAt)
    } finally {
      await s3.stop()
    }
  })
})

describe('a clean stop, then the disk lost', () => {
  test('seeds when the replica is empty; after SIGTERM under writes and the folder deleted, restores every acknowledged write', async (t) => {
    const url = `file://${folder('replica')}`
    let dir = folder('box')
    let server = await startReplicated(dir, url)
    assert.match(server.output(), /nothing to restore, so the seed builds one/)
    assert.match(server.output(), /checksum 738d11ab…cf1d ok/)
    const tokens: Token[] = JSON.parse(readFileSync(join(dir, 'tokens.json'), 'utf8')).slice(0, 50)

    const stream = writeStream(server.url, tokens, 'clean stop')
    await sleep(3_000)
    // Litestream 0.3.13 exits 1 when its last sync also calls for a checkpoint: it runs that on a
    // context it has just cancelled. It also exits 1, now and then, when its last sync and its monitor
    // upload the same WAL segment at once, and one finds the other's temporary file gone (seen once in
    // CI: two "write wal segment" at one position, then "client write: stat ....wal.lz4.tmp"). The
    // frames are sent before either; the restore below is the proof (issue 18 moves to 0.5).
    const code = await server.stop('SIGTERM')
    const closeBug = /error closing db.*(release read lock: context canceled|client write: stat .*\.tmp: no such file or directory)/.test(server.output())
    assert.ok(code === 0 || (code === 1 && closeBug), `Litestream and the server exit 0:\n${server.output().slice(-3000)}`)
    t.diagnostic(`exit ${code}${closeBug ? " (one of Litestream 0.3.13's two failures at close, above)" : ''}`)
    await stream.stop()
    assert.deepEqual(stream.errors, [])
    rmSync(dir, { recursive: true })

    dir = folder('new-box')
    const started = performance.now()
    server = await startReplicated(dir, url)
    assert.match(server.output(), /start: restored /)
    assert.doesNotMatch(server.output(), /seed: users/)
    const { integrity, missing } = notIn(join(dir, 'feed.db'), stream.acknowledged)
    t.diagnostic(`${stream.acknowledged.length} writes acknowledged up to SIGTERM, ${missing.length} missing after the restore; restored and listening in ${((performance.now() - started) / 1000).toFixed(1)} s`)
    assert.equal(integrity, 'ok')
    assert.deepEqual(missing, [])
    assert.equal(await server.stop(), 0)
  })
})

// Litestream 0.3.13 sends each WAL segment through a pipe, and a write to the replica that fails
// before reading it all leaves the pipe full for good: replication stops, and shutdown hangs (fixed
// upstream after 0.3.13). A file replica that turns read-only does that at once; S3 does when a
// segment is over the uploader's 5 MB part size. So the writes here come slowly enough (one lane,
// about 80 a second, under 0.5 MB of WAL a second) that 3 s of pending segments stay under it.
describe('the S3 endpoint unreachable for a while (s3rver stopped, then started again)', () => {
  test('serves and writes on with no error, then catches up: a restore holds every write', async (t) => {
    const port = await freePort()
    const objects = folder('s3rver')
    let s3 = await startS3rver(port, objects)
    try {
      const box = await smallBox()
      const server = await startReplicated(box.dir, 's3://feed/feed.db', s3.env)
      while (!/snapshot written/.test(server.output())) await sleep(100)

      const stream = writeStream(server.url, box.tokens, 'outage', { lanes: 1, pauseMs: 20 })
      await sleep(3_000)
      const cut = performance.now()
      await s3.stop()
      await sleep(3_000)
      const back = performance.now()
      s3 = await startS3rver(port, objects)
      await sleep(3_000)
      await stream.stop()
      assert.deepEqual(stream.errors, [])
      assert.match(server.output(), /connection refused/, `Litestream could not reach the endpoint meanwhile:\n${server.output().slice(-3000)}`)

      // It catches up while it runs: restore by hand until the replica holds every write.
      const check = join(folder('check'), 'feed.db')
      const waited = performance.now()
      let missing = stream.acknowledged
      while (missing.length && performance.now() - waited < 30_000) {
        await sleep(500)
        rmSync(check, { force: true })
        restoreByHand(fileReplicaOf(objects).url, check)
        missing = notIn(check, stream.acknowledged).missing
      }
      assert.deepEqual(missing, [], 'the replica caught up')

      const phases = { before: stream.acknowledged.filter((w) => w.at < cut), unreachable: stream.acknowledged.filter((w) => w.at >= cut && w.at < back), after: stream.acknowledged.filter((w) => w.at >= back) }
      t.diagnostic(Object.entries(phases).map(([phase, writes]) => `${phase}: ${writes.length} writes, p50 ${percentile(writes, 50).toFixed(1)} ms, p99 ${percentile(writes, 99).toFixed(1)} ms`).join('; '))
      t.diagnostic(`caught up within ${((performance.now() - waited) / 1000).toFixed(1)} s of the writes stopping`)
      assert.ok(phases.unreachable.length > 0, 'writes were acknowledged while the endpoint was unreachable')
      assert.equal(await server.stop(), 0)
    } finally {
      await s3.stop()
    }
  })
})
