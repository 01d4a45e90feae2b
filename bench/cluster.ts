// npm run bench -- --cluster [--quick]: what LiteFS costs and buys, on a 2-node cluster on this machine
// (node a the primary, node b a replica; test/litefs.ts). Every figure counts the LiteFS process as
// the server's: on a real box it shares the cores with the API.
//
//   1. the post statement alone: CPU per query on a plain file, on the primary's mount, on the
//      replica's, and on the primary's with 100 queries per read transaction (what the cost follows)
//   2. replication: a commit on a until b's position shows it, idle
//   3. the mix at saturation: the plain file, the LiteFS primary, the replica (its writes forwarded);
//      CPU per request = the API's + its LiteFS process's
//   4. one forwarded write: latency and CPU, on the replica and on the primary, against a write sent
//      to the primary directly
//   5. replication lag under load: likes at saturation on a; for each transaction, the time from a's
//      position showing it to b's
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { litefsBinary, startCluster, whyNoLiteFS, type LiteFSNode } from '../test/litefs.ts'
import { CACHE, cpuTicks, LOAD_CORE, log, type Seed, SERVER_CORE, startServer, TICK_US, treeCpuTicks, wrk } from './lib.ts'

const POST = `SELECT json_object('post', json_object('id', p.id, 'body', p.body, 'created_at', p.created_at,
  'author', (SELECT username FROM users AS u WHERE u.id = p.user_id),
  'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id))) AS json FROM posts AS p WHERE p.id = ?`
const randomPost = () => 1 + Math.floor(Math.random() * 500_000)
const fmt = (n: number, digits = 0) => n.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })
const at = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
// Moves a running process, every thread of it, to these cores.
const pin = (pid: number, cores: string) => execFileSync('taskset', ['-a', '-p', '-c', cores, String(pid)], { stdio: 'ignore' })

