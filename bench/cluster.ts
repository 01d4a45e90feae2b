// npm run bench -- --cluster [--quick]: read replicas, measured on this machine: Litestream followers
// (start.ts, over a file replica), a primary under `litestream replicate` and a follower under
// `litestream restore -f`, each started as `npm start` starts them. Every CPU figure counts a node's
// Litestream as the server's: on a box it shares the cores with the API. LiteFS is not measured here:
// docs/scale-out.md, "Why not LiteFS".
//
//   1. the post statement alone on the follower's file, its Litestream following, against a plain file
//   2. the mix at saturation, 2,000 connections (a forwarded write holds its connection for about the
//      lag): a plain file, the primary (its Litestream counted), the follower (its writes forwarded to the
//      primary, on the other core); then 10,000 of the challenge's users on each, one rate for all three
//      (bench/users.ts)
//   3. one write at a time, forwarded by the follower and sent to the primary: latency, CPU of each process
//   4. lag: from a new post's 201 on the primary to the follower's file holding it, idle and at the
//      challenge's write rate; 1 to 4 with Litestream's defaults (1 s), 3 and 4 again with a 100 ms sync
//      interval and with the primary in LITESTREAM_SYNC=wait
//
// 3 and 4's writes are bench/cluster-writes.ts's.
import { execFileSync } from 'node:child_process'
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { parseArgs } from 'node:util'
import { cpuTicks, processTree, TICK_US, treeCpuTicks } from '../harness/proc.ts'
import { CACHE, type Seed } from '../harness/seed.ts'
import type { Server } from '../harness/server.ts'
import { until } from '../harness/time.ts'
import { LITESTREAM, ROOT } from '../harness/tools.ts'
import { lag, lagText, oneAtATime, randomPost, writeText } from './cluster-writes.ts'
import { POST } from './floor-sql.ts'
import { startUsers, USER_RATE } from './hold.ts'
import { benchServer, commitOf, fmt, LOAD_CORE, log, prepare, red, resultsFile, SERVER_CORE, wrk } from './lib.ts'

// Moves a running process, every thread of it, to these cores.
const pin = (pid: number, cores: string) =>
  execFileSync('taskset', ['-a', '-p', '-c', cores, String(pid)], { stdio: 'ignore' })

// The challenge's writes at about its score: 73,000 users x 0.106 requests a second x 7.8% writes.
const WRITE_RATE = 600
// wrk's connections for the mix on a follower (and on the plain file it is compared with).
const CONNECTIONS = 2_000

type Run = { measureS: number; warmupS: number; tokens: string[]; seed: Seed; quick: boolean }
type Saturation = {
  rps: number
  cpu_us: number
  others_cpu_us: number
  p50_ms: number
  p99_ms: number
  errors: number
  example: string
  load_cpu: number
}

