// npm run bench: what the challenge scores, on one core of this machine, against the Node ceiling
// measured in the same run. See bench/README.md for how to read it.
//
//   npm run bench [-- --quick] [--only feed,mix] [--hold 5m] [--connections 15000] [--workers 1] [--record]
//                    [--rounds 3] [--against <git ref>] [--flags=<node flags>] [--against-flags=<node flags>]
//                    [--against-node <version>] [--replicate [--sync-wait] [--s3]]
//   npm run bench -- --box [--rounds 3]       one box: the mix and the write ceiling, one process on one
//                                             core against WORKERS=2 on both
//   npm run bench -- --cluster [--quick]      Litestream followers: a primary and a follower (bench/cluster.ts)
//   npm run bench -- --score [--full]         the challenge's score in the box's limits (bench/score.ts)
//   npm run bench -- --score --full --confirm-from <users>   only its warm-up and confirmation, from there down
//   npm run bench -- --score --k6 <k6 binary> its users generator against the real k6, at 10,000 users
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs'
import { cpus, release, totalmem } from 'node:os'
import { basename, dirname, join } from 'node:path'
import { parseArgs } from 'node:util'
import { renderChart } from './chart.ts'
import { CACHE, cpuTicks, ensureTools, LITESTREAM, LOAD_CORE, log, memoryCgroup, nodeRelease, REPLICA_URL, RESULTS, ROOT, seededDatabase, SERVER_CORE, sh, shippedNodeFlags, startS3rver, startServer, TICK_US, treeCpuTicks, treeMemoryKb, usersGenerator, wrk, WORKDIR, type Seed, type Server } from './lib.ts'

const USER_RATE = 0.106 // requests a second per user, the k6 loop's average
// New users a second while the users connect: k6 ramps to any level in 60 s, which is 1,667 a second
// at 100,000 users; an instant flood of connections would only measure the listen queue.
const ARRIVALS_PER_S = 2_000

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    hold: { type: 'string' },
    connections: { type: 'string' },
    record: { type: 'boolean', default: false },
    rounds: { type: 'string', default: '1' },
    against: { type: 'string' },
    flags: { type: 'string' },
    workers: { type: 'string', default: '0' }, // as shipped: one process, more only past its open-file limit
    'against-flags': { type: 'string' },
    'against-node': { type: 'string' },
    box: { type: 'boolean', default: false },
    cluster: { type: 'boolean', default: false },
    instructions: { type: 'boolean', default: false },
    check: { type: 'boolean', default: false },
    replicate: { type: 'boolean', default: false },
    'sync-wait': { type: 'boolean', default: false },
    s3: { type: 'boolean', default: false },
    score: { type: 'boolean', default: false },
    full: { type: 'boolean', default: false },
    'confirm-from': { type: 'string' },
    k6: { type: 'string' },
    floor: { type: 'boolean', default: false },
    together: { type: 'boolean', default: false },
    n: { type: 'string' },
  },
})

const ENDPOINTS = ['ceiling', 'feed', 'post', 'like', 'create', 'mix'] as const
type Endpoint = (typeof ENDPOINTS)[number]
const LABEL: Record<Endpoint, string> = {
  ceiling: 'ceiling: node:http, constant feed body',
  feed: 'GET /feed',
  post: 'GET /posts/:id',
  like: 'POST /posts/:id/like',
  create: 'POST /posts',
  mix: 'mix (k6 proportions)',
}
const only = args.only ? (args.only.split(',') as Endpoint[]) : args.box ? ['mix', 'like', 'create'] as Endpoint[] : [...ENDPOINTS]
for (const e of only) if (!ENDPOINTS.includes(e)) throw new Error(`--only takes ${ENDPOINTS.join(', ')}, not ${e}`)
if (!only.includes('ceiling')) only.unshift('ceiling') // every figure is read against it
const QUICK = args.quick
const WARMUP_S = QUICK ? 1 : 2
const MEASURE_S = QUICK ? 3 : 10
const CONNECTIONS = Number(args.connections ?? (QUICK ? 2_000 : 15_000))
const HOLD_S = parseDuration(args.hold ?? (QUICK ? '15s' : '60s'))
const ROUNDS = Number(args.rounds)
const color = (code: number) => (text: string) => (process.stdout.isTTY ? `\x1b[${code}m${text}\x1b[0m` : text)
const red = color(31)
const green = color(32)
const yellow = color(33)

function parseDuration(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(s|m)?$/.exec(text)
  if (!match) throw new Error(`a duration is like 60s or 5m, not ${text}`)
  return Number(match[1]) * (match[2] === 'm' ? 60 : 1)
}

// workers, cores and env, when given, override --workers, the server core and the server's environment.
type Variant = { name: string; app: string; flags: string[]; commit: string; node: string; workers?: string; cores?: string; env?: Record<string, string> }