export async function clusterBench({ seed, quick, flags }: { seed: Seed; quick: boolean; flags: string[] }) {
  const why = whyNoLiteFS()
  if (why) throw new Error(`--cluster needs LiteFS: ${why}`)
  const measureS = quick ? 3 : 10
  const warmupS = quick ? 1 : 2
  const report: Record<string, unknown> = {}
  log('bench: starting a 2-node LiteFS cluster and importing the seed')
  const cluster = await startCluster({ nodes: 2, seed: seed.db })
  const [a, b] = cluster.nodes
  const plainDir = join(CACHE, `cluster-plain-${process.pid}`)
  mkdirSync(plainDir, { recursive: true })
  const plain = join(plainDir, 'feed.db')
  copyFileSync(seed.db, plain)
  try {
    const version = execFileSync(litefsBinary()!, ['version'], { encoding: 'utf8' }).split(',')[0]
    console.log(`cluster: ${version}, 2 nodes; the measured node's API and LiteFS on core ${SERVER_CORE}, wrk and the other node on core ${LOAD_CORE}`)

    // 1. The statement alone, in this process on the server core.
    pin(process.pid, SERVER_CORE)
    const queries = quick ? 5_000 : 20_000
    const statement = (path: string, node: LiteFSNode | undefined, perTransaction = 1) => {
      if (node) pin(node.pid(), SERVER_CORE)
      const db = new DatabaseSync(path, { readOnly: !!node && node !== a })
      const get = db.prepare(POST)
      for (let i = 0; i < queries / 5; i++) get.get(randomPost())
      const cpu = process.cpuUsage()
      const ticks = node ? cpuTicks(node.pid()).total : 0
      for (let i = 0; i < queries; i += perTransaction) {
        if (perTransaction > 1) db.exec('BEGIN')
        for (let j = 0; j < perTransaction; j++) get.get(randomPost())
        if (perTransaction > 1) db.exec('COMMIT')
      }
      const { user, system } = process.cpuUsage(cpu)
      db.close()
      return { node_us: (user + system) / queries, litefs_us: node ? ((cpuTicks(node.pid()).total - ticks) * TICK_US) / queries : 0 }
    }
    const statements = {
      plain: statement(plain, undefined),
      primary: statement(a.dbPath, a),
      replica: statement(b.dbPath, b),
      'primary, 100 per read transaction': statement(a.dbPath, a, 100),
    }
    report.statement = statements
    console.log('\n1. the post statement alone, CPU per query (us)')
    for (const [name, s] of Object.entries(statements)) console.log(`   ${name.padEnd(36)} node ${fmt(s.node_us, 1).padStart(6)}  litefs ${fmt(s.litefs_us, 1).padStart(6)}  total ${fmt(s.node_us + s.litefs_us, 1).padStart(6)}`)

    // 2. Replication, idle: one row a commit, on a's mount, until b's position has it.
    pin(process.pid, LOAD_CORE)
    const writer = new DatabaseSync(a.dbPath)
    const like = writer.prepare('INSERT OR IGNORE INTO likes (user_id, post_id) VALUES (?, ?)')
    const lags: number[] = []
    for (let i = 0; i < (quick ? 100 : 300); i++) {
      like.run(1 + (i % 20_000), randomPost())
      const committed = performance.now()
      const target = a.position().slice(0, 16)
      while (b.position().slice(0, 16) < target) {} // spins: the figure is milliseconds
      lags.push(performance.now() - committed)
      await sleep(5)
    }
    writer.close()
    lags.sort((x, y) => x - y)
    report.replication_idle_ms = { p50: at(lags, 0.5), p90: at(lags, 0.9), p99: at(lags, 0.99) }
    console.log(`\n2. replication a -> b, idle: p50 ${fmt(at(lags, 0.5), 2)} ms, p90 ${fmt(at(lags, 0.9), 2)} ms, p99 ${fmt(at(lags, 0.99), 2)} ms (${lags.length} commits)`)

    // 3. The mix at saturation. The measured node's API and LiteFS on the server core.
    const api = (path: string, cores = SERVER_CORE) =>
      startServer(join(import.meta.dirname, '..', 'dist', 'app.js'), { flags, env: { SQLITE_PATH: path } }).then((server) => (pin(server.pid, cores), server))
    const saturate = async (url: string, kind: string, pids: () => number[]) => {
      await wrk(url, kind, warmupS, seed.tokens)
      const before = pids().reduce((sum, pid) => sum + treeCpuTicks(pid), 0)
      const result = await wrk(url, kind, measureS, seed.tokens)
      const cpu = (pids().reduce((sum, pid) => sum + treeCpuTicks(pid), 0) - before) * TICK_US
      // A socket error here is mostly a request wrk gave up on after its 2 s timeout.
      const example = result.bad_example || (result.socket_errors ? `${result.socket_errors} socket errors or timeouts (over 2 s)` : '')
      return { rps: result.requests / (result.duration_us / 1e6), cpu_us: cpu / result.requests, p50_ms: result.p50_us / 1000, p99_ms: result.p99_us / 1000, errors: result.bad + result.socket_errors, example }
    }
    const mix: Record<string, Awaited<ReturnType<typeof saturate>>> = {}
    // The API's port must be the one the lease names for the replica's writes to reach it.
    const apiOn = (node: LiteFSNode, cores: string) =>
      startServer(join(import.meta.dirname, '..', 'dist', 'app.js'), { flags, env: { SQLITE_PATH: node.dbPath, PORT: String(node.apiPort) } }).then((server) => (pin(server.pid, cores), server))

    let server = await api(plain)
    mix['plain file'] = await saturate(server.url, 'mix', () => [server.pid])
    await server.stop()
    pin(a.pid(), SERVER_CORE)
    pin(b.pid(), LOAD_CORE)
    const primaryApi = await apiOn(a, SERVER_CORE)
    mix['LiteFS primary'] = await saturate(primaryApi.url, 'mix', () => [primaryApi.pid, a.pid()])
    pin(primaryApi.pid, LOAD_CORE)
    pin(a.pid(), LOAD_CORE)
    pin(b.pid(), SERVER_CORE)
    const replicaApi = await apiOn(b, SERVER_CORE)
    mix['LiteFS replica'] = await saturate(replicaApi.url, 'mix', () => [replicaApi.pid, b.pid()])
    report.mix = mix
    console.log('\n3. the mix at saturation (CPU per request counts the node\'s LiteFS process)')
    console.log(`   ${'where'.padEnd(16)} ${'req/s'.padStart(7)} ${'CPU us/req'.padStart(11)} ${'x plain'.padStart(8)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} errors`)
    for (const [name, r] of Object.entries(mix)) {
      console.log(`   ${name.padEnd(16)} ${fmt(r.rps).padStart(7)} ${fmt(r.cpu_us, 1).padStart(11)} ${fmt(r.cpu_us / mix['plain file'].cpu_us, 2).padStart(8)} ${fmt(r.p50_ms, 2).padStart(7)} ${fmt(r.p99_ms, 2).padStart(7)} ${r.errors}${r.example ? ` e.g. ${r.example}` : ''}`)
    }

    // 4. One write at a time: a like sent to the replica (forwarded) and one sent to the primary.
    const tokens = readFileSync(seed.tokens, 'utf8').trim().split('\n')
    const oneAtATime = async (url: string, pids: () => number[]) => {
      const count = quick ? 200 : 1_000
      const latencies: number[] = []
      const before = pids().map((pid) => treeCpuTicks(pid))
      for (let i = 0; i < count; i++) {
        const started = performance.now()
        const res = await fetch(`${url}/posts/${randomPost()}/like`, { method: 'POST', headers: { authorization: `Bearer ${tokens[i % tokens.length]}` } })
        await res.arrayBuffer()
        if (res.status !== 201 && res.status !== 200) throw new Error(`a like answered ${res.status}`)
        latencies.push(performance.now() - started)
      }
      const cpu = pids().map((pid, i) => ((treeCpuTicks(pid) - before[i]) * TICK_US) / count)
      latencies.sort((x, y) => x - y)
      return { p50_ms: at(latencies, 0.5), p99_ms: at(latencies, 0.99), cpu_us: cpu }
    }
    const pids = () => [replicaApi.pid, b.pid(), primaryApi.pid, a.pid()]
    const forwarded = await oneAtATime(replicaApi.url, pids)
    const direct = await oneAtATime(primaryApi.url, pids)
    report.write = { forwarded, direct }
    console.log('\n4. one like at a time (CPU us per write: replica API, replica LiteFS, primary API, primary LiteFS)')
    for (const [name, r] of Object.entries({ 'to the replica': forwarded, 'to the primary': direct })) {
      console.log(`   ${name.padEnd(16)} p50 ${fmt(r.p50_ms, 2)} ms, p99 ${fmt(r.p99_ms, 2)} ms; CPU ${r.cpu_us.map((x) => fmt(x)).join(' + ')} = ${fmt(r.cpu_us.reduce((x, y) => x + y))} us`)
    }
    await replicaApi.stop()

    // 5. Replication lag under load: likes at saturation on the primary; this process samples both
    // positions on the load core.
    pin(primaryApi.pid, SERVER_CORE)
    pin(a.pid(), SERVER_CORE)
    pin(b.pid(), LOAD_CORE)
    const seenOnA = new Map<string, number>()
    const behind: number[] = []
    let sampling = true
    const sampler = (async () => {
      const pending: [string, number][] = []
      while (sampling) {
        const now = performance.now()
        const txA = a.position().slice(0, 16)
        if (txA && !seenOnA.has(txA)) (seenOnA.set(txA, now), pending.push([txA, now]))
        const txB = b.position().slice(0, 16)
        while (pending.length && pending[0][0] <= txB) behind.push(now - pending.shift()![1])
        await sleep(1)
      }
    })()
    const likes = await saturate(primaryApi.url, 'like', () => [primaryApi.pid, a.pid()])
    sampling = false
    await sampler
    behind.sort((x, y) => x - y)
    report.replication_under_load = { likes_per_s: likes.rps, transactions: behind.length, p50_ms: at(behind, 0.5), p99_ms: at(behind, 0.99), max_ms: behind.at(-1), errors: likes.errors, example: likes.example }
    console.log(`\n5. replication lag with likes at saturation on the primary (${fmt(likes.rps)} likes/s, ${fmt(behind.length)} transactions seen): ` +
      `p50 ${fmt(at(behind, 0.5), 1)} ms, p99 ${fmt(at(behind, 0.99), 1)} ms, max ${fmt(behind.at(-1) ?? NaN, 1)} ms (sampled every ~1 ms)` +
      (likes.errors ? `; ${likes.errors} bad responses, e.g. ${likes.example}` : ''))
    await primaryApi.stop()
    const errors = Object.values(mix).reduce((sum, r) => sum + r.errors, 0) + likes.errors
    return { report, errors }
  } finally {
    await cluster.stop()
    rmSync(plainDir, { recursive: true, force: true })
  }
}
