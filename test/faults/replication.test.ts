// Losing the box. The server runs as `npm start` runs it with LITESTREAM_REPLICA_URL set (dist/start.js:
// restore a missing database, seed only when there is nothing to restore, then serve under
// `litestream replicate`), with the real Litestream 0.5. A replica in another folder stands for the
// remote store, and s3rver (an S3 stand-in on npm) for S3.
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test, type TestContext } from 'node:test'
import { startS3rver } from '../../harness/s3.ts'
import type { Token } from '../../harness/seed.ts'
import { type Server, startServer } from '../../harness/server.ts'
import { sleep, until, within } from '../../harness/time.ts'
import { NO_LITESTREAM } from '../../harness/tools.ts'
import { claims, describeNeeding, freePort, makeToken, smallDatabase } from '../helpers.ts'
import {
  killEverything,
  LITESTREAM_ENV,
  notIn,
  percentile,
  restoreByHand,
  SYNC_INTERVAL_MS,
  writeStream,
  type Write,
} from '../replication.ts'

const folders: string[] = []
const servers: Server[] = []
// Whatever a failed test left running is killed, so the file still ends.
after(async () => {
  for (const server of servers)
    if (server.child.exitCode === null && server.child.signalCode === null) await killEverything(server.child.pid!)
  folders.forEach((dir) => rmSync(dir, { recursive: true, force: true }))
})
const folder = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), `feed-${name}-`))
  folders.push(dir)
  return dir
}

async function startReplicated(dir: string, url: string, env: Record<string, string> = {}) {
  const server = await startServer(process.execPath, ['dist/start.js'], {
    env: { SQLITE_PATH: join(dir, 'feed.db'), LITESTREAM_REPLICA_URL: url, ...LITESTREAM_ENV, ...env },
  })
  servers.push(server)
  return server
}

// The small test database's users, with tokens.
async function smallBox() {
  const db = smallDatabase()
  folders.push(db.dir)
  const tokens: Token[] = await Promise.all(
    Array.from({ length: 50 }, async (_, i) => ({
      id: i + 1,
      username: `user_${i + 1}`,
      token: await makeToken(claims(String(i + 1))),
    })),
  )
  return { dir: db.dir, tokens }
}

// The restored file passes integrity_check and holds every write acknowledged more than the sync
// interval plus one second before the loss (with LITESTREAM_SYNC=wait, every acknowledged write);
// what it lacks of the last second's is reported.
function assertRestored(
  t: TestContext,
  label: string,
  path: string,
  written: Write[],
  stream: Write[],
  lostAt: number,
  waited = false,
) {
  const { integrity, missing } = notIn(path, written)
  assert.equal(integrity, 'ok')
  const due = waited ? Infinity : lostAt - SYNC_INTERVAL_MS - 1_000
  assert.deepEqual(
    missing.filter((w) => w.at < due),
    [],
    waited
      ? 'every acknowledged write is restored'
      : `writes acknowledged more than ${(SYNC_INTERVAL_MS + 1_000) / 1000} s before the loss are all restored`,
  )
  const recent = stream.filter((w) => w.at >= lostAt - 1_000)
  const recentLost = missing.filter((w) => w.at >= lostAt - 1_000)
  const oldest = missing.length
    ? `, the oldest acknowledged ${((lostAt - Math.min(...missing.map((w) => w.at))) / 1000).toFixed(2)} s before the loss`
    : ''
  t.diagnostic(
    `${label}: ${stream.length} writes acknowledged, ${recent.length} in the last second; lost ${missing.length}, ${recentLost.length} of the last second's (${((100 * recentLost.length) / Math.max(1, recent.length)).toFixed(0)}%)${oldest}`,
  )
  return missing
}