// The commit measured, +dirty when tracked files differ from it (but for the two that --record writes).
function commitOf(dir: string) {
  const sha = sh('git', ['rev-parse', '--short', 'HEAD'], dir)
  const changed = sh('git', ['status', '--porcelain', '--untracked-files=no', '--', '.', ':!BENCHMARKS.md', ':!bench/chart.svg'], dir)
  return changed ? `${sha}+dirty` : sha
}

// The other build for --against: a worktree of that ref, installed and built, reused while the ref is.
function buildAgainst(ref: string): string {
  const sha = sh('git', ['rev-parse', ref])
  const dir = join(CACHE, `against-${sha.slice(0, 12)}`)
  if (!existsSync(join(dir, 'dist', 'app.js'))) {
    log(`bench: building ${ref} (${sha.slice(0, 8)}) in ${dir}`)
    rmSync(dir, { recursive: true, force: true })
    spawnSync('git', ['worktree', 'prune'], { cwd: ROOT })
    sh('git', ['worktree', 'add', '--detach', dir, sha])
    execFileSync('npm', ['ci', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: dir, stdio: 'ignore' })
    execFileSync(process.execPath, ['build.mjs'], { cwd: dir, stdio: 'ignore' })
  }
  return join(dir, 'dist', 'app.js')
}

type Saturation = {
  endpoint: Endpoint; variant: string; rps: number; p50_ms: number; p99_ms: number; errors: number; error_example: string
  cpu_us: number; litestream_cpu_us: number; replica_behind_ms: number; server_cpu: number; load_cpu: number; peak_rss_mb: number
}

// With --s3, the replicas are in s3rver, on the load core; started once, on the first replicated start.
let s3: Awaited<ReturnType<typeof startS3rver>> | undefined
const S3_OBJECTS = join(WORKDIR, 's3rver')

// A replicated variant replicates to a folder in its own workdir, or to a prefix of its own in s3rver;
// either starts empty.
async function replicaFor(workdir: string): Promise<Record<string, string>> {
  if (!args.s3) return { LITESTREAM_REPLICA_URL: `file://${join(workdir, 'replica')}` }
  s3 ??= await startS3rver(0, S3_OBJECTS, LOAD_CORE)
  rmSync(join(S3_OBJECTS, 'feed', basename(workdir)), { recursive: true, force: true })
  return { LITESTREAM_REPLICA_URL: `s3://feed/${basename(workdir)}/feed.db`, ...s3.env }
}

const serve = async (variant: Variant | 'ceiling', seed: Seed, cgroup?: string, host = '127.0.0.1', workdir = WORKDIR) =>
  variant === 'ceiling'
    ? startServer(join(ROOT, 'bench', 'ceiling.ts'), { cgroup })
    : startServer(variant.app, {
      node: variant.node, flags: variant.flags, seed, cgroup, cores: variant.cores, workdir,
      env: { WORKERS: variant.workers ?? args.workers, HOST: host, ...variant.env, ...(isReplicated(variant) && await replicaFor(workdir)) },
    })

// Replicated, the process started is Litestream, and the server its child.
const isReplicated = (variant: Variant | 'ceiling') => variant !== 'ceiling' && !!variant.env?.LITESTREAM_REPLICA_URL

