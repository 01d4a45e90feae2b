// Litestream followers on this machine, every process the real one: a primary (npm start with
// LITESTREAM_REPLICA_URL: `litestream replicate`) and followers (the same, with PRIMARY_API_URL:
// `litestream restore -f` and a server that reads its copy and forwards the writes). Over a file
// replica, every test; over s3rver, the contract's goldens and read-your-writes.
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { type AddressInfo, createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe, test } from 'node:test'
import { exchange } from '../harness/client.ts'
import { startS3rver } from '../harness/s3.ts'
import { freshSeededCopy, type Token } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { sleep, within } from '../harness/time.ts'
import { NO_LITESTREAM } from '../harness/tools.ts'
import { CATCH_UP_MS } from '../server/follower.ts'
import { contractTests, goldenTests } from './contract.ts'
import { clusterLoad, describeNeeding, freePort, post, smallDatabase } from './helpers.ts'
import { killEverything, LITESTREAM_ENV } from './replication.ts'

const seed = process.env.TEST_SEED_DB ?? ''
const tokens: Token[] = NO_LITESTREAM ? [] : JSON.parse(readFileSync(join(dirname(seed), 'tokens.json'), 'utf8'))

async function expectError(res: Response, status: number, message: string) {
  assert.equal(res.status, status)
  assert.equal(await res.text(), `{"error":"${message}"}`)
}

