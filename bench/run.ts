// npm run bench: what the challenge scores, on one core of this machine. First the users holds: 15,000
// users (each a keep-alive connection sending a request every 9 s or so, so that each request arrives
// alone), held by ours, by ours on a second server (the A/A), by ours on @hono/node-server and by the
// three floors (node:http, node:net, node:net with Hono), alternating rounds; then each endpoint at
// saturation, against the Node ceiling measured in the same run. See bench/README.md.
//
//   npm run bench [-- --quick] [--only feed,mix] [--hold 5m] [--ramp 60s] [--connections 15000] [--workers 1]
//                    [--record] [--rounds 3] [--against <git ref>] [--flags=<node flags>] [--against-flags=<node flags>]
//                    [--against-node <version>] [--against-env "<NAME=value ...>"] [--replicate [--sync-wait] [--s3]]
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
import { cpuTicks, processTree, TICK_US, treeCpu, treeCpuTicks, treeMemoryKb, treeSwitches } from '../harness/proc.ts'
import { startS3rver } from '../harness/s3.ts'
import { CACHE, type Seed, seededDatabase } from '../harness/seed.ts'
import { type Server, shippedNodeFlags } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { LITESTREAM, ROOT } from '../harness/tools.ts'
import { renderChart } from './chart.ts'
import { benchServer, countSyscalls, ensureTools, fmt, LOAD_CORE, log, memoryCgroup, nodeRelease, REPLICA_URL, RESULTS, SERVER_CORE, sh, shippedEnv, usersGenerator, WORKDIR, wrk } from './lib.ts'

