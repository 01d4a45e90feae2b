// Read replicas on a real LiteFS cluster on this machine: node a holds the static lease, b and c
// replicate it, each with the built dist/app.js on its own mount. The seed is imported once.
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe, test } from 'node:test'
import { contractTests, goldenTests } from './contract.ts'
import { claims, clusterLoad, freePort, makeToken, post, ROOT, startServer, until, waitHealthy, type Server, type Token } from './helpers.ts'
import { caughtUpWith, litefsBinary, startCluster, whyNoLiteFS, type Cluster, type LiteFSNode } from './litefs.ts'

const skip = whyNoLiteFS()
const seed = process.env.TEST_SEED_DB ?? ''
const tokens: Token[] = skip ? [] : JSON.parse(readFileSync(join(dirname(seed), 'tokens.json'), 'utf8'))

let cluster: Cluster
const apis: Server[] = []
const url = (i: number) => apis[i].url
const startApi = (node: LiteFSNode) =>
  startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: node.dbPath, PORT: String(node.apiPort), JWT_SECRET: 'twelve-dollar-challenge' } })

async function expectError(res: Response, status: number, message: string) {
  assert.equal(res.status, status)
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
  assert.equal(await res.text(), `{"error":"${message}"}`)
}

describe('a LiteFS cluster: node a primary, b and c replicas', { skip }, () => {
  before(async () => {
    cluster = await startCluster({ nodes: 3, seed })
    for (const node of cluster.nodes) apis.push(await startApi(node))
  })

  after(async () => {
    await Promise.all(apis.map((api) => api.stop('SIGKILL')))
    await cluster?.stop()
  })

  // Every node's goldens before any write, then the rest of the contract on each, with its own users.
  for (const [i, name] of ['a', 'b', 'c'].entries()) {
    describe(`node ${name}, fresh`, () => goldenTests(() => ({ url: url(i) })))
  }
  for (const [i, name] of ['a', 'b', 'c'].entries()) {
    describe(`node ${name}${i ? ', a replica' : ', the primary'}: the contract`, () => {
      contractTests(() => ({ url: url(i), tokens: tokens.slice(i * 2000) }), { goldens: false })
    })
  }

  describe('writes on a replica', () => {
    test('are forwarded to the primary and answered with its transaction', async () => {
      const res = await post(url(1), '/posts', tokens[6000].token, { body: 'forwarded' })
      assert.equal(res.status, 201)
      assert.match(res.headers.get('litefs-txid') ?? '', /^[0-9a-f]{16}$/)
      const { post: created } = await res.json()
      assert.equal(created.author, tokens[6000].username)
      assert.equal((await fetch(`${url(0)}/posts/${created.id}`)).status, 200, 'the primary has it')
    })

    test('1,000 creates, each read right after on the replica that took it: all found, byte for byte', async () => {
      let found = 0
      const pairs = Array.from({ length: 1000 }, (_, i) => i)
      const worker = async () => {
        for (let i = pairs.shift(); i !== undefined; i = pairs.shift()) {
          const replica = url(1 + (i % 2))
          const res = await post(replica, '/posts', tokens[7000 + i].token, { body: `read your write ${i}` })
          assert.equal(res.status, 201)
          const text = await res.text()
          const read = await fetch(`${replica}/posts/${JSON.parse(text).post.id}`)
          if (read.status === 200 && (await read.text()) === text) found++
        }
      }
      await Promise.all(Array.from({ length: 8 }, worker))
      assert.equal(found, 1000)
    })

    test('25 likes of one post by one user, spread over the three nodes: exactly one 201', async () => {
      const like = () => Promise.all([0, 1, 2].map(async (i) => (await fetch(`${url(i)}/posts/321321`)).json()))
      const before = (await like()).map((r) => r.post.like_count)
      const results = await Promise.all(Array.from({ length: 25 }, (_, i) => post(url(i % 3), '/posts/321321/like', tokens[9000].token)))
      assert.deepEqual(results.map((r) => r.status).sort((a, b) => b - a), [201, ...Array(24).fill(200)])
      // Each answer came after its node caught up, so every node counts the one like already.
      assert.deepEqual((await like()).map((r) => r.post.like_count), before.map((n) => n + 1))
    })

    test('are refused unread without a valid token: the replica checks it before forwarding', async () => {
      await expectError(await post(url(2), '/posts', 'not.a.jwt', { body: 'x' }), 401, 'invalid or expired token')
      await expectError(await fetch(`${url(2)}/posts/1/like`, { method: 'POST' }), 401, 'missing bearer token')
    })
  })

  describe("the primary's API stopped", () => {
    test('replicas keep serving reads, writes are 503, and both work again when it is back', async () => {
      await apis[0].stop()
      for (const i of [1, 2]) {
        assert.equal((await fetch(`${url(i)}/posts/1`)).status, 200)
        assert.equal((await fetch(`${url(i)}/feed`)).status, 200)
        assert.equal((await fetch(`${url(i)}/health`)).status, 200, 'a replica that can read is healthy')
        await expectError(await post(url(i), '/posts', tokens[9500].token, { body: 'nobody takes this' }), 503, 'primary is unreachable')
        await expectError(await post(url(i), '/posts/5/like', tokens[9500].token), 503, 'primary is unreachable')
      }
      apis[0] = await startApi(cluster.nodes[0])
      for (const i of [1, 2]) {
        assert.equal((await post(url(i), '/posts', tokens[9500].token, { body: `back ${i}` })).status, 201)
        assert.equal((await post(url(i), '/posts/5/like', tokens[9501 + i].token)).status, 201)
      }
    })
  })

  // SQLite maps the WAL index (`-shm`) into memory from the mount; once LiteFS is gone, a read of it
  // is either a SIGBUS, which no process can answer from (the API ends, as it would under LiteFS's
  // `exec`, and comes back with LiteFS), or SQLite's locks fail and the API answers 503 (after SQLite
  // has retried them for about 10 s: the load gives up on a request after 5). A write forwarded
  // meanwhile may get a 504: the primary was too slow to say whether it committed.
  describe("SIGKILL to a replica's LiteFS under load", () => {
    test('its API never answers wrongly, no acknowledged write is lost, and the node catches up after a restart', async () => {
      const [, , c] = cluster.nodes
      const { acknowledged, wrong, stop } = clusterLoad(url, tokens, {
        writers: [0, 1, 2, 2], readsOn: 2, timeoutMs: 5_000, allowed: (status, node) => status === 503 || (node > 0 && status === 504),
      })
      try {
        await new Promise((resolve) => setTimeout(resolve, 500))
        await c.kill('SIGKILL')
        await new Promise((resolve) => setTimeout(resolve, 500))
        const health = await fetch(`${url(2)}/health`).catch(() => undefined)
        if (health) assert.equal(health.status, 503, 'c is still up: it says the database is unavailable')
        else assert.equal(apis[2].child.signalCode, 'SIGBUS')
      } finally {
        await stop()
      }
      assert.deepEqual(wrong, [])
      assert.ok(acknowledged.length > 20, `only ${acknowledged.length} writes acknowledged`)

      // Nothing acknowledged is missing on the primary.
      for (const { id, text } of acknowledged) assert.equal(await (await fetch(`${url(0)}/posts/${id}`)).text(), text)

      // LiteFS and then the API start again, and the node catches up.
      await apis[2].stop('SIGKILL')
      await c.restart()
      await caughtUpWith(c, cluster.nodes[0].position(), 30_000)
      apis[2] = await startApi(c)
      for (const { id, text } of acknowledged) assert.equal(await (await fetch(`${url(2)}/posts/${id}`)).text(), text)
      assert.equal((await post(url(2), '/posts', tokens[16_000].token, { body: 'c is back' })).status, 201)
    })
  })
  // Last: the cluster does not come back from this within the suite.
  describe("the primary's LiteFS stopped", () => {
    test('a replica, cut off, keeps serving reads and refuses writes without trying its own file', async () => {
      const [a, b] = cluster.nodes
      await a.kill('SIGTERM')
      // The replica notices when its stream ends, and takes .primary away.
      for (let i = 0; i < 100 && existsSync(join(b.mount, '.primary')); i++) await new Promise((resolve) => setTimeout(resolve, 50))
      await expectError(await post(url(1), '/posts', tokens[17_000].token, { body: 'no primary' }), 503, 'primary is unreachable')
      await expectError(await post(url(1), '/posts/9/like', tokens[17_000].token), 503, 'primary is unreachable')
      assert.equal((await fetch(`${url(1)}/posts/9`)).status, 200)
      assert.equal((await fetch(`${url(1)}/health`)).status, 200)
      assert.doesNotMatch(b.log(), /read only replica/, 'LiteFS saw a write on the replica')
    })
  })
})