for (const store of ['a file replica', 's3rver'] as const) {
  const everything = store === 'a file replica'
  // Over the file, the primary's Litestream syncs every 100 ms (LITESTREAM_SYNC_INTERVAL); over s3rver,
  // at its defaults (1 s).
  const interval = everything ? '100ms' : undefined
  // A deadline for the whole, which takes about a minute here: no wait below outlives it.
  describeNeeding(
    NO_LITESTREAM,
    `Litestream followers over ${store}${interval ? `, syncing every ${interval}` : ''}: node a the primary, b and c following it`,
    { timeout: 300_000 },
    () => {
      const dir = mkdtempSync(join(tmpdir(), 'followers-'))
      const primaryDb = freshSeededCopy()
      let replica: { url: string; env: Record<string, string>; stop?: () => Promise<void> }
      let primaryPort: number
      const nodes: Server[] = []
      const url = (i: number) => nodes[i].url

      const startPrimary = () =>
        startServer(process.execPath, ['dist/start.js'], {
          env: {
            ...LITESTREAM_ENV,
            ...replica.env,
            SQLITE_PATH: primaryDb.path,
            PORT: String(primaryPort),
            LITESTREAM_REPLICA_URL: replica.url,
            ...(interval && { LITESTREAM_SYNC_INTERVAL: interval }),
          },
        })
      const startFollower = (name: string) =>
        startServer(process.execPath, ['dist/start.js'], {
          env: {
            ...LITESTREAM_ENV,
            ...replica.env,
            SQLITE_PATH: join(dir, name, 'feed.db'),
            LITESTREAM_REPLICA_URL: replica.url,
            PRIMARY_API_URL: `http://127.0.0.1:${primaryPort}`,
          },
        })

      before(async () => {
        if (everything) replica = { url: `file://${join(dir, 'replica')}`, env: {} }
        else {
          const s3 = await startS3rver(0, join(dir, 's3'))
          replica = { url: s3.url, env: s3.env, stop: s3.stop }
        }
        primaryPort = await freePort()
        nodes.push(await startPrimary())
        // Each follower restores once the primary's first snapshot is in the replica, and says so.
        nodes.push(...(await Promise.all([startFollower('b'), startFollower('c')])))
      })

      after(async () => {
        await Promise.all(nodes.map((node) => killEverything(node.child.pid!)))
        await replica?.stop?.()
        primaryDb.remove()
        rmSync(dir, { recursive: true, force: true })
      })

      for (const [i, name] of ['b', 'c'].entries()) {
        describe(`follower ${name}, fresh`, () => goldenTests(() => ({ url: url(i + 1) })))
      }

      test('a follower serves a plain file in rollback-journal mode, and writes nothing to it', () => {
        assert.match(nodes[1].output(), /is whole after [\d.]+ s; serving it/)
        const header = readFileSync(join(dir, 'b', 'feed.db')).subarray(18, 20)
        assert.deepEqual([...header], [1, 1], 'rollback-journal mode in the header')
      })

      // One like a transaction grows no file and changes no page 1 of its own: a follower's readers see it
      // only because every commit of the primary writes page 1, which tells them their cache is stale. A
      // stale cache stays stale (nothing else is written meanwhile), so the deadline only bounds the wait:
      // the lag is a second or two, and CI's loaded machine once took over 5 s over s3rver.
      test("likes on the primary, one at a time, reach the follower's reads within seconds", async (t) => {
        const lags: number[] = []
        for (let i = 0; i < 5; i++) {
          const id = 400_000 + i
          const count = async () => (await (await fetch(`${url(1)}/posts/${id}`)).json()).post.like_count
          const before = await count()
          assert.equal((await post(url(0), `/posts/${id}/like`, tokens[8800 + i].token)).status, 201)
          const start = performance.now()
          let now = before
          while (now === before && performance.now() < start + 20_000) {
            await sleep(50)
            now = await count()
          }
          lags.push(Math.round(performance.now() - start))
          assert.equal(
            now,
            before + 1,
            `post ${id}: the like on follower b after ${lags.at(-1)} ms; its log ends:\n${nodes[1].output().slice(-2000)}`,
          )
        }
        t.diagnostic(`lags: ${lags.join(', ')} ms`)
      })

      const creates = everything ? 1000 : 200
      test(`${creates.toLocaleString('en')} creates, each read right after on the follower that took it: all found, byte for byte`, async () => {
        let found = 0
        let beforeDeadline = 0
        const pairs = Array.from({ length: creates }, (_, i) => i)
        const worker = async () => {
          for (let i = pairs.shift(); i !== undefined; i = pairs.shift()) {
            const follower = url(1 + (i % 2))
            const start = performance.now()
            const res = await post(follower, '/posts', tokens[7000 + i].token, { body: `read your write ${i}` })
            if (performance.now() - start < CATCH_UP_MS) beforeDeadline++
            assert.equal(res.status, 201)
            assert.equal(res.headers.get('litestream-caught-up'), null, 'answered once the follower had it')
            const text = await res.text()
            const read = await fetch(`${follower}/posts/${JSON.parse(text).post.id}`)
            if (read.status === 200 && (await read.text()) === text) found++
          }
        }
        // Many at once: each waits for the primary's next sync (a second or a tenth of one), so they share them.
        await Promise.all(Array.from({ length: 100 }, worker))
        assert.equal(found, creates)
        // Woken when the row arrives (a watch, and a look every 250 ms), not by the deadline, which also finds it.
        assert.ok(
          beforeDeadline > creates / 2,
          `${beforeDeadline} of ${creates} answered before the ${CATCH_UP_MS} ms deadline`,
        )
      })

      if (!everything) return

      describe('follower b: the contract', () => {
        contractTests(() => ({ url: url(1), tokens: tokens.slice(2000) }), { goldens: false })
      })

      test('25 likes of one post by one user, spread over the three nodes: exactly one 201, and every node counts it', async () => {
        const counts = () =>
          Promise.all(
            [0, 1, 2].map(async (i) => (await (await fetch(`${url(i)}/posts/321321`)).json()).post.like_count),
          )
        const before = await counts()
        const results = await Promise.all(
          Array.from({ length: 25 }, (_, i) => post(url(i % 3), '/posts/321321/like', tokens[9000].token)),
        )
        assert.deepEqual(
          results.map((r) => r.status).sort((a, b) => b - a),
          [201, ...Array(24).fill(200)],
        )
        assert.deepEqual(
          await counts(),
          before.map((n) => n + 1),
        )
      })

      test('a write without a valid token is refused on the follower, nothing sent', async () => {
        await expectError(await post(url(2), '/posts', 'not.a.jwt', { body: 'x' }), 401, 'invalid or expired token')
        await expectError(await fetch(`${url(2)}/posts/1/like`, { method: 'POST' }), 401, 'missing bearer token')
      })

      // Read whole before it was forwarded, a body of any size was taken by a follower: its tokens are public.
      test('a body over 16 KB, to a like or a post, is a 413 on every node before it is read, as the primary answers', async () => {
        for (const i of [1, 2, 0]) {
          for (const path of ['/posts/5/like', '/posts']) {
            const head = `POST ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${tokens[9400].token}\r\nContent-Type: application/json\r\nContent-Length: 20000000\r\n\r\n`
            const answer = await exchange(Number(new URL(url(i)).port), `${head}{"body":"`, { timeoutMs: 3_000 })
            assert.equal(
              answer.status,
              413,
              `${path} on node ${'abc'[i]}: ${answer.raw.slice(0, 80) || 'no answer while the body was not sent'}`,
            )
            assert.equal(answer.body, '{"error":"request body must be at most 16 KB"}')
            assert.equal(answer.headers.connection, 'close')
          }
        }
      })

      test('the primary stopped: followers serve reads, writes are 503, and both work again once it is back', async () => {
        assert.equal(await within(nodes[0].stop(), 15_000, 'the primary to exit on SIGTERM'), 0)
        for (const i of [1, 2]) {
          assert.equal((await fetch(`${url(i)}/posts/1`)).status, 200)
          assert.equal((await fetch(`${url(i)}/feed`)).status, 200)
          assert.equal((await fetch(`${url(i)}/health`)).status, 200, 'a follower that can read is healthy')
          await expectError(
            await post(url(i), '/posts', tokens[9500].token, { body: 'nobody takes this' }),
            503,
            'primary is unreachable',
          )
          await expectError(await post(url(i), '/posts/5/like', tokens[9500].token), 503, 'primary is unreachable')
        }
        nodes[0] = await startPrimary()
        for (const i of [1, 2]) {
          const created = await post(url(i), '/posts', tokens[9500].token, { body: `back ${i}` })
          assert.equal(created.status, 201)
          assert.equal(created.headers.get('litestream-caught-up'), null)
          assert.equal((await post(url(i), '/posts/5/like', tokens[9501 + i].token)).status, 201)
        }
      })

      // Writes on the primary and on c, reads on c, all the while; c's every process SIGKILLed, and c
      // started again: it restores (Litestream 0.5.17 does not resume past the primary's last snapshot)
      // and has every write acknowledged anywhere.
      test('SIGKILL to a follower under load: no wrong answer, and after its restart it has every acknowledged write', async () => {
        const { acknowledged, wrong, stop } = clusterLoad(url, tokens, {
          writers: [0, 0, 1, 2, 2],
          readsOn: 2,
          timeoutMs: 10_000,
        })
        // The load runs 3 s before the kill and 1 s after it: those are its spans, not an order.
        try {
          await sleep(3_000)
          await killEverything(nodes[2].child.pid!)
        } finally {
          await sleep(1_000)
          await within(stop(), 30_000, 'the load to end')
        }
        assert.deepEqual(wrong, [])
        assert.ok(acknowledged.length > 20, `only ${acknowledged.length} writes acknowledged`)
        nodes[2] = await startFollower('c')
        assert.match(nodes[2].output(), /restoring it afresh|is whole after/)
        // A follower is about a second behind: every acknowledged write is there within a few.
        const deadline = performance.now() + 10_000
        for (const { id, text } of acknowledged) {
          let got = ''
          do got = await (await fetch(`${url(2)}/posts/${id}`)).text()
          while (got !== text && performance.now() < deadline && (await sleep(50).then(() => true)))
          assert.equal(got, text, `post ${id} on c after its restart`)
        }
        assert.equal((await post(url(2), '/posts', tokens[16_000].token, { body: 'c is back' })).status, 201)
      })

      test('a follower started while the primary is writing: it restores, serves, and catches up', async () => {
        let writing = true
        const acknowledged: string[] = []
        const stream = (async () => {
          for (let i = 0; writing; i++) {
            const res = await post(url(0), '/posts', tokens[18_000 + (i % 1000)].token, { body: `while d starts ${i}` })
            if (res.status === 201) acknowledged.push(await res.text())
            else assert.fail(`${res.status} ${await res.text()}`)
          }
        })()
        let d: Server | undefined
        // The primary writes for 500 ms before d starts and 500 ms after: spans of the writes, not an order.
        try {
          await sleep(500)
          d = await startFollower('d')
          nodes.push(d)
        } finally {
          await sleep(500)
          writing = false
          await within(stream, 15_000, 'the writes on the primary to end')
        }
        assert.ok(acknowledged.length > 20, `only ${acknowledged.length} writes on the primary`)
        // A write on d waits until d holds it, and so everything the primary committed before it.
        const created = await post(d.url, '/posts', tokens[19_000].token, { body: 'on d' })
        assert.equal(created.status, 201)
        const last = acknowledged.at(-1)!
        assert.equal(
          await (await fetch(`${d.url}/posts/${JSON.parse(last).post.id}`)).text(),
          last,
          'the last write before it, on d',
        )
      })
    },
  )
}