// Nothing is measured before Litestream has sent its first snapshot of the whole file, and made its
// first level-1 compaction (every 30 s by the clock), which reads that whole snapshot once again. Both
// come once after a start; measured, they would weigh on 10 s as they never do on a box that runs.
// --quick, a smoke test, waits for the snapshot only.
async function firstSnapshot(server: Server) {
  const ready = QUICK ? /snapshot complete/ : /snapshot complete[^]*compaction complete.*level=1/
  for (const deadline = performance.now() + 60_000; !ready.test(server.stdout()); ) {
    if (performance.now() > deadline) throw new Error(`no first snapshot and compaction from Litestream within 60 s:\n${server.stdout().slice(-2000)}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

async function saturate(variant: Variant | 'ceiling', endpoint: Endpoint, seed: Seed, cgroup?: string): Promise<Saturation> {
  const [result] = await saturateTogether([variant], endpoint, seed, cgroup, WORKDIR)
  return result
}

// --together: the variants at the same time on the same core, each with a wrk of its own, so that the
// machine's drift hits all of them at once. Each server has about its share of the core.
async function saturateTogether(variants: (Variant | 'ceiling')[], endpoint: Endpoint, seed: Seed, cgroup?: string, workdir?: string): Promise<Saturation[]> {
  const servers = await Promise.all(variants.map((variant, i) => serve(variant, seed, cgroup, undefined, workdir ?? join(WORKDIR, `together-${i}`))))
  try {
    await Promise.all(servers.map((server, i) => isReplicated(variants[i]) && firstSnapshot(server)))
    await Promise.all(servers.map((server) => wrk(server.url, endpoint, WARMUP_S, seed.tokens)))
    const ticks = servers.map((server) => treeCpuTicks(server.pid))
    const litestreamTicks = servers.map((server, i) => (isReplicated(variants[i]) ? cpuTicks(server.pid).total : 0))
    const lags = servers.map((server, i) => (isReplicated(variants[i]) ? followLag(server.url) : undefined))
    const started = performance.now()
    const results = await Promise.all(servers.map((server) => wrk(server.url, endpoint, MEASURE_S, seed.tokens)))
    const wall = performance.now() - started
    return await Promise.all(results.map(async (result, i) => {
      const litestreamUs = isReplicated(variants[i]) ? (cpuTicks(servers[i].pid).total - litestreamTicks[i]) * TICK_US : 0
      const sample = saturation(variants[i], endpoint, result, (treeCpuTicks(servers[i].pid) - ticks[i]) * TICK_US, wall, litestreamUs, servers[i].pid)
      return { ...sample, replica_behind_ms: (await lags[i]?.stop()) ?? 0 }
    }))
  } finally {
    await Promise.all(servers.map((server) => server.stop()))
  }
}

// How far behind the replica fell, at most, by /health once a second until stop().
function followLag(url: string) {
  let worst = 0
  let running = true
  const following = (async () => {
    while (running) {
      const health = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) }).then((res) => res.json(), () => undefined)
      worst = Math.max(worst, health?.replica?.behind_ms ?? 0)
      await new Promise((resolve) => setTimeout(resolve, 1_000))
    }
  })()
  return {
    stop: async () => {
      running = false
      await following
      return worst
    },
  }
}

function saturation(variant: Variant | 'ceiling', endpoint: Endpoint, result: Awaited<ReturnType<typeof wrk>>, cpuUs: number, wall: number, litestreamUs: number, pid: number): Saturation {
  return {
    endpoint,
    variant: variant === 'ceiling' ? 'ceiling' : variant.name,
    rps: result.requests / (result.duration_us / 1e6),
    p50_ms: result.p50_us / 1000,
    p99_ms: result.p99_us / 1000,
    errors: result.bad + result.socket_errors,
    error_example: result.bad_example,
    cpu_us: cpuUs / result.requests,
    litestream_cpu_us: litestreamUs / result.requests,
    replica_behind_ms: 0,
    server_cpu: cpuUs / (wall * 1000),
    load_cpu: result.loadCpu,
    peak_rss_mb: treeMemoryKb(pid, 'VmHWM') / 1024,
  }
}

type Hold = {
  connections: number; rate: number; seconds: number; sent: number; answered: number; errors: number; error_example: string
  connect_failed: number; p50_ms: number; p95_ms: number; p99_ms: number; max_ms: number
  rss_base_mb: number; rss_idle_mb: number; rss_peak_mb: number; kb_per_idle_connection: number
  cpu_us: number; generator_cpu: number; pass: boolean
}

// One users generator (bench/users.ts) on the load core.
const generator = (url: string, connections: number, tokens: string, latencies: string) =>
  usersGenerator({ url, connections, tokens, latencies, idle: 5, hold: HOLD_S, ramp: CONNECTIONS / ARRIVALS_PER_S })

// N users on N keep-alive connections, each running the k6 loop (N x 0.106 requests a second).
// One process of ours may hold about 19,900 connections here, and one client address may open about
// 28,000 to one server address and port: past 18,000 users, several generators share them, each to
// its own loopback address of the server (127.0.0.1, .2, ...; binding the clients instead makes the
// kernel's search for a free port slower with every connection).
async function holdUsers(variant: Variant, seed: Seed, cgroup?: string): Promise<Hold> {
  const count = Math.ceil(CONNECTIONS / 18_000)
  const server = await serve(variant, seed, cgroup, count > 1 ? '0.0.0.0' : '127.0.0.1')
  try {
    await wrk(server.url, 'mix', WARMUP_S, seed.tokens)
    await new Promise((resolve) => setTimeout(resolve, 1000))
    const rssBase = treeMemoryKb(server.pid, 'VmRSS')
    const generators = Array.from({ length: count }, (_, i) => {
      const share = Math.floor(CONNECTIONS / count) + (i < CONNECTIONS % count ? 1 : 0)
      const url = server.url.replace('127.0.0.1', `127.0.0.${1 + i}`)
      const latencies = join(CACHE, `latencies-${process.pid}-${i}.json`)
      return { latencies, ...generator(url, share, seed.tokens, latencies) }
    })
    const connected = await Promise.all(generators.map((g) => g.next('connected')))
    const open = connected.reduce((sum, c) => sum + c.connections, 0)
    const failedToConnect = connected.reduce((sum, c) => sum + c.failed, 0)
    log(`bench: ${fmt(open)} connections open (${count} generator${count > 1 ? 's' : ''}); measuring idle memory`)
    await new Promise((resolve) => setTimeout(resolve, 4000))
    const rssIdle = treeMemoryKb(server.pid, 'VmRSS')
    let rssPeak = rssIdle
    const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, treeMemoryKb(server.pid, 'VmRSS'))), 1000)
    const ticks = treeCpuTicks(server.pid)
    log(`bench: holding for ${HOLD_S} s, the k6 loop on every connection (about ${fmt(CONNECTIONS * USER_RATE)} requests/s)`)
    const results = await Promise.all(generators.map((g) => g.next('done')))
    clearInterval(sampler)
    const cpuUs = (treeCpuTicks(server.pid) - ticks) * TICK_US
    // Percentiles over every request of every generator, not averages of theirs.
    const latencies = generators.flatMap((g) => JSON.parse(readFileSync(g.latencies, 'utf8')) as number[]).sort((a, b) => a - b)
    for (const g of generators) rmSync(g.latencies, { force: true })
    const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? 0
    const sum = (key: string) => results.reduce((total, r) => total + r[key], 0)
    const errorCount = results.reduce((total, r) => total + r.errors.status + r.errors.body + r.errors.closed + r.errors.connect + r.unanswered, 0) + failedToConnect
    const sent = sum('sent')
    const seconds = Math.max(...results.map((r) => r.seconds))
    return {
      connections: open,
      rate: sent / seconds,
      seconds,
      sent,
      answered: sum('answered'),
      errors: errorCount,
      // The failures that carry no answer to show: connections that never opened, requests never answered.
      error_example: results.map((r) => r.errors.example).find(Boolean) ?? [
        failedToConnect && `${fmt(failedToConnect)} of ${fmt(CONNECTIONS)} connections failed to open`,
        sum('unanswered') && `${fmt(sum('unanswered'))} requests unanswered 5 s after the hold`,
      ].filter(Boolean).join('; '),
      connect_failed: failedToConnect,
      p50_ms: at(50),
      p95_ms: at(95),
      p99_ms: at(99),
      max_ms: latencies.at(-1) ?? 0,
      rss_base_mb: rssBase / 1024,
      rss_idle_mb: rssIdle / 1024,
      rss_peak_mb: rssPeak / 1024,
      kb_per_idle_connection: (rssIdle - rssBase) / Math.max(1, open),
      cpu_us: cpuUs / Math.max(1, sum('answered')),
      generator_cpu: Math.max(...results.map((r) => r.generator_cpu)),
      // The challenge's pass line for a level.
      pass: at(95) < 500 && at(99) < 1000 && errorCount / Math.max(1, sent) < 0.01 && failedToConnect === 0,
    }
  } finally {
    await server.stop()
  }
}

// --- Reporting ------------------------------------------------------------------------------------

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = (sorted.length - 1) / 2
  return (sorted[Math.floor(middle)] + sorted[Math.ceil(middle)]) / 2
}
const fmt = (n: number, digits = 0) => n.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })

function summarize(runs: Saturation[], endpoint: Endpoint, variant: string) {
  const mine = runs.filter((r) => r.endpoint === endpoint && r.variant === variant)
  if (mine.length === 0) return undefined
  const pick = (key: keyof Saturation) => median(mine.map((r) => r[key] as number))
  return {
    endpoint, variant, rounds: mine.length,
    rps: pick('rps'), p50_ms: pick('p50_ms'), p99_ms: pick('p99_ms'), cpu_us: pick('cpu_us'), litestream_cpu_us: pick('litestream_cpu_us'),
    replica_behind_ms: Math.max(...mine.map((r) => r.replica_behind_ms)),
    server_cpu: pick('server_cpu'), load_cpu: Math.max(...mine.map((r) => r.load_cpu)), peak_rss_mb: pick('peak_rss_mb'),
    errors: mine.reduce((sum, r) => sum + r.errors, 0), error_example: mine.find((r) => r.errors)?.error_example ?? '',
  }
}
type Summary = NonNullable<ReturnType<typeof summarize>>

// The ratio of each round's pair, which drift moves less than the medians' ratio above: with --together
// the two ran at the same time, and otherwise one right after the other.
function roundByRound(runs: Saturation[], endpoint: Endpoint, variant: string): string {
  const cpu = (name: string) => runs.filter((r) => r.endpoint === endpoint && r.variant === name).map((r) => r.cpu_us)
  const ours = cpu('ours')
  const ratios = cpu(variant).map((us, i) => us / ours[i]).sort((x, y) => x - y)
  if (ratios.length < 2) return ''
  return `   round by round ${fmt(ratios[0], 3)} to ${fmt(ratios.at(-1)!, 3)}, median ${fmt(median(ratios), 3)}`
}

function printTable(rows: Summary[], c0: number) {
  const header = ['endpoint', 'variant', 'req/s', 'p50 ms', 'p99 ms', 'errors', 'CPU us/req', 'x c0', 'server CPU', 'load CPU', 'peak RSS MB']
  const lines = rows.map((r) => [
    LABEL[r.endpoint], r.variant, fmt(r.rps), fmt(r.p50_ms, 2), fmt(r.p99_ms, 2), r.errors ? red(String(r.errors)) : '0',
    fmt(r.cpu_us, 1), fmt(r.cpu_us / c0, 2), `${fmt(r.server_cpu * 100)}%`, r.load_cpu > 0.95 ? yellow(`${fmt(r.load_cpu * 100)}%`) : `${fmt(r.load_cpu * 100)}%`,
    fmt(r.peak_rss_mb),
  ])
  const visible = (s: string) => s.replace(/\x1b\[\d+m/g, '').length
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => visible(l[i]))))
  const row = (cells: string[]) => cells.map((c, i) => (i < 2 ? c + ' '.repeat(widths[i] - visible(c)) : ' '.repeat(widths[i] - visible(c)) + c)).join('  ')
  console.log(row(header))
  for (const l of lines) console.log(row(l))
}

function recordInBenchmarks(result: Record<string, any>, rows: Summary[], hold: Hold | undefined, c0: number) {
  const file = join(ROOT, 'BENCHMARKS.md')
  const text = readFileSync(file, 'utf8')
  const marker = '<!-- bench:rows -->'
  if (!text.includes(marker)) throw new Error(`BENCHMARKS.md has no ${marker} line to record before`)
  const ratio = (e: Endpoint) => {
    const r = rows.find((x) => x.endpoint === e && x.variant === 'ours')
    return r ? fmt(r.cpu_us / c0, 2) : '-'
  }
  const mix = rows.find((x) => x.endpoint === 'mix' && x.variant === 'ours')
  const holdCell = hold
    ? `${fmt(hold.connections)} conns at ${fmt(hold.rate)}/s, ${fmt(hold.seconds)} s: p99 ${fmt(hold.p99_ms, 1)} ms, ${hold.errors} errors, ${fmt(hold.kb_per_idle_connection, 1)} KB/conn, ${fmt(hold.rss_peak_mb)} MB ${hold.pass ? 'PASS' : 'FAIL'}`
    : '-'
  const cells = [
    result.date.slice(0, 10), `\`${result.commit}\``, fmt(c0, 1), ratio('feed'), ratio('post'), ratio('like'), ratio('create'), ratio('mix'),
    mix ? fmt(mix.rps) : '-', holdCell, result.users_estimate ? fmt(result.users_estimate) : '-',
  ]
  writeFileSync(file, text.replace(marker, `| ${cells.join(' | ')} |\n${marker}`))
  const caption = `${scoreLine()}${result.date.slice(0, 10)}, ${result.commit}`
  writeFileSync(join(ROOT, 'bench', 'chart.svg'), renderChart(rows.filter((r) => r.variant === 'ours' || r.variant === 'ceiling'), c0, caption))
  log('bench: recorded a row in BENCHMARKS.md and redrew bench/chart.svg')
}

// --- Main -----------------------------------------------------------------------------------------

async function main() {
  ensureTools()
  execFileSync(process.execPath, ['build.mjs'], { cwd: ROOT, stdio: 'ignore' })
  mkdirSync(CACHE, { recursive: true })
  mkdirSync(RESULTS, { recursive: true })
  const seed = seededDatabase()
  const flags = args.flags === undefined ? shippedNodeFlags() : args.flags.split(' ').filter(Boolean)
  if (args.cluster) return runCluster(seed, flags)
  if (args.instructions) return runInstructions(seed, flags)
  if (args.score) return runScore(seed, flags)
  const cgroup = memoryCgroup()
  const ours: Variant = { name: 'ours', app: join(ROOT, 'dist', 'app.js'), flags, commit: commitOf(ROOT), node: process.execPath }
  const variants = [ours]
  // One box: the same build as WORKERS=2 on both cores (wrk shares core 0 with it: read its req/s as
  // a floor, its CPU per request as the figure).
  if (args.box) variants.push({ ...ours, name: 'WORKERS=2, 2 cores', workers: '2', cores: `${LOAD_CORE},${SERVER_CORE}` })
  const againstFlags = args['against-flags'] === undefined ? undefined : args['against-flags'].split(' ').filter(Boolean)
  if (args['against-node']) {
    // The same bundle and flags on another Node.
    variants.push({ ...ours, name: `Node ${args['against-node']}`, flags: againstFlags ?? flags, node: nodeRelease(args['against-node']) })
  } else if (args.against || againstFlags) {
    const app = args.against ? buildAgainst(args.against) : ours.app
    const commit = args.against ? sh('git', ['rev-parse', '--short', args.against]) : ours.commit
    variants.push({ name: args.against ? `against ${args.against}` : 'against', app, flags: againstFlags ?? flags, commit, node: process.execPath })
  }
  // The same server as `npm start` runs it with LITESTREAM_REPLICA_URL: under `litestream replicate`,
  // whose CPU counts as the server's (one core holds both), replicating to a folder beside the copy.
  // The stack's floor (bench/floor.ts): the same SQL with nothing of ours around it, same Node and flags.
  if (args.floor) variants.push({ ...ours, name: 'floor', app: join(ROOT, 'bench', 'floor.ts') })
  // With --sync-wait, a second such server acknowledges each write once the replica holds it; with
  // --s3, each replicates to s3rver instead of a folder.
  if (args.replicate) {
    if (!LITESTREAM) throw new Error('--replicate needs Litestream 0.5.17: set LITESTREAM_BIN, or put it at ../shared/tools/litestream')
    const env = { LITESTREAM_REPLICA_URL: REPLICA_URL, LITESTREAM_BIN: LITESTREAM }
    variants.push({ ...ours, name: 'litestream', app: join(ROOT, 'dist', 'start.js'), env })
    // With --against, that build under Litestream too: what a change costs a replicated server.
    const against = variants.find((v) => v.name.startsWith('against'))
    if (against) variants.push({ ...against, name: `litestream, ${against.name}`, app: join(dirname(against.app), 'start.js'), env })
    if (args['sync-wait']) variants.push({ ...ours, name: 'litestream wait', app: join(ROOT, 'dist', 'start.js'), env: { ...env, LITESTREAM_SYNC: 'wait' } })
  }
  const versions = (node: string) => sh(node, ['--input-type=module', '-e', "import { DatabaseSync } from 'node:sqlite'; console.log(`Node ${process.version}, SQLite ${new DatabaseSync(':memory:').prepare('SELECT sqlite_version() AS v').get().v}`)"])
  const sqlite = /SQLite (\S+)/.exec(versions(process.execPath))![1]
  console.log(`bench ${new Date().toISOString()}: commit ${ours.commit}, Node ${process.version}, SQLite ${sqlite}, ${cpus()[0].model} x${cpus().length}`)
  console.log(`server on core ${SERVER_CORE} (taskset), ${cgroup.note}; load on core ${LOAD_CORE}; wrk -t1 -c64, ${WARMUP_S} s warm-up, ${MEASURE_S} s measured, ${ROUNDS} round(s)`)
  for (const v of variants) {
    const replica = v.env?.LITESTREAM_REPLICA_URL ? ` under litestream replicate (dist/start.js), to ${v.env.LITESTREAM_REPLICA_URL}` : ''
    console.log(`${v.name}: node ${[...v.flags, 'dist/app.js'].join(' ')}${args.workers !== '0' ? `, WORKERS=${args.workers}` : ''}${replica} (${versions(v.node)})`)
  }

  // One users hold after the rounds; when comparing, only with --hold, and then one per variant each round.
  const comparing = variants.length > 1
  const runHold = args.hold !== undefined || (!comparing && !args.only)
  const runs: Saturation[] = []
  const holds: (Hold & { variant: string })[] = []
  try {
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate the variants, and their order each round, so drift hits both alike.
      const order = round % 2 ? [...variants].reverse() : variants
      for (const endpoint of only) {
        if (args.together && endpoint !== 'ceiling') {
          log(`bench: round ${round + 1}/${ROUNDS} ${LABEL[endpoint]} (${order.map((v) => v.name).join(', ')}, together)`)
          runs.push(...(await saturateTogether(order, endpoint, seed, cgroup.dir)))
          continue
        }
        for (const variant of endpoint === 'ceiling' ? ['ceiling' as const] : order) {
          log(`bench: round ${round + 1}/${ROUNDS} ${LABEL[endpoint]}${variant === 'ceiling' ? '' : ` (${variant.name})`}`)
          runs.push(await saturate(variant, endpoint, seed, cgroup.dir))
        }
      }
      if (runHold && (comparing || round === ROUNDS - 1)) {
        for (const variant of order) holds.push({ variant: variant.name, ...(await holdUsers(variant, seed, cgroup.dir)) })
      }
    }
    const rows = only.flatMap((e) => (e === 'ceiling' ? ['ceiling'] : variants.map((v) => v.name)).map((v) => summarize(runs, e, v)).filter((r): r is Summary => !!r))
    const c0 = rows.find((r) => r.endpoint === 'ceiling')!.cpu_us
    const hold = comparing ? undefined : holds[0]

    console.log('')
    printTable(rows, c0)
    if (comparing) {
      console.log('')
      for (const e of only.filter((x) => x !== 'ceiling')) {
        const [a, ...others] = variants.map((v) => rows.find((r) => r.endpoint === e && r.variant === v.name)!)
        for (const b of others) {
          const litestream = b.litestream_cpu_us ? `   (Litestream itself: ${fmt(b.litestream_cpu_us, 1)} of ${fmt(b.cpu_us, 1)} us/req; the replica ${fmt(b.replica_behind_ms / 1000, 1)} s behind at most)` : ''
          console.log(`${LABEL[e].padEnd(22)} CPU/req ${b.variant} / ours = ${fmt(b.cpu_us / a.cpu_us, 3)}   req/s ${fmt(b.rps / a.rps, 3)}${roundByRound(runs, e, b.variant)}${litestream}`)
        }
      }
      if (holds.length) {
        // Medians of each variant's holds.
        const held = variants.map((v) => {
          const mine = holds.filter((h) => h.variant === v.name)
          const pick = (key: keyof Hold) => median(mine.map((h) => h[key] as number))
          return { name: v.name, rounds: mine.length, kb: pick('kb_per_idle_connection'), peak: pick('rss_peak_mb'), p99: pick('p99_ms'), cpu: pick('cpu_us'), errors: mine.reduce((sum, h) => sum + h.errors, 0) }
        })
        console.log('')
        for (const h of held) {
          console.log(`users hold (${h.name}, median of ${h.rounds}): ${fmt(CONNECTIONS)} connections, ${fmt(h.kb, 1)} KB per idle connection, ` +
            `${fmt(h.peak)} MB at peak, p99 ${fmt(h.p99, 1)} ms, ${fmt(h.cpu, 1)} us CPU per request, ${h.errors ? red(`${h.errors} errors`) : '0 errors'}`)
        }
        for (const h of held.slice(1)) {
          console.log(`users hold              KB per idle connection ${h.name} / ours = ${fmt(h.kb / held[0].kb, 3)}   CPU/req ${fmt(h.cpu / held[0].cpu, 3)}`)
        }
      }
    }
    const mix = rows.find((r) => r.endpoint === 'mix' && r.variant === 'ours')
    const usersEstimate = mix ? (0.8 * mix.rps) / USER_RATE : undefined
    if (hold) {
      console.log('')
      const verdict = hold.pass ? green('PASS') : red('FAIL')
      console.log(`users hold: ${fmt(hold.connections)} keep-alive connections, mix at ${fmt(hold.rate)} req/s for ${fmt(hold.seconds)} s: ` +
        `p50 ${fmt(hold.p50_ms, 1)} ms, p95 ${fmt(hold.p95_ms, 1)} ms, p99 ${fmt(hold.p99_ms, 1)} ms, max ${fmt(hold.max_ms)} ms, ` +
        `${hold.errors ? red(`${hold.errors} errors`) : '0 errors'} of ${fmt(hold.sent)} -> ${verdict} (p95 < 500 ms, p99 < 1 s, < 1% errors)`)
      console.log(`            RSS ${fmt(hold.rss_base_mb)} MB before, ${fmt(hold.rss_idle_mb)} MB with the connections idle ` +
        `(${fmt(hold.kb_per_idle_connection, 1)} KB each), ${fmt(hold.rss_peak_mb)} MB at peak; ${fmt(hold.cpu_us, 1)} us CPU per request`)
      if (hold.generator_cpu > 0.9) console.log(yellow(`            the users generator used ${fmt(hold.generator_cpu * 100)}% of its core: its timing may be the limit`))
    }
    if (usersEstimate) console.log(`\nestimate, not a measurement: users ~ 0.8 x ${fmt(mix!.rps)} mix req/s / 0.106 = ${fmt(usersEstimate)} on one core of this machine`)

    const result = {
      date: new Date().toISOString(), commit: ours.commit, node: process.version, sqlite,
      machine: { cpu: cpus()[0].model, cores: cpus().length, kernel: release(), memory_gb: Math.round(totalmem() / 1024 ** 3) },
      settings: { quick: QUICK, warmup_s: WARMUP_S, measure_s: MEASURE_S, rounds: ROUNDS, connections: CONNECTIONS, hold_s: HOLD_S, workers: Number(args.workers), cgroup: cgroup.note, variants },
      c0_us: c0, saturation: rows, runs, holds, users_estimate: usersEstimate,
    }
    const file = join(RESULTS, `${result.date.replace(/[:.]/g, '-')}-${ours.commit}.json`)
    writeFileSync(file, JSON.stringify(result, null, 2))
    console.log(`\nresults: ${file}`)
    if (args.record) recordInBenchmarks(result, rows, hold, c0)

    // Honest results: errors, an unsaturated server or a saturated load tool are said plainly.
    let failed = false
    for (const r of rows) {
      if (r.errors) (failed = true), console.log(red(`${LABEL[r.endpoint]} (${r.variant}): ${r.errors} bad responses, e.g. ${r.error_example}`))
      if (r.load_cpu > 0.95) console.log(yellow(`${LABEL[r.endpoint]} (${r.variant}): wrk's core was at ${fmt(r.load_cpu * 100)}%: the load tool may have been the bottleneck`))
      else if (r.server_cpu < 0.9) console.log(yellow(`${LABEL[r.endpoint]} (${r.variant}): the server's core was at ${fmt(r.server_cpu * 100)}%: not saturated`))
    }
    for (const h of holds) {
      if (h.errors) (failed = true), console.log(red(`users hold (${h.variant}): ${h.errors} errors, e.g. ${h.error_example}`))
      if (!h.pass) failed = true
    }
    process.exitCode = failed ? 1 : 0
  } finally {
    await s3?.stop()
    if (cgroup.dir) rmdirSync(cgroup.dir)
  }
}