async function clusterBench({ seed, quick, flags }: { seed: Seed; quick: boolean; flags: string[] }) {
  if (!LITESTREAM)
    throw new Error('--cluster needs Litestream 0.5.17: set LITESTREAM_BIN, or put it at ../shared/tools/litestream')
  const run: Run = {
    measureS: quick ? 3 : 10,
    warmupS: quick ? 1 : 2,
    tokens: readFileSync(seed.tokens, 'utf8').trim().split('\n'),
    seed,
    quick,
  }
  const dir = join(CACHE, `cluster-${process.pid}`)
  mkdirSync(dir, { recursive: true })
  const plain = join(dir, 'plain.db')
  copyFileSync(seed.db, plain)
  try {
    const { report, errors } = await followersBench(run, flags, plain, dir)
    summary(report)
    return { report, errors }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

// The post statement in this process, pinned to the server core: CPU per query, and the CPU the
// given replication process spent meanwhile.
function statementCost(
  path: string,
  { quick, readOnly = false, pid }: { quick: boolean; readOnly?: boolean; pid?: number },
) {
  if (pid) pin(pid, SERVER_CORE)
  pin(process.pid, SERVER_CORE)
  const queries = quick ? 5_000 : 20_000
  const db = new DatabaseSync(path, { readOnly, timeout: 5_000 })
  const get = db.prepare(POST)
  for (let i = 0; i < queries / 5; i++) get.get(randomPost())
  const cpu = process.cpuUsage()
  const ticks = pid ? treeCpuTicks(pid) : 0
  for (let i = 0; i < queries; i++) get.get(randomPost())
  const { user, system } = process.cpuUsage(cpu)
  const replication_us = pid ? ((treeCpuTicks(pid) - ticks) * TICK_US) / queries : 0
  db.close()
  pin(process.pid, LOAD_CORE)
  return { node_us: (user + system) / queries, replication_us }
}

// wrk at saturation; CPU per request of the given processes, their trees included. With more
// connections than wrk's 64, a request may wait its turn longer than 2 s: the timeout is 10 s then.
async function saturate(
  run: Run,
  url: string,
  kind: string,
  pids: () => number[],
  connections = 64,
  others: () => number[] = () => [],
): Promise<Saturation> {
  const options = { connections, timeoutS: connections > 64 ? 10 : 2 }
  await wrk(url, kind, run.warmupS, run.seed.tokens, options)
  const before = [ticks(pids), ticks(others)]
  const result = await wrk(url, kind, run.measureS, run.seed.tokens, options)
  const [cpu, othersCpu] = [ticks(pids) - before[0], ticks(others) - before[1]].map((t) => t * TICK_US)
  // A socket error here is mostly a request wrk gave up on after its timeout.
  const example =
    result.bad_example ||
    (result.socket_errors ? `${result.socket_errors} socket errors or timeouts (over ${options.timeoutS} s)` : '')
  return {
    rps: result.requests / (result.duration_us / 1e6),
    cpu_us: cpu / result.requests,
    others_cpu_us: othersCpu / result.requests,
    p50_ms: result.p50_us / 1000,
    p99_ms: result.p99_us / 1000,
    errors: result.bad + result.socket_errors,
    example,
    load_cpu: result.loadCpu,
  }
}

// The primary measured as the follower is, on the server core, the follower moved to the load core
// meanwhile; then each back.
async function onServerCore<T>(primary: Server, follower: Server, measure: () => Promise<T>): Promise<T> {
  const move = (server: Server, core: string) => processTree(server.pid).forEach((pid) => pin(pid, core))
  move(follower, LOAD_CORE)
  move(primary, SERVER_CORE)
  try {
    return await measure()
  } finally {
    move(primary, LOAD_CORE)
    move(follower, SERVER_CORE)
  }
}

// CPU ticks of the processes, their trees included.
const ticks = (of: () => number[]) => of().reduce((sum, pid) => sum + treeCpuTicks(pid), 0)

// CPU ticks of a node's processes by kind: Litestream's, and the rest (Node: the API, and start.ts).
function ticksOf(pid: number, litestream: boolean) {
  let sum = 0
  for (const p of processTree(pid)) {
    try {
      if ((readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'litestream') === litestream) sum += cpuTicks(p).total
    } catch {} // gone meanwhile
  }
  return sum
}

function printMix(mix: Record<string, Saturation>) {
  const base = Object.values(mix)[0].cpu_us
  console.log(
    `   ${'where'.padEnd(20)} ${'req/s'.padStart(7)} ${'CPU us/req'.padStart(11)} ${'x plain'.padStart(8)} ${'p50 ms'.padStart(7)} ${'p99 ms'.padStart(7)} ${'wrk CPU'.padStart(8)} errors`,
  )
  for (const [name, r] of Object.entries(mix)) {
    console.log(
      `   ${name.padEnd(20)} ${fmt(r.rps).padStart(7)} ${fmt(r.cpu_us, 1).padStart(11)} ${fmt(r.cpu_us / base, 2).padStart(8)} ${fmt(r.p50_ms, 2).padStart(7)} ${fmt(r.p99_ms, 2).padStart(7)} ${`${fmt(r.load_cpu * 100)}%`.padStart(8)} ${r.errors}${r.example ? ` e.g. ${r.example}` : ''}`,
    )
  }
}

// Litestream's settings measured: its defaults, a shorter interval, and a primary that answers a write
// once the replica holds it. 1 and 2 run with the defaults only.
const SYNC_SETTINGS: { name: string; env: Record<string, string> }[] = [
  { name: 'defaults (1 s)', env: {} },
  { name: 'LITESTREAM_SYNC_INTERVAL=100ms', env: { LITESTREAM_SYNC_INTERVAL: '100ms' } },
  { name: 'LITESTREAM_SYNC=wait', env: { LITESTREAM_SYNC: 'wait' } },
]

async function followersBench(run: Run, flags: string[], plain: string, dir: string) {
  const settings: Record<string, unknown> = {}
  const report: Record<string, unknown> = { settings }
  const version = execFileSync(LITESTREAM!, ['version'], { encoding: 'utf8' }).trim()
  console.log(
    `\nLitestream followers: ${version}, a file replica; ` +
      `the follower (its API and Litestream) on core ${SERVER_CORE}, ` +
      `wrk and the primary on core ${LOAD_CORE} (the primary on core ${SERVER_CORE}, the follower on ${LOAD_CORE}, for the primary's own measures)`,
  )
  let errors = 0
  for (const [n, setting] of SYNC_SETTINGS.entries()) {
    const started: Server[] = []
    try {
      const { primary, follower, followerDb } = await startPair(run, { flags, dir, n, setting }, started)
      const result: Record<string, unknown> = {}
      console.log(`\n  ${setting.name}`)
      if (n === 0) {
        const first = await statementAndMix(run, { flags, plain, primary, follower, followerDb })
        Object.assign(result, { statement: first.statement, mix: first.mix, users: first.users })
        errors += first.errors
      }
      const later = await writesAndLag(run, { n, primary, follower, followerDb })
      Object.assign(result, later.result)
      errors += later.errors
      settings[setting.name] = result
    } finally {
      for (const server of started.reverse()) await server.stop().catch(() => {})
    }
  }
  return { report, errors }
}

const START = join(import.meta.dirname, '..', 'dist', 'start.js')
type Pair = { primary: Server; follower: Server; followerDb: string }

// A primary under `litestream replicate`, past its first snapshot, and a follower restoring its
// replica; each pushed onto started as it starts, for the caller to stop.
type Setting = { flags: string[]; dir: string; n: number; setting: (typeof SYNC_SETTINGS)[number] }

async function startPair(run: Run, { flags, dir, n, setting }: Setting, started: Server[]): Promise<Pair> {
  const replicaUrl = `file://${join(dir, `replica-${n}`)}`
  const env = { LITESTREAM_BIN: LITESTREAM!, LITESTREAM_REPLICA_URL: replicaUrl }
  log(`bench: Litestream, ${setting.name}: a primary, its first snapshot, then a follower restoring it`)
  const primaryEnv = { ...env, ...setting.env }
  const workdir = join(dir, `primary-${n}`)
  const primary = await benchServer(START, {
    flags,
    seed: run.seed,
    cores: LOAD_CORE,
    workdir,
    env: primaryEnv,
    timeoutMs: 60_000,
  })
  started.push(primary)
  // Its first snapshot, and its first level-1 compaction, which rereads the whole snapshot 30 s after
  // a start: neither weighs on a box that runs, so neither is measured (--quick waits for the first).
  const ready = run.quick ? /snapshot complete/ : /snapshot complete[^]*compaction complete.*level=1/
  await until(() => ready.test(primary.stdout()), 90_000, "the primary's first snapshot")
  const followerDir = join(dir, `follower-${n}`)
  const followerEnv = { ...env, PRIMARY_API_URL: primary.url }
  const follower = await benchServer(START, { flags, workdir: followerDir, env: followerEnv, timeoutMs: 120_000 })
  started.push(follower)
  return { primary, follower, followerDb: join(followerDir, 'feed.db') }
}

// 1. The statement alone on the follower's file, and on a plain copy, in this process; 2. the mix: a
// plain file, then the follower, 2,000 connections each, then the challenge's users on each.
type Plain = Pair & { flags: string[]; plain: string }

async function statementAndMix(run: Run, { flags, plain, primary, follower, followerDb }: Plain) {
  const { quick } = run
  const statement = {
    plain: statementCost(plain, { quick }),
    follower: statementCost(followerDb, { quick, readOnly: true, pid: follower.pid }),
  }
  console.log('  1. the post statement alone, CPU per query (us)')
  for (const [name, s] of Object.entries(statement)) {
    console.log(
      `     ${name.padEnd(10)} node ${fmt(s.node_us, 1).padStart(6)}  ` +
        `litestream ${fmt(s.replication_us, 1).padStart(6)}  ` +
        `total ${fmt(s.node_us + s.replication_us, 1).padStart(6)}`,
    )
  }
  const mix: Record<string, Saturation> = {}
  const app = join(import.meta.dirname, '..', 'dist', 'app.js')
  const server = await benchServer(app, { flags, env: { SQLITE_PATH: plain } })
  mix['plain file'] = await saturate(run, server.url, 'mix', () => [server.pid], CONNECTIONS)
  await server.stop()
  mix['primary'] = await onServerCore(primary, follower, () =>
    saturate(run, primary.url, 'mix', () => [primary.pid], CONNECTIONS),
  )
  mix['follower'] = await saturate(
    run,
    follower.url,
    'mix',
    () => [follower.pid],
    CONNECTIONS,
    () => [primary.pid],
  )
  const primaryUs = mix['follower'].others_cpu_us
  console.log(
    `  2. the mix at saturation, ${fmt(CONNECTIONS)} connections ` +
      "(CPU per request counts the follower's Litestream)",
  )
  printMix(mix)
  console.log(
    "     the primary (its API and Litestream), taking the follower's writes: " +
      `${fmt(primaryUs, 1)} us a follower request`,
  )
  const primaryPids = () => [primary.pid] // its CPU for the follower's writes, apart
  const users = {
    'plain file': await usersOnPlain(run, flags, plain),
    primary: await onServerCore(primary, follower, () => usersCost(run, primary.url, primaryPids)),
    follower: await usersCost(run, follower.url, () => [follower.pid], primaryPids),
  }
  console.log(`     ${fmt(HOLD_USERS)} users on each (${fmt(HOLD_USERS * USER_RATE)} requests a second):`)
  printMix(users)
  const errors = [...Object.values(mix), ...Object.values(users)].reduce((sum, r) => sum + r.errors, 0)
  return { statement, mix, users, errors }
}

// The challenge's users at one rate on both: CPU a request where neither is saturated. At wrk's
// saturation the follower's connections wait on their forwarded writes, so its core is not full and
// each request pays what a request alone costs; the plain file's, full, share their costs.
const HOLD_USERS = 10_000

async function usersOnPlain(run: Run, flags: string[], plain: string): Promise<Saturation> {
  const app = join(import.meta.dirname, '..', 'dist', 'app.js')
  const server = await benchServer(app, { flags, env: { SQLITE_PATH: plain } })
  try {
    return await usersCost(run, server.url, () => [server.pid])
  } finally {
    await server.stop()
  }
}

// CPU a request of the server's processes (the follower's Litestream included), and of others, over the hold.
async function usersCost(run: Run, url: string, pids: () => number[], others = () => [] as number[]) {
  const holdS = run.quick ? 20 : 60
  const deadlines = { arriveMs: 150_000, doneMs: (holdS + 60) * 1000, name: url }
  const users = startUsers({ url, users: HOLD_USERS, tokens: run.seed.tokens, ramp: 10, hold: holdS, deadlines })
  try {
    const arrival = await users.arrived()
    if (arrival.failure) throw arrival.failure
    const before = [ticks(pids), ticks(others)]
    const tally = await users.done()
    if (tally.failure) throw tally.failure
    const [cpu, othersCpu] = [ticks(pids) - before[0], ticks(others) - before[1]].map((t) => t * TICK_US)
    const at = (q: number) =>
      tally.latencies[Math.min(tally.latencies.length - 1, Math.floor(q * tally.latencies.length))]
    return {
      rps: tally.answered / tally.seconds,
      cpu_us: cpu / tally.answered,
      others_cpu_us: othersCpu / tally.answered,
      p50_ms: at(0.5),
      p99_ms: at(0.99),
      errors: tally.errors,
      example: tally.example ?? '',
      load_cpu: Math.max(...tally.generatorCpu),
    } satisfies Saturation
  } finally {
    users.stop()
  }
}

// 3. One like at a time, forwarded by the follower, then sent to the primary; 4. lag, idle and at the
// challenge's write rate, with the CPU each Litestream spends at it.
async function writesAndLag(run: Run, { n, primary, follower, followerDb }: Pair & { n: number }) {
  const { quick } = run
  const litestreamOf = (server: Server) => () => ticksOf(server.pid, true)
  const apiOf = (server: Server) => () => ticksOf(server.pid, false)
  const counters = [apiOf(follower), litestreamOf(follower), apiOf(primary), litestreamOf(primary)]
  const count = n === 0 ? (quick ? 10 : 40) : quick ? 20 : 100
  const forwarded = await oneAtATime(run.tokens, follower.url, count, counters)
  const direct = await oneAtATime(run.tokens, primary.url, count, counters)
  console.log(
    '  3. one like at a time ' +
      '(CPU us per write: follower API, follower Litestream, primary API, primary Litestream)',
  )
  for (const [name, r] of Object.entries({ 'to the follower': forwarded, 'to the primary': direct })) {
    console.log(`     ${name.padEnd(16)} ${writeText(r)}`)
  }
  const idle = await lag(run.tokens, primary.url, followerDb, { posts: quick ? 5 : 20 })
  const rateCounters = [litestreamOf(primary), litestreamOf(follower), apiOf(follower)]
  const atRate = await lag(
    run.tokens,
    primary.url,
    followerDb,
    { rate: WRITE_RATE, seconds: quick ? 5 : 20 },
    rateCounters,
  )
  console.log(`  4. from a post's 201 on the primary to the follower's file: idle ${lagText(idle)}`)
  console.log(
    `     at the challenge's write rate (${fmt(atRate.writes_per_s)} writes/s): ${lagText(atRate)}; ` +
      `CPU: the primary's Litestream ${fmt(atRate.cpu_per_s[0] * 100, 1)}% of a core, ` +
      `the follower's ${fmt(atRate.cpu_per_s[1] * 100, 1)}%, ` +
      `the follower's Node ${fmt(atRate.cpu_per_s[2] * 100, 1)}%`,
  )
  const errors = idle.errors + idle.not_seen_in_10_s + atRate.errors + atRate.not_seen_in_10_s
  return { result: { write: { forwarded, direct }, lag_idle: idle, lag_at_write_rate: atRate }, errors }
}

// The figures to choose a setting by, from this run.
function summary(report: Record<string, any>) {
  const [defaults] = SYNC_SETTINGS.map((s) => report.settings[s.name])
  const statement = defaults.statement
  const { mix, users } = defaults
  console.log(
    `\na follower against a plain file: the post statement ${fmt((statement.follower.node_us + statement.follower.replication_us) / statement.plain.node_us, 2)} x, ` +
      `the mix ${fmt(mix.follower.cpu_us / mix['plain file'].cpu_us, 2)} x the CPU a request at saturation, ` +
      `${fmt(users.follower.cpu_us / users['plain file'].cpu_us, 2)} x at ${fmt(HOLD_USERS)} users`,
  )
  console.log(
    `a follower against its primary, each with its Litestream: the mix ${fmt(mix.follower.cpu_us / mix.primary.cpu_us, 2)} x at saturation, ` +
      `${fmt(users.follower.cpu_us / users.primary.cpu_us, 2)} x at ${fmt(HOLD_USERS)} users`,
  )
  console.log(
    `   ${'setting'.padEnd(32)} ${'forwarded like p50 / p99'.padEnd(26)} ${'lag idle p50 / p99'.padEnd(22)} ${`lag at ${WRITE_RATE} writes/s`.padEnd(22)} primary's Litestream at it`,
  )
  for (const setting of SYNC_SETTINGS) {
    const r = report.settings[setting.name]
    const pair = (a: number, b: number) => `${fmt(a, 1)} / ${fmt(b, 1)} ms`
    console.log(
      `   ${setting.name.padEnd(32)} ${pair(r.write.forwarded.p50_ms, r.write.forwarded.p99_ms).padEnd(26)} ${pair(r.lag_idle.p50_ms, r.lag_idle.p99_ms).padEnd(22)} ` +
        `${pair(r.lag_at_write_rate.p50_ms, r.lag_at_write_rate.p99_ms).padEnd(22)} ${fmt(r.lag_at_write_rate.cpu_per_s[0] * 100, 1)}% of a core`,
    )
  }
}

const OPTIONS = { quick: { type: 'boolean', default: false }, flags: { type: 'string' } } as const

// --cluster: the followers measured, into a results file; fails on any bad response.
export async function main(argv: string[]) {
  const { values: args } = parseArgs({ args: argv, options: OPTIONS })
  const { seed, flags } = prepare(args.flags)
  const commit = commitOf(ROOT)
  const machine = `${cpus()[0].model} x${cpus().length}`
  console.log(`bench ${new Date().toISOString()}: commit ${commit}, Node ${process.version}, ${machine}`)
  const { report, errors } = await clusterBench({ seed, quick: args.quick, flags })
  const file = resultsFile(commit, 'cluster')
  const results = { date: new Date().toISOString(), commit, node: process.version, quick: args.quick, ...report }
  writeFileSync(file, JSON.stringify(results, null, 2))
  console.log(`\nresults: ${file}`)
  if (errors) console.log(red(`${errors} bad responses`))
  process.exitCode = errors ? 1 : 0
}