const USER_RATE = 0.106 // requests a second per user, the k6 loop's average
// Users per generator, and so per loopback address of the server: one client address may open about
// 28,000 connections to one server address and port, and one process of ours holds about 19,900.
const PER_GENERATOR = 18_000

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    only: { type: 'string' },
    hold: { type: 'string' },
    connections: { type: 'string' },
    record: { type: 'boolean', default: false },
    rounds: { type: 'string' },
    ramp: { type: 'string' },
    against: { type: 'string' },
    flags: { type: 'string' },
    workers: { type: 'string', default: '0' }, // as shipped: one process, more only past its open-file limit
    'against-flags': { type: 'string' },
    'against-env': { type: 'string' },
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
// The users hold: the users arrive evenly over the ramp, each running its loop from its arrival as a k6
// user does; the hold after the ramp is what is measured.
const RAMP_S = parseDuration(args.ramp ?? (QUICK ? '10s' : '60s'))
const HOLD_S = parseDuration(args.hold ?? (QUICK ? '15s' : '90s'))
const ROUNDS = Number(args.rounds ?? 1) // of the saturation runs
const USER_ROUNDS = Number(args.rounds ?? (QUICK ? 1 : 2)) // of the users holds
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
    ? benchServer(join(ROOT, 'bench', 'ceiling.ts'), { cgroup })
    : benchServer(variant.app, {
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
  variant: string; round: number; connections: number; seconds: number; sent: number; answered: number; rate: number
  errors: number; error_example: string; connect_failed: number; p50_ms: number; p95_ms: number; p99_ms: number; max_ms: number
  // A request's cost over the hold: CPU (user, kernel, both) in us, context switches, syscalls (undefined without perf).
  cpu_us: number; user_us: number; sys_us: number; voluntary_switches: number; involuntary_switches: number; switches: number; syscalls?: number
  server_cpu: number; rss_idle_mb: number; rss_start_mb: number; rss_peak_mb: number; kb_per_connection: number
  generator_cpu: number; pass: boolean; perf_note?: string
}

// N users, each on its own keep-alive connection running the k6 loop (N x 0.106 requests a second), on a
// fresh server with a fresh copy of the seed, after the saturation warm-up: they arrive evenly over the
// ramp, each looping from its arrival; then the hold is measured from the server's process tree (CPU
// user and system of every thread, context switches of every thread, syscalls by perf, RSS) and from
// the generators (every answer checked and timed). Past 18,000 users, several generators share them,
// each to its own loopback address of the server (127.0.0.1, .2, ...; binding the clients instead makes
// the kernel's search for a free port slower with every connection).
async function holdUsers(variant: Variant, seed: Seed, round: number, cgroup?: string): Promise<Hold> {
  const count = Math.ceil(CONNECTIONS / PER_GENERATOR)
  const server = await serve(variant, seed, cgroup, count > 1 ? '0.0.0.0' : '127.0.0.1')
  const generators: (ReturnType<typeof usersGenerator> & { latencies: string })[] = []
  let sampler: NodeJS.Timeout | undefined
  try {
    if (isReplicated(variant)) await firstSnapshot(server)
    await wrk(server.url, 'mix', WARMUP_S, seed.tokens)
    await new Promise((resolve) => setTimeout(resolve, 1000))
    const rssIdle = treeMemoryKb(server.pid, 'VmRSS')
    for (let i = 0; i < count; i++) {
      const share = Math.floor(CONNECTIONS / count) + (i < CONNECTIONS % count ? 1 : 0)
      const url = server.url.replace('127.0.0.1', `127.0.0.${1 + i}`)
      const latencies = join(CACHE, `latencies-${process.pid}-${i}.json`)
      generators.push({ latencies, ...usersGenerator({ url, connections: share, tokens: seed.tokens, latencies, idle: 0, hold: HOLD_S, ramp: RAMP_S, loopOnArrival: true }) })
    }
    const connected = await within(Promise.all(generators.map((g) => g.next('connected'))), (RAMP_S + 120) * 1000, `the users of ${variant.name} arriving`)
    // Every user has arrived: the generators measure from now (no idle time), and so does this.
    const perf = countSyscalls(processTree(server.pid))
    const cpuBefore = treeCpu(server.pid)
    const switchesBefore = treeSwitches(server.pid)
    const started = performance.now()
    const rssStart = treeMemoryKb(server.pid, 'VmRSS')
    let rssPeak = rssStart
    sampler = setInterval(() => {
      try {
        rssPeak = Math.max(rssPeak, treeMemoryKb(server.pid, 'VmRSS'))
      } catch {} // a worker gone meanwhile
    }, 500)
    const open = connected.reduce((sum, c) => sum + c.connections, 0)
    const failedToConnect = connected.reduce((sum, c) => sum + c.failed, 0)
    log(`bench: ${fmt(open)} users have arrived (${count} generator${count > 1 ? 's' : ''}); measuring ${fmt(HOLD_S)} s (about ${fmt(open * USER_RATE)} requests/s)`)
    const results = await within(Promise.all(generators.map((g) => g.next('done'))), (HOLD_S + 60) * 1000, `the hold of ${variant.name}`)
    const cpuAfter = treeCpu(server.pid)
    const switchesAfter = treeSwitches(server.pid)
    const wallS = (performance.now() - started) / 1000
    clearInterval(sampler)
    rssPeak = Math.max(rssPeak, treeMemoryKb(server.pid, 'VmRSS'))
    const syscalls = await perf.stop()
    // Percentiles over every request of every generator, not averages of theirs.
    const latencies = generators.flatMap((g) => JSON.parse(readFileSync(g.latencies, 'utf8')) as number[]).sort((a, b) => a - b)
    const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? 0
    const sum = (key: string) => results.reduce((total, r) => total + r[key], 0)
    const errorCount = results.reduce((total, r) => total + r.errors.status + r.errors.body + r.errors.closed + r.errors.connect + r.unanswered, 0) + failedToConnect
    const sent = sum('sent')
    const answered = Math.max(1, sum('answered'))
    const seconds = Math.max(...results.map((r) => r.seconds))
    const [userUs, sysUs] = [(cpuAfter.user - cpuBefore.user) * TICK_US, (cpuAfter.system - cpuBefore.system) * TICK_US]
    const voluntary = (switchesAfter.voluntary - switchesBefore.voluntary) / answered
    const involuntary = (switchesAfter.involuntary - switchesBefore.involuntary) / answered
    return {
      variant: variant.name,
      round,
      connections: open,
      seconds,
      sent,
      answered: sum('answered'),
      rate: sum('answered') / seconds,
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
      cpu_us: (userUs + sysUs) / answered,
      user_us: userUs / answered,
      sys_us: sysUs / answered,
      voluntary_switches: voluntary,
      involuntary_switches: involuntary,
      switches: voluntary + involuntary,
      syscalls: syscalls.count === undefined ? undefined : syscalls.count / answered,
      perf_note: syscalls.note,
      server_cpu: (userUs + sysUs) / (wallS * 1e6),
      rss_idle_mb: rssIdle / 1024,
      rss_start_mb: rssStart / 1024,
      rss_peak_mb: rssPeak / 1024,
      kb_per_connection: (rssStart - rssIdle) / Math.max(1, open),
      generator_cpu: Math.max(...results.map((r) => r.generator_cpu)),
      // The challenge's pass line for a level.
      pass: at(95) < 500 && at(99) < 1000 && errorCount / Math.max(1, sent) < 0.01 && failedToConnect === 0,
    }
  } finally {
    clearInterval(sampler)
    for (const g of generators) {
      g.kill()
      rmSync(g.latencies, { force: true })
    }
    await server.stop()
  }
}

// Every variant of the users comparison, once a round, each on a fresh server, one after another; the
// order reversed every other round, so that drift over a round hits the first and the last alike.
async function usersComparison(variants: Variant[], seed: Seed, cgroup?: string): Promise<Hold[]> {
  const holds: Hold[] = []
  const perHoldS = 2 + WARMUP_S + 1 + RAMP_S + HOLD_S + 2
  const total = USER_ROUNDS * variants.length
  for (let round = 0; round < USER_ROUNDS; round++) {
    const order = round % 2 ? [...variants].reverse() : variants
    for (const variant of order) {
      const left = (total - holds.length) * perHoldS
      log(`bench: users ${round + 1}/${USER_ROUNDS}: ${variant.name}: ${fmt(CONNECTIONS)} users arriving over ${fmt(RAMP_S)} s, then ${fmt(HOLD_S)} s measured (about ${Math.ceil(left / 60)} min left of the users holds)`)
      holds.push(await holdUsers(variant, seed, round + 1, cgroup))
    }
  }
  return holds
}

// --- Reporting ------------------------------------------------------------------------------------

const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = (sorted.length - 1) / 2
  return (sorted[Math.floor(middle)] + sorted[Math.ceil(middle)]) / 2
}

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