// Instructions, syscalls and CPU time a request, counted (bench/instructions.ts); --check is CI's guard.
async function runInstructions(seed: Seed, flags: string[]) {
  const { checkBaseline, instructionsBench, recordBaseline, saveResult } = await import('./instructions.ts')
  const { KINDS } = await import('./sequence.ts')
  const packages: Record<string, string> = { valgrind: 'valgrind', setarch: 'util-linux', perf: 'linux-perf' }
  const missing = Object.keys(packages).filter((tool) => (tool !== 'perf' || !args.check) && spawnSync('which', [tool]).status !== 0)
  if (missing.length) throw new Error(`--instructions needs ${missing.join(', ')}: apt-get install ${missing.map((t) => packages[t]).join(' ')}`)
  if (args.check && args.n) throw new Error('--check counts with the baseline\'s n; leave --n out')
  if (args.check) {
    process.exitCode = (await checkBaseline({ seed, flags })) ? 0 : 1
    return
  }
  const kinds = only.filter((e) => e !== 'ceiling') as (typeof KINDS)[number][]
  const against = args.against ? { ref: args.against, app: buildAgainst(args.against) } : undefined
  console.log(`bench ${new Date().toISOString()}: commit ${commitOf(ROOT)}, Node ${process.version}`)
  const result = await instructionsBench({ seed, flags, only: kinds, against, n: args.n ? Number(args.n) : undefined })
  saveResult({ date: new Date().toISOString(), commit: commitOf(ROOT), node: process.version, ...result }, commitOf(ROOT))
  if (args.record && args.n) throw new Error('--record writes the guard\'s baseline, counted with its n; leave --n out')
  if (args.record) recordBaseline(result, commitOf(ROOT))
}