// A follower's writes when its primary cannot take them, without Litestream: the server alone on a
// small copy (in rollback-journal mode, as a follower's is), its primary a port nobody listens on, or
// a server that takes the connection and never answers.
describe("a follower's writes when its primary cannot take them", () => {
  const db = smallDatabase()
  const copy = new DatabaseSync(db.path)
  copy.exec('PRAGMA journal_mode = DELETE')
  copy.close()
  const silent = createServer((socket) => socket.on('error', () => {}))
  const followers: Server[] = []
  const followerOf = async (primary: string) => {
    const env = { SQLITE_PATH: db.path, PRIMARY_API_URL: primary, BUSY_TIMEOUT_MS: '100' }
    followers.push(await startServer(process.execPath, ['dist/app.js'], { env }))
    return followers.at(-1)!.url
  }
  // Each request's deadline, past the follower's own wait for its primary (FORWARD_TIMEOUT_MS, 5.1 s here).
  const deadline = () => AbortSignal.timeout(15_000)
  before(() => new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve)))
  after(async () => {
    for (const follower of followers) await within(follower.stop(), 15_000, 'a follower to exit on SIGTERM')
    silent.close()
    db.remove()
  })

  test('nobody listens: 503 primary is unreachable, and the follower serves on', async () => {
    const url = await followerOf(`http://127.0.0.1:${await freePort()}`)
    await expectError(
      await post(url, '/posts', await db.tokenFor(1), { body: 'nobody takes this' }, deadline()),
      503,
      'primary is unreachable',
    )
    const like = await post(url, '/posts/5/like', await db.tokenFor(1), undefined, deadline())
    await expectError(like, 503, 'primary is unreachable')
    assert.equal((await fetch(`${url}/posts/5`, { signal: deadline() })).status, 200)
  })

  // The wait is BUSY_TIMEOUT_MS (the primary's own wait for the write lock) and 5 s.
  test('no answer: 504 primary did not answer in time, after 5.1 s; reads are served meanwhile', async () => {
    const url = await followerOf(`http://127.0.0.1:${(silent.address() as AddressInfo).port}`)
    const started = performance.now()
    const write = post(url, '/posts', await db.tokenFor(2), { body: 'lost in the mail' })
    assert.equal((await fetch(`${url}/feed`, { signal: deadline() })).status, 200)
    await expectError(await within(write, 15_000, 'the answer to the write'), 504, 'primary did not answer in time')
    const waited = performance.now() - started
    assert.ok(waited >= 5_000 && waited < 10_000, `answered after ${waited.toFixed(0)} ms`)
  })
})