// A new replica gets the whole database as one snapshot, and LiteFS holds the file's locks while it
// writes it: an API started the moment the file shows waits for them, and never writes to the file.
describe('a new replica: the API started while LiteFS writes the database into it', { skip }, () => {
  let fresh: Cluster
  const started: Server[] = []
  after(async () => {
    await Promise.all(started.map((api) => api.stop('SIGKILL')))
    await fresh?.stop()
  })

  test('waits for the copy, is healthy, serves reads and forwarded writes; then 20 restarts under writes on the primary', async (t) => {
    fresh = await startCluster({ nodes: 2, seed, unstarted: 1 })
    const [a, b] = fresh.nodes
    const primary = await startApi(a)
    started.push(primary)
    const joining = b.restart()
    joining.catch(() => {}) // awaited below; a start that fails first must not leave it unhandled
    await until(() => existsSync(b.dbPath), 30_000, "the database on the new replica's mount")
    const shownAt = performance.now()
    let replica = await startApi(b)
    started.push(replica)
    await waitHealthy(replica.url, 30_000)
    await joining
    t.diagnostic(`healthy ${((performance.now() - shownAt) / 1000).toFixed(1)} s after the database showed`)
    assert.match(replica.output(), /is locked by another process .* waiting up to/, 'the start waited for the copy, and said so')
    assert.equal(await (await fetch(`${replica.url}/posts/1`)).text(), readFileSync(join(ROOT, 'test', 'golden', 'post-1.json'), 'utf8'))
    assert.equal((await post(replica.url, '/posts/1/like', tokens[18_000].token)).status, 201)

    // A steady stream of likes on the primary meanwhile, each a transaction LiteFS sends the replica.
    let writing = true
    let likes = 0
    const failed: string[] = []
    const stream = (async () => {
      for (let i = 0; writing; i++) {
        const res = await post(primary.url, `/posts/${1 + ((i * 7919) % 500_000)}/like`, tokens[18_001 + (i % 1000)].token)
        if (res.status === 201 || res.status === 200) likes++
        else failed.push(`${res.status} ${await res.text()}`)
        await res.arrayBuffer().catch(() => {})
      }
    })()
    try {
      for (let restart = 1; restart <= 20; restart++) {
        assert.equal(await replica.stop(), 0)
        started.pop()
        replica = await startApi(b)
        started.push(replica)
        await waitHealthy(replica.url, 30_000)
        assert.equal((await fetch(`${replica.url}/feed`)).status, 200, `restart ${restart}: the feed`)
        const forwarded = await post(replica.url, '/posts', tokens[19_000 + restart].token, { body: `restart ${restart}` })
        assert.equal(forwarded.status, 201, `restart ${restart}: a forwarded write: ${await forwarded.text()}`)
      }
    } finally {
      writing = false
      await stream
    }
    t.diagnostic(`${likes} likes on the primary during the 20 restarts`)
    assert.deepEqual(failed, [])
    assert.ok(likes > 100, `only ${likes} likes on the primary`)
    assert.doesNotMatch(b.log(), /read only replica/, 'the replica saw a write to its file')
  })
})