// The chart says the measured score first, then the estimate, then its own run: bench/score.json is
// what --score --record last measured.
const SCORE_FILE = join(ROOT, 'bench', 'score.json')
function scoreLine() {
  if (!existsSync(SCORE_FILE)) return ''
  const s = JSON.parse(readFileSync(SCORE_FILE, 'utf8'))
  return `score ${fmt(s.score)} users measured in the box's limits (${s.date.slice(0, 10)}, ${s.commit}${s.full ? ', --full' : ''}); estimate from CPU ${fmt(s.estimate)}. Chart: `
}

async function runScore(seed: Seed, flags: string[]) {
  const { k6Check, scoreBench } = await import('./score.ts')
  if (args.k6) {
    const result = await k6Check({ seed, flags, k6: args.k6 })
    writeFileSync(join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commitOf(ROOT)}-k6-check.json`), JSON.stringify(result, null, 2))
    return
  }
  // The CPU estimate beside it: the mix at saturation, against the ceiling, as the plain bench runs it.
  const ours: Variant = { name: 'ours', app: join(ROOT, 'dist', 'app.js'), flags, commit: commitOf(ROOT), node: process.execPath }
  const ceiling = await saturate('ceiling', 'ceiling', seed)
  const mix = await saturate(ours, 'mix', seed)
  const estimate = { users: (0.8 * mix.rps) / USER_RATE, mix_rps: mix.rps, mix_cpu_us: mix.cpu_us, c0_us: ceiling.cpu_us }
  const confirmFrom = args['confirm-from'] ? Number(args['confirm-from']) : undefined
  if (confirmFrom !== undefined && !(confirmFrom >= 2500 && confirmFrom % 250 === 0)) throw new Error('--confirm-from: a number of users, 2,500 or more, in steps of 250')
  const result = await scoreBench({ seed, flags, full: args.full, estimate, commit: ours.commit, confirmFrom })
  const file = join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${ours.commit}-score.json`)
  writeFileSync(file, JSON.stringify({ date: new Date().toISOString(), commit: ours.commit, node: process.version, estimate, ...result }, null, 2))
  console.log(`results: ${file}`)
  if (args.record) {
    writeFileSync(SCORE_FILE, JSON.stringify({ date: new Date().toISOString(), commit: ours.commit, full: args.full, score: result.score, estimate: Math.round(estimate.users), line: result.line }, null, 2) + '\n')
    // The chart's caption, redrawn in place: its bars are the saturation run's.
    const chart = join(ROOT, 'bench', 'chart.svg')
    const svg = readFileSync(chart, 'utf8').replace(/(<text x="16" y="46"[^>]*>)(?:score [^<]*Chart: )?/, (_, open) => `${open}${scoreLine()}`)
    writeFileSync(chart, svg)
    log('bench: wrote bench/score.json and the score into bench/chart.svg')
  }
}

async function runCluster(seed: Seed, flags: string[]) {
  const { clusterBench } = await import('./cluster.ts')
  console.log(`bench ${new Date().toISOString()}: commit ${commitOf(ROOT)}, Node ${process.version}, ${cpus()[0].model} x${cpus().length}`)
  const { report, errors } = await clusterBench({ seed, quick: QUICK, flags })
  const file = join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commitOf(ROOT)}-cluster.json`)
  writeFileSync(file, JSON.stringify({ date: new Date().toISOString(), commit: commitOf(ROOT), node: process.version, quick: QUICK, ...report }, null, 2))
  console.log(`\nresults: ${file}`)
  if (errors) console.log(red(`${errors} bad responses`))
  process.exitCode = errors ? 1 : 0
}

await main()