// Streams writes at a box for 4 s (2 s with LITESTREAM_SYNC=wait, where no write may be missing: the
// default mode needs writes older than the 2 s it may lose), kills everything on it, deletes the database, its -wal and -shm, and
// starts again on an empty data folder with the same URL, `runs` times in a row. Each new box must
// restore (not seed) a file that passes integrity_check and holds every write acknowledged more than
// the sync interval plus one second before the loss (with LITESTREAM_SYNC=wait, every acknowledged
// write), on this box or any before it.
async function loseTheBox(t: TestContext, url: string, runs: number, env: Record<string, string> = {}) {
  const waited = env.LITESTREAM_SYNC === 'wait'
  const streamMs = waited ? 2_000 : 4_000
  const box = await smallBox()
  let dir = box.dir
  let server = await startReplicated(dir, url, env)
  const latencies: Write[] = []
  let kept: Write[] = []
  const lastSecond = { acknowledged: 0, lost: 0 }
  for (let run = 1; run <= runs; run++) {
    const stream = writeStream(server.url, box.tokens, `box ${run}`)
    await sleep(streamMs) // how long the writes stream before the loss
    const lostAt = performance.now()
    await killEverything(server.child.pid!)
    await within(stream.done, 10_000, 'the writes to end with the box')
    assert.deepEqual(stream.errors, [], 'every write was answered 201 until the loss')
    for (const suffix of ['', '-wal', '-shm']) rmSync(join(dir, `feed.db${suffix}`))
    rmSync(dir, { recursive: true })

    latencies.push(...stream.acknowledged)

    dir = folder('new-box')
    server = await startReplicated(dir, url, env)
    assert.match(server.output(), /start: restored .*feed\.db \([\d.]+ MB\) from the replica/)
    assert.doesNotMatch(server.output(), /nothing to restore|seed: users/)

    const written = [...kept, ...stream.acknowledged]
    const missing = assertRestored(t, `box ${run}`, join(dir, 'feed.db'), written, stream.acknowledged, lostAt, waited)
    lastSecond.acknowledged += stream.acknowledged.filter((w) => w.at >= lostAt - 1_000).length
    lastSecond.lost += missing.filter((w) => w.at >= lostAt - 1_000).length
    const lost = new Set(missing)
    kept = written.filter((w) => !lost.has(w))
  }
  t.diagnostic(
    `RPO over ${runs} losses: ${lastSecond.lost} of ${lastSecond.acknowledged} writes acknowledged in the last second before a loss were lost`,
  )
  const likes = latencies.filter((w) => w.kind === 'like')
  t.diagnostic(
    `${likes.length} likes, under 16 lanes: p50 ${percentile(likes, 50).toFixed(1)} ms, p99 ${percentile(likes, 99).toFixed(1)} ms; ${((1000 * latencies.length) / (streamMs * runs)).toFixed(0)} writes a second`,
  )
  assert.equal(await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'), 0)
}

// s3rver keeps each object in a file named <key>._S3rver_object, which it writes as the upload
// arrives, and its MD5 beside it once the upload is whole: an upload cut off by the loss leaves half an
// object that s3rver lists (seen: one of 0 bytes, which Litestream's restore refuses). On S3 a PUT that
// never completed leaves no object, so those are dropped before a restore: no MD5, a wrong one, or
// fewer bytes than an LTX file's header. The rest is read back through s3rver, as from S3.
function dropCutOffUploads(objects: string) {
  const cutOff: string[] = []
  for (const file of readdirSync(objects, { recursive: true }) as string[]) {
    if (!file.endsWith('._S3rver_object')) continue
    const path = join(objects, file)
    const bytes = readFileSync(path)
    if (
      bytes.length >= 100 &&
      existsSync(`${path}.md5`) &&
      readFileSync(`${path}.md5`, 'utf8') === createHash('md5').update(bytes).digest('hex')
    )
      continue
    rmSync(path)
    cutOff.push(file)
  }
  return cutOff
}

// Its tests run at once, for CI's time: each box, replica and s3rver is its own (their latencies then
// are not BENCHMARKS.md's, which come from one test at a time).
describeNeeding(
  NO_LITESTREAM,
  'a box lost under a stream of writes (SIGKILL to every process, the data folder deleted)',
  { concurrency: true },
  () => {
    test('restores on an empty folder from a file replica, 5 losses in a row', (t) =>
      loseTheBox(t, `file://${folder('replica')}`, 5))

    test('with LITESTREAM_SYNC=wait, every acknowledged write is restored, 5 losses in a row', (t) =>
      loseTheBox(t, `file://${folder('replica')}`, 5, { LITESTREAM_SYNC: 'wait' }))

    // Once by default, once with LITESTREAM_SYNC=wait, where every acknowledged write must be restored.
    for (const env of [{}, { LITESTREAM_SYNC: 'wait' }] as Record<string, string>[]) {
      const waited = 'LITESTREAM_SYNC' in env
      test(`over s3:// (s3rver)${waited ? ', with LITESTREAM_SYNC=wait' : ''}, a restore holds every write acknowledged ${waited ? '' : 'more than the sync interval plus 1 s '}before the loss`, async (t) => {
        const objects = folder('s3rver')
        const s3 = await startS3rver(await freePort(), objects)
        try {
          const box = await smallBox()
          const server = await startReplicated(box.dir, 's3://feed/feed.db', { ...s3.env, ...env })
          const stream = writeStream(server.url, box.tokens, 's3 box')
          await sleep(waited ? 2_000 : 4_000) // how long the writes stream before the loss
          const lostAt = performance.now()
          await killEverything(server.child.pid!)
          await within(stream.done, 10_000, 'the writes to end with the box')
          assert.deepEqual(stream.errors, [], `the server's log:\n${server.output().slice(-3000)}`)
          const cutOff = dropCutOffUploads(objects)
          t.diagnostic(`uploads cut off by the loss, dropped: ${cutOff.length ? cutOff.join(', ') : 'none'}`)
          const restored = join(folder('new-box'), 'feed.db')
          restoreByHand(s3.url, restored, s3.env)
          assertRestored(t, 's3 box', restored, stream.acknowledged, stream.acknowledged, lostAt, waited)
          const likes = stream.acknowledged.filter((w) => w.kind === 'like')
          t.diagnostic(
            `${likes.length} likes, under 16 lanes: p50 ${percentile(likes, 50).toFixed(1)} ms, p99 ${percentile(likes, 99).toFixed(1)} ms; ${(stream.acknowledged.length / (waited ? 2 : 4)).toFixed(0)} writes a second`,
          )
        } finally {
          await s3.stop()
        }
      })
    }
  },
)

describeNeeding(NO_LITESTREAM, 'a clean stop, then the disk lost', {}, () => {
  test('seeds when the replica is empty; after SIGTERM under writes and the folder deleted, restores every acknowledged write', async (t) => {
    const url = `file://${folder('replica')}`
    let dir = folder('box')
    let server = await startReplicated(dir, url)
    assert.match(server.output(), /nothing to restore, so the seed builds one/)
    assert.match(server.output(), /checksum 738d11ab…cf1d ok/)
    const tokens: Token[] = JSON.parse(readFileSync(join(dir, 'tokens.json'), 'utf8')).slice(0, 50)

    const stream = writeStream(server.url, tokens, 'clean stop')
    await sleep(3_000) // how long the writes stream before the stop
    assert.equal(
      await within(server.stop('SIGTERM'), 15_000, 'Litestream and the server to exit on SIGTERM'),
      0,
      `Litestream and the server exit 0:\n${server.output().slice(-3000)}`,
    )
    await stream.stop()
    assert.deepEqual(stream.errors, [])
    rmSync(dir, { recursive: true })

    dir = folder('new-box')
    const started = performance.now()
    server = await startReplicated(dir, url)
    assert.match(server.output(), /start: restored /)
    assert.doesNotMatch(server.output(), /seed: users/)
    const { integrity, missing } = notIn(join(dir, 'feed.db'), stream.acknowledged)
    t.diagnostic(
      `${stream.acknowledged.length} writes acknowledged up to SIGTERM, ${missing.length} missing after the restore; restored and listening in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    )
    assert.equal(integrity, 'ok')
    assert.deepEqual(missing, [])
    assert.equal(await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'), 0)
  })
})

// What /health says of the replica right now.
async function replicaHealth(server: Server) {
  const res = await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(5_000) })
  assert.equal(res.status, 200, 'a replica behind or unreachable never makes /health a 503')
  return (await res.json()).replica as { state: string; behind_ms: number; error?: string }
}

// The replica, checked by a restore by hand until it holds every write, for up to 60 s: seconds taken.
async function untilReplicaHolds(url: string, env: Record<string, string>, writes: Write[]) {
  const check = join(folder('check'), 'feed.db')
  const started = performance.now()
  let missing = writes
  while (missing.length && performance.now() - started < 60_000) {
    await sleep(500)
    rmSync(check, { force: true })
    restoreByHand(url, check, env)
    missing = notIn(check, writes).missing
  }
  assert.deepEqual(missing, [], 'the replica caught up')
  return (performance.now() - started) / 1000
}

// Long enough for the replica to fall behind past REPLICA_LAG_MS, set to 3 s here; OUTAGE_S=30 for
// the figures in BENCHMARKS.md.
const OUTAGE_S = Number(process.env.OUTAGE_S || 8)

describeNeeding(
  NO_LITESTREAM,
  'the S3 endpoint unreachable for a while (s3rver stopped, then started again)',
  {},
  () => {
    test(`${OUTAGE_S} s: serves and writes on with no error, /health and the log say how far behind, then it catches up`, async (t) => {
      const port = await freePort()
      const objects = folder('s3rver')
      let s3 = await startS3rver(port, objects)
      try {
        const box = await smallBox()
        const server = await startReplicated(box.dir, 's3://feed/feed.db', { ...s3.env, REPLICA_LAG_MS: '3000' })
        await until(() => /snapshot complete/.test(server.output()), 20_000, "Litestream's first snapshot")

        const stream = writeStream(server.url, box.tokens, 'outage', { lanes: 4, pauseMs: 5 })
        await sleep(3_000) // writes before the outage, to compare with those during it
        assert.equal((await replicaHealth(server)).state, 'ok')
        const cut = performance.now()
        await s3.stop()
        await sleep(OUTAGE_S * 1000) // the outage
        const during = await replicaHealth(server)
        t.diagnostic(`/health at the end of the outage: ${JSON.stringify(during)}`)
        assert.equal(during.state, 'behind')
        assert.ok(during.behind_ms > (OUTAGE_S - 3) * 1000, `behind_ms ${during.behind_ms}`)
        assert.match(server.output(), /replica: \d+ s behind/)
        const back = performance.now()
        s3 = await startS3rver(port, objects)
        let caughtUp = 0
        for (let waited = 0; waited < 30_000 && !caughtUp; waited += 100) {
          await sleep(100)
          if ((await replicaHealth(server)).state === 'ok') caughtUp = (performance.now() - back) / 1000
        }
        assert.ok(caughtUp > 0, '/health says ok again within 30 s of the endpoint coming back')
        assert.match(server.output(), /replica: caught up, after \d+\.\d s behind at most/)
        await sleep(1_000) // a second of writes once it has caught up
        await stream.stop()
        assert.deepEqual(stream.errors, [])

        const restoredWithin = await untilReplicaHolds(s3.url, s3.env, stream.acknowledged)
        const phases = {
          before: stream.acknowledged.filter((w) => w.at < cut),
          unreachable: stream.acknowledged.filter((w) => w.at >= cut && w.at < back),
          after: stream.acknowledged.filter((w) => w.at >= back),
        }
        t.diagnostic(
          Object.entries(phases)
            .map(
              ([phase, writes]) =>
                `${phase}: ${writes.length} writes, p50 ${percentile(writes, 50).toFixed(1)} ms, p99 ${percentile(writes, 99).toFixed(1)} ms`,
            )
            .join('; '),
        )
        t.diagnostic(
          `/health ok ${caughtUp.toFixed(1)} s after the endpoint came back; a restore by hand then held every write (${restoredWithin.toFixed(1)} s more)`,
        )
        assert.ok(phases.unreachable.length > 0, 'writes were acknowledged while the endpoint was unreachable')
        assert.equal(await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'), 0)
      } finally {
        await s3.stop()
      }
    })

    test('with LITESTREAM_SYNC=wait: writes answer 503 after REPLICA_WAIT_MS, reads go on, and writes succeed again once it is back', async (t) => {
      const port = await freePort()
      const objects = folder('s3rver')
      let s3 = await startS3rver(port, objects)
      try {
        const box = await smallBox()
        const server = await startReplicated(box.dir, 's3://feed/feed.db', {
          ...s3.env,
          LITESTREAM_SYNC: 'wait',
          REPLICA_WAIT_MS: '1000',
        })
        const post = (body: string) =>
          fetch(`${server.url}/posts`, {
            method: 'POST',
            headers: { authorization: `Bearer ${box.tokens[0].token}` },
            body: JSON.stringify({ body }),
            signal: AbortSignal.timeout(10_000),
          })
        const posted = async (body: string) => {
          const res = await post(body)
          assert.equal(res.status, 201)
          return { kind: 'post' as const, id: (await res.json()).post.id as number, body, at: 0, ms: 0 }
        }
        const first = await posted('before the outage')
        await s3.stop()
        const sent = performance.now()
        const refused = await post('during the outage')
        const waited = performance.now() - sent
        assert.equal(refused.status, 503)
        assert.match((await refused.json()).error, /the replica did not confirm the write; it is committed here/)
        assert.ok(waited >= 900 && waited < 3_000, `answered after ${waited.toFixed(0)} ms`)
        assert.match(server.output(), /replica: a write was not confirmed/)
        const read = await fetch(`${server.url}/posts/${first.id}`)
        assert.equal(read.status, 200, 'reads go on')
        s3 = await startS3rver(port, objects)
        // Once the endpoint is back, writes are confirmed again within seconds; each 503 before that
        // is committed here all the same.
        const back = performance.now()
        const refusedBodies = ['during the outage']
        let after: Write | undefined
        for (let i = 0; !after && performance.now() - back < 30_000; i++) {
          const body = `after the outage, ${i}`
          const res = await post(body)
          if (res.status === 201) after = { kind: 'post', id: (await res.json()).post.id, body, at: 0, ms: 0 }
          else refusedBodies.push(body)
        }
        assert.ok(after, 'writes are confirmed again within 30 s of the endpoint coming back')
        assert.match(server.output(), /replica: writes are confirmed by the replica again/)
        t.diagnostic(
          `the 503 came after ${waited.toFixed(0)} ms; writes were confirmed again ${((performance.now() - back) / 1000).toFixed(1)} s after the endpoint came back (${refusedBodies.length - 1} more 503s meanwhile)`,
        )
        // The writes answered 503 were committed here, and reached the replica with the next.
        const restored = join(folder('restored'), 'feed.db')
        restoreByHand(s3.url, restored, s3.env)
        const refusedPosts = refusedBodies.map((body, i) => ({
          kind: 'post' as const,
          id: first.id + 1 + i,
          body,
          at: 0,
          ms: 0,
        }))
        assert.deepEqual(notIn(restored, [first, ...refusedPosts, after]).missing, [])
        assert.equal(await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'), 0)
      } finally {
        await s3.stop()
      }
    })
  },
)

describeNeeding(NO_LITESTREAM, 'Litestream stopped under the server (SIGSTOP)', {}, () => {
  test('/health says the replica is unreachable within 3 s, and the log says so; SIGCONT: ok again', async () => {
    const box = await smallBox()
    const server = await startReplicated(box.dir, `file://${folder('replica')}`)
    assert.equal((await replicaHealth(server)).state, 'ok')
    process.kill(server.child.pid!, 'SIGSTOP') // Litestream took the start process's place
    try {
      await fetch(`${server.url}/posts/1/like`, {
        method: 'POST',
        headers: { authorization: `Bearer ${box.tokens[0].token}` },
      })
      let health = await replicaHealth(server)
      for (
        const deadline = performance.now() + 5_000;
        health.state !== 'unreachable' && performance.now() < deadline;
      ) {
        await sleep(200)
        health = await replicaHealth(server)
      }
      assert.equal(health.state, 'unreachable')
      assert.match(health.error ?? '', /^Litestream does not answer: no answer within 2 s/)
      await until(
        () => /replica: unreachable \(Litestream does not answer/.test(server.output()),
        2_000,
        'the log line',
      )
    } finally {
      process.kill(server.child.pid!, 'SIGCONT')
    }
    await until(() => /replica: caught up/.test(server.output()), 10_000, 'the log line after SIGCONT')
    assert.equal((await replicaHealth(server)).state, 'ok')
    assert.equal(await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'), 0)
  })
})