// --- The users holds' report ---------------------------------------------------------------------

// Columns, the first one or two left-aligned and the rest right-aligned, colours not counted.
function printColumns(header: string[], lines: string[][], left = 1) {
  const visible = (s: string) => s.replace(/\x1b\[\d+m/g, '').length
  const widths = header.map((h, i) => Math.max(visible(h), ...lines.map((l) => visible(l[i]))))
  const row = (cells: string[]) => cells.map((c, i) => (i < left ? c + ' '.repeat(widths[i] - visible(c)) : ' '.repeat(widths[i] - visible(c)) + c)).join('  ').trimEnd()
  console.log(row(header))
  for (const l of lines) console.log(row(l))
}

// Each variant's medians over its rounds.
function summarizeHolds(holds: Hold[], variant: string) {
  const mine = holds.filter((h) => h.variant === variant)
  const pick = (key: keyof Hold) => median(mine.map((h) => h[key] as number))
  const syscalls = mine.map((h) => h.syscalls).filter((n): n is number => n !== undefined)
  return {
    variant, rounds: mine.length, rate: pick('rate'), cpu_us: pick('cpu_us'), user_us: pick('user_us'), sys_us: pick('sys_us'), server_cpu: pick('server_cpu'),
    switches: pick('switches'), voluntary_switches: pick('voluntary_switches'), involuntary_switches: pick('involuntary_switches'),
    syscalls: syscalls.length ? median(syscalls) : undefined,
    rss_idle_mb: pick('rss_idle_mb'), rss_peak_mb: pick('rss_peak_mb'), kb_per_connection: pick('kb_per_connection'),
    p50_ms: pick('p50_ms'), p95_ms: pick('p95_ms'), p99_ms: pick('p99_ms'),
    errors: mine.reduce((sum, h) => sum + h.errors, 0), passed: mine.filter((h) => h.pass).length,
  }
}

// The figures compared with ours, each round's pair alone (variant / ours, the same round).
const RATIOS = [['cpu_us', 'CPU/req'], ['user_us', 'user'], ['sys_us', 'sys'], ['switches', 'switches/req'], ['syscalls', 'syscalls/req']] as const
type Spread = { rounds: number[]; min: number; max: number; median: number }

// A figure of the variant's over the same figure of the base's, each round's pair alone.
function ratioSpread(holds: Hold[], variant: string, base: string, key: (typeof RATIOS)[number][0]): Spread | undefined {
  const rounds = holds.filter((h) => h.variant === variant).flatMap((h) => {
    const theirs = holds.find((o) => o.variant === base && o.round === h.round)?.[key]
    const mine = h[key]
    return mine !== undefined && theirs ? [mine / theirs] : []
  })
  if (!rounds.length) return undefined
  const sorted = [...rounds].sort((a, b) => a - b)
  return { rounds, min: sorted[0], max: sorted.at(-1)!, median: median(sorted) }
}

function ratiosToOurs(holds: Hold[], variant: string): Record<(typeof RATIOS)[number][0], Spread | undefined> {
  return Object.fromEntries(RATIOS.map(([key]) => [key, ratioSpread(holds, variant, 'ours', key)])) as Record<(typeof RATIOS)[number][0], Spread | undefined>
}

// lowest-highest (median) of the rounds, or the one round's figure.
const spreadCell = (s?: Spread) => (!s ? '' : s.rounds.length > 1 ? `${fmt(s.min, 3)}-${fmt(s.max, 3)} (${fmt(s.median, 3)})` : fmt(s.median, 3))

// The floors each variant is read against: the stack with nothing of ours (node:http), and the same work
// straight on node:net, which is where ours now serves from.
const FLOOR_BASES = [['floor', '/ floor (node:http)'], ['floor, node:net', '/ floor, node:net']] as const

// Each variant's CPU a request over each floor's that ran, each round's pair alone, as the ratios to ours.
function printFloorRatios(holds: Hold[], variants: Variant[]) {
  const bases = FLOOR_BASES.filter(([base]) => holds.some((h) => h.variant === base))
  if (!bases.length) return undefined
  const ratios = Object.fromEntries(variants.map((v) => [v.name, Object.fromEntries(bases.map(([base]) => [base, v.name === base ? undefined : ratioSpread(holds, v.name, base, 'cpu_us')]))]))
  const rounds = Math.max(...bases.map(([base]) => holds.filter((h) => h.variant === base).length))
  console.log(`\nCPU/req over the floors', each round's pair${rounds > 1 ? ': lowest-highest (median) of the rounds' : ''}`)
  printColumns(['', ...bases.map(([, label]) => label)], variants.map((v) => [v.name, ...bases.map(([base]) => spreadCell(ratios[v.name][base]))]))
  return ratios
}

function printUsersReport(holds: Hold[], variants: Variant[]) {
  const rows = variants.map((v) => summarizeHolds(holds, v.name))
  const rounds = Math.max(...rows.map((r) => r.rounds))
  const processes = args.workers !== '0' ? `WORKERS=${args.workers}` : CONNECTIONS > PER_GENERATOR ? 'WORKERS unset' : 'one process'
  console.log(`users hold: ${fmt(CONNECTIONS)} users (${processes}) arriving over ${fmt(RAMP_S)} s, each looping from its arrival, then ${fmt(HOLD_S)} s measured; ` +
    `a fresh server each, ${rounds} round${rounds > 1 ? 's' : ''}${rounds > 1 ? ', the order reversed every other round; medians' : ''}`)
  const syscalls = (n?: number) => (n === undefined ? '' : fmt(n, 1))
  printColumns(
    ['variant', 'req/s', 'CPU us/req', 'user', 'sys', 'core', 'switches/req', 'invol', 'syscalls/req', 'idle MB', 'peak MB', 'KB/conn', 'p50 ms', 'p95 ms', 'p99 ms', 'errors', 'pass'],
    rows.map((r) => [
      r.variant, fmt(r.rate), fmt(r.cpu_us, 1), fmt(r.user_us, 1), fmt(r.sys_us, 1), `${fmt(r.server_cpu * 100)}%`, fmt(r.switches, 2), fmt(r.involuntary_switches, 2),
      syscalls(r.syscalls), fmt(r.rss_idle_mb), fmt(r.rss_peak_mb), fmt(r.kb_per_connection, 1), fmt(r.p50_ms, 1), fmt(r.p95_ms, 1), fmt(r.p99_ms, 1),
      r.errors ? red(fmt(r.errors)) : '0', r.passed === r.rounds ? green('PASS') : red(`FAIL ${r.rounds - r.passed}/${r.rounds}`),
    ]),
  )
  const others = variants.filter((v) => v.name !== 'ours')
  const ratios = Object.fromEntries(others.map((v) => [v.name, ratiosToOurs(holds, v.name)]))
  if (others.length) {
    console.log(`\nvariant / ours, each round's pair${rounds > 1 ? ': lowest-highest (median) of the rounds' : ''}`)
    // The A/A first: the same build on a second server, the method's noise, to read the others against.
    const aaFirst = [...others].sort((a, b) => Number(b.name === 'ours again') - Number(a.name === 'ours again'))
    printColumns(['', ...RATIOS.map(([, label]) => label)], aaFirst.map((v) => [v.name === 'ours again' ? 'ours again (A/A: the noise)' : v.name, ...RATIOS.map(([key]) => spreadCell(ratios[v.name][key]))]))
    if (others.some((v) => v.name === 'ours again')) console.log('A/A: ours on a second server; a ratio within its spread of 1 is no difference.')
    else console.log(yellow('no A/A (--quick holds ours once): read no ratio here as a difference'))
  }
  const cpuToFloors = printFloorRatios(holds, variants)
  const note = holds.find((h) => h.perf_note)?.perf_note
  if (note) console.log(yellow(`syscalls/req left empty: ${note}`))
  for (const h of holds) {
    if (h.generator_cpu > 0.9) console.log(yellow(`users hold (${h.variant}, round ${h.round}): a users generator used ${fmt(h.generator_cpu * 100)}% of its core: its timing may be the limit`))
    if (h.server_cpu > 0.9) console.log(yellow(`users hold (${h.variant}, round ${h.round}): the server's core was ${fmt(h.server_cpu * 100)}% busy: near saturation, not the sparse load`))
  }
  return { medians: rows, ratios, cpu_to_floors: cpuToFloors }
}

function recordInBenchmarks(result: Record<string, any>, rows: Summary[], hold: ReturnType<typeof summarizeHolds> | undefined, c0: number) {
  const file = join(ROOT, 'BENCHMARKS.md')
  const text = readFileSync(file, 'utf8')
  const marker = '<!-- bench:rows -->'
  if (!text.includes(marker)) throw new Error(`BENCHMARKS.md has no ${marker} line to record before`)
  const ratio = (e: Endpoint) => {
    const r = rows.find((x) => x.endpoint === e && x.variant === 'ours')
    return r ? fmt(r.cpu_us / c0, 2) : '-'
  }
  const mix = rows.find((x) => x.endpoint === 'mix' && x.variant === 'ours')
  // Ours' medians of the users holds; KB/conn since these are the looping users' (bench/README.md).
  const holdCell = hold
    ? `${fmt(CONNECTIONS)} conns at ${fmt(hold.rate)}/s, ${fmt(HOLD_S)} s: p99 ${fmt(hold.p99_ms, 1)} ms, ${hold.errors} errors, ${fmt(hold.kb_per_connection, 1)} KB/conn, ${fmt(hold.rss_peak_mb)} MB ${hold.passed === hold.rounds ? 'PASS' : 'FAIL'}`
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

// The floors: the same SQL and token check with nothing of ours around them (bench/floor-sql.ts), on
// node:http, straight on node:net, and on node:net through a minimal Hono app.
const FLOORS = [['floor', 'floor.ts'], ['floor, node:net', 'floor-net.ts'], ['floor, node:net + Hono', 'floor-hono.ts']]

// The users comparison's variants: ours; ours again on a second server (the A/A: the method's noise; not
// with --quick); ours on @hono/node-server (HTTP_SERVER=node-server), the server it had before node:net;
// the floors, same Node and flags, where the users fit one process (one generator's); and every other
// variant of the run.
function usersVariantsOf(ours: Variant, variants: Variant[], floorFits: boolean): Variant[] {
  const floors = floorFits ? FLOORS.map(([name, script]) => ({ ...ours, name, app: join(ROOT, 'bench', script) })) : []
  const again = QUICK ? [] : [{ ...ours, name: 'ours again' }]
  const nodeServer = { ...ours, name: 'ours, node-server', env: { HTTP_SERVER: 'node-server' } }
  return [ours, ...again, nodeServer, ...floors, ...variants.filter((v) => v !== ours && v.name !== 'floor')]
}

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
  // The same build with more in its environment: an allocator preloaded, say (LD_PRELOAD=... MALLOC_CONF=...).
  const againstEnv = args['against-env'] === undefined ? undefined : Object.fromEntries(args['against-env'].split(' ').filter(Boolean).map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]))
  if (againstEnv) variants.push({ ...ours, name: `ours, ${args['against-env']!.replace(/\S*\//g, '')}`.slice(0, 48), env: againstEnv })
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
  // The users comparison, first, unless the run is about saturation (--only, --box) and no --hold asks for it.
  const runUsers = args.hold !== undefined || (!args.only && !args.box)
  const floorFits = CONNECTIONS <= PER_GENERATOR
  const usersVariants = usersVariantsOf(ours, variants, floorFits)
  console.log(`server on core ${SERVER_CORE} (taskset), ${cgroup.note}; load on core ${LOAD_CORE}`)
  if (runUsers) {
    console.log(`users holds: ${fmt(CONNECTIONS)} users arriving evenly over ${fmt(RAMP_S)} s, each looping from its arrival, then ${fmt(HOLD_S)} s measured; ` +
      `${USER_ROUNDS} round(s) of ${usersVariants.map((v) => v.name).join('; ')}`)
    if (!floorFits) console.log(yellow(`the floors are one process each, which holds about 19,900 connections here: left out of the users holds above ${fmt(PER_GENERATOR)} users`))
  }
  console.log(`saturation: wrk -t1 -c64, ${WARMUP_S} s warm-up, ${MEASURE_S} s measured, ${ROUNDS} round(s)`)
  const named = new Map([...(runUsers ? usersVariants : []), ...variants].map((v) => [v.name, v]))
  for (const v of named.values()) {
    if (v.name === 'ours again') continue
    const replica = v.env?.LITESTREAM_REPLICA_URL ? ` under litestream replicate, to ${v.env.LITESTREAM_REPLICA_URL}` : ''
    const app = v.app.startsWith(ROOT) ? v.app.slice(ROOT.length + 1) : v.app
    const preload = { ...shippedEnv(), ...v.env }.LD_PRELOAD
    // The rest of its own environment (HTTP_SERVER=node-server, say); the replica's is said after.
    const env = Object.entries(v.env ?? {}).filter(([name]) => !['LD_PRELOAD', 'LITESTREAM_REPLICA_URL', 'LITESTREAM_BIN'].includes(name)).map(([name, value]) => `${name}=${value} `).join('')
    console.log(`${v.name}: ${preload ? `LD_PRELOAD=${preload} ` : ''}${env}node ${[...v.flags, app].join(' ')}${args.workers !== '0' ? `, WORKERS=${args.workers}` : ''}${replica} (${versions(v.node)})`)
  }

  const comparing = variants.length > 1
  const runs: Saturation[] = []
  let holds: Hold[] = []
  try {
    let users: ReturnType<typeof printUsersReport> | undefined
    if (runUsers) {
      holds = await usersComparison(usersVariants, seed, cgroup.dir)
      console.log('')
      users = printUsersReport(holds, usersVariants)
    }
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
    }
    const rows = only.flatMap((e) => (e === 'ceiling' ? ['ceiling'] : variants.map((v) => v.name)).map((v) => summarize(runs, e, v)).filter((r): r is Summary => !!r))
    const c0 = rows.find((r) => r.endpoint === 'ceiling')!.cpu_us

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
    }
    const mix = rows.find((r) => r.endpoint === 'mix' && r.variant === 'ours')
    const usersEstimate = mix ? (0.8 * mix.rps) / USER_RATE : undefined
    if (usersEstimate) console.log(`\nestimate, not a measurement: users ~ 0.8 x ${fmt(mix!.rps)} mix req/s / 0.106 = ${fmt(usersEstimate)} on one core of this machine`)

    const result = {
      date: new Date().toISOString(), commit: ours.commit, node: process.version, sqlite,
      machine: { cpu: cpus()[0].model, cores: cpus().length, kernel: release(), memory_gb: Math.round(totalmem() / 1024 ** 3) },
      settings: { quick: QUICK, warmup_s: WARMUP_S, measure_s: MEASURE_S, rounds: ROUNDS, workers: Number(args.workers), cgroup: cgroup.note, variants },
      // The users holds: each hold (its round and variant), each variant's medians, each variant's ratios
      // to ours round by round (min, max, median), for CPU a request, user, sys, switches, syscalls, and
      // its CPU a request over each floor's the same way (cpu_to_floors).
      users_hold: users && {
        settings: { connections: CONNECTIONS, ramp_s: RAMP_S, hold_s: HOLD_S, rounds: USER_ROUNDS, loop_on_arrival: true, variants: usersVariants.map((v) => v.name) },
        ...users,
      },
      holds,
      c0_us: c0, saturation: rows, runs, users_estimate: usersEstimate,
    }
    const file = join(RESULTS, `${result.date.replace(/[:.]/g, '-')}-${ours.commit}.json`)
    writeFileSync(file, JSON.stringify(result, null, 2))
    console.log(`\nresults: ${file}`)
    if (args.record) recordInBenchmarks(result, rows, users?.medians.find((m) => m.variant === 'ours'), c0)

    // Honest results: errors, an unsaturated server or a saturated load tool are said plainly.
    let failed = false
    for (const r of rows) {
      if (r.errors) (failed = true), console.log(red(`${LABEL[r.endpoint]} (${r.variant}): ${r.errors} bad responses, e.g. ${r.error_example}`))
      if (r.load_cpu > 0.95) console.log(yellow(`${LABEL[r.endpoint]} (${r.variant}): wrk's core was at ${fmt(r.load_cpu * 100)}%: the load tool may have been the bottleneck`))
      else if (r.server_cpu < 0.9) console.log(yellow(`${LABEL[r.endpoint]} (${r.variant}): the server's core was at ${fmt(r.server_cpu * 100)}%: not saturated`))
    }
    for (const h of holds) {
      if (h.errors) (failed = true), console.log(red(`users hold (${h.variant}, round ${h.round}): ${h.errors} errors, e.g. ${h.error_example}`))
      if (!h.pass) (failed = true), console.log(red(`users hold (${h.variant}, round ${h.round}): FAIL, p95 ${fmt(h.p95_ms, 1)} ms, p99 ${fmt(h.p99_ms, 1)} ms (the pass line: p95 < 500 ms, p99 < 1 s, < 1% errors)`))
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