// The litefs.yml the README and the container use, with the real binary: each node's LiteFS runs the
// API as its child, a replica forwards a write, and SIGTERM to LiteFS stops both cleanly.
describe('the shipped litefs.yml: LiteFS runs the API', { skip }, () => {
  const nodes: Server[] = []
  const dir = mkdtempSync(join(tmpdir(), 'litefs-yml-'))
  after(async () => {
    // SIGTERM reaches the API through LiteFS; SIGKILL would leave the API behind, orphaned.
    for (const node of nodes) {
      const late = setTimeout(() => node.child.kill('SIGKILL'), 10_000)
      await node.stop('SIGTERM')
      clearTimeout(late)
    }
    for (const name of ['a', 'b']) spawnSync('fusermount3', ['-uz', join(dir, name, 'mnt')])
    rmSync(dir, { recursive: true, force: true })
  })

  test('a primary and a replica from one file: a write on the replica, read there; SIGTERM stops each, exit 0', async () => {
    const [apiA, apiB, fsA, fsB] = await Promise.all([freePort(), freePort(), freePort(), freePort()])
    const node = (name: string, primary: boolean, api: number, litefs: number) =>
      startServer(litefsBinary()!, ['mount', '-config', join(ROOT, 'litefs.yml')], {
        env: {
          IS_PRIMARY: String(primary), PRIMARY_HOSTNAME: `127.0.0.1:${apiA}`, PRIMARY_URL: `http://127.0.0.1:${fsA}`,
          LITEFS_DIR: join(dir, name, 'mnt'), LITEFS_DATA: join(dir, name, 'data'), LITEFS_ADDR: `127.0.0.1:${litefs}`,
          SQLITE_PATH: join(dir, name, 'mnt', 'feed.db'), PORT: String(api), JWT_SECRET: 'twelve-dollar-challenge',
        },
      })
    nodes.push(await node('a', true, apiA, fsA))
    // The API made the database with empty tables; the user who posts comes through the primary.
    const primary = new DatabaseSync(join(dir, 'a', 'mnt', 'feed.db'))
    primary.exec("INSERT INTO users (id, username) VALUES (1, 'user_1')")
    primary.close()
    nodes.push(await node('b', false, apiB, fsB))
    const res = await post(nodes[1].url, '/posts', await makeToken(claims('1', 'user_1')), { body: 'through the replica' })
    assert.equal(res.status, 201)
    const { post: created } = await res.json()
    assert.equal(created.body, 'through the replica')
    assert.equal((await (await fetch(`${nodes[1].url}/posts/${created.id}`)).json()).post.id, created.id)
    for (const server of [...nodes].reverse()) assert.equal(await server.stop('SIGTERM'), 0)
  })
})
