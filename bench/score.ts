// npm run bench -- --score [--full]: the challenge's score, found the way the challenge finds it, in the
// box's limits on this machine (bench/README.md, "The score").
//
//   npm run bench -- --score [--full] [--record] [--flags=<node flags>]
//   npm run bench -- --score --full --confirm-from <users>   only its warm-up and confirmation, from there down
//   npm run bench -- --score --full --resume <its log>       an interrupted run, on from its last level
//   npm run bench -- --score --processes 1,3,5 [--users 15000] [--rounds 3] [--against-flags=<flags>]
//                                                            the same users held by 1, 3 and 5 processes
//   npm run bench -- --score --k6 <k6 binary>                its users generator against the real k6, at 10,000 users
//
// The challenge: 1,000 users for 2 minutes as a warm-up; then from 2,500 users, doubling until a level
// fails, then narrowing to within 250; the best level confirmed by a 5-minute hold (after a 60 s ramp),
// and where it fails, the narrowing done again below it on 5-minute holds.
// A level passes at p95 < 500 ms, p99 < 1 s and under 1% failed requests. Here every user is one
// keep-alive connection running the challenge's loop (bench/users.ts), the server runs as shipped on one
// core, the users on the other, and a memory cgroup holds the server to what the box leaves it.
import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { appendFileSync, existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { cpuTicks, processTree, TICK_US } from '../harness/proc.ts'
import { CACHE, type Seed } from '../harness/seed.ts'
import type { Server } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { type Arrival, startUsers, type Tally, USER_RATE } from './hold.ts'
import { benchServer, commitOf, fmt, LOAD_CORE, log, median, prepare, RESULTS, resultsFile, WORKDIR } from './lib.ts'
import { SCORE_FILE, scoreLine } from './report.ts'
import { saturate, settingsOf, type Variant } from './saturation.ts'

// A 2 GB droplet's kernel shows about 1,967 MiB; Ubuntu 24.04 at rest holds about 320 MiB of it (systemd
// and journald, snapd, multipathd, the droplet agent, sshd): our estimate of what is left for the
// server, its page cache and the kernel memory its sockets take.
const BOX_MEMORY_MB = 1650
const BOX_FILES = 65_535 // LimitNOFILE of the challenge's systemd unit
const STEP = 250

type Limit = 'cpu' | 'memory' | 'files' | 'latency' | 'errors'
type Level = {
  users: number
  phase: string
  ramp_s: number
  hold_s: number
  requests: number
  rate: number
  p95_ms: number
  p99_ms: number
  failed: number
  errors: number
  error_example: string
  server_cpu: number
  cpu_us: number
  generator_cpu: number
  memory_peak_mb: number
  processes: number
  // The peak of what the kernel cannot reclaim: all of it but the page cache (MiB). Over the box's memory
  // the level fails, as an OOM kill fails it on the box, where the page cache is reclaimed first too.
  memory_held_mb: number
  // At the peak: the processes' anonymous memory, the page cache and the socket buffers charged (MiB).
  memory_at_peak: { rss_mb: number; cache_mb: number; sockets_mb: number; kernel_mb: number }
  pass: boolean
  limit?: Limit
}

const round = (n: number) => Math.max(STEP, Math.round(n / STEP) * STEP)
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

// k6's percentile of a Trend: linear between the two closest ranks.
export function k6Percentile(sorted: number[], p: number) {
  if (sorted.length === 0) return 0
  const rank = (p / 100) * (sorted.length - 1)
  const low = Math.floor(rank)
  return sorted[low] + (sorted[Math.min(low + 1, sorted.length - 1)] - sorted[low]) * (rank - low)
}

// A cgroup v1 memory group of BOX_MEMORY_MB for one level, socket buffers counted (v1 charges them only
// once their own limit is set). The kernel kills inside it on going over, as on the box.
function boxCgroup(name: string) {
  const dir = `/sys/fs/cgroup/memory/feed-score-${process.pid}-${name}`
  const limit = String(BOX_MEMORY_MB * 1024 * 1024)
  try {
    mkdirSync(dir)
    writeFileSync(join(dir, 'memory.limit_in_bytes'), limit)
    writeFileSync(join(dir, 'memory.kmem.tcp.limit_in_bytes'), limit)
  } catch (error) {
    return {
      note: `no memory cgroup (${(error as Error).message.split(':')[0]}): memory not limited`,
      charged: () => 0,
      parts: () => undefined,
      oomKills: () => 0,
      remove: () => {},
    }
  }
  const read = (file: string) => Number(readFileSync(join(dir, file), 'utf8'))
  return {
    dir,
    note: `memory cgroup of ${fmt(BOX_MEMORY_MB)} MiB, socket buffers included`,
    charged: () => read('memory.usage_in_bytes') + read('memory.kmem.tcp.usage_in_bytes'),
    parts: () => {
      const stat = readFileSync(join(dir, 'memory.stat'), 'utf8')
      const field = (name: string) => Number(new RegExp(`^total_${name} (\\d+)`, 'm').exec(stat)?.[1] ?? 0) / 2 ** 20
      const usage = read('memory.usage_in_bytes') / 2 ** 20
      return {
        rss_mb: field('rss'),
        cache_mb: field('cache'),
        sockets_mb: read('memory.kmem.tcp.usage_in_bytes') / 2 ** 20,
        kernel_mb: usage - field('rss') - field('cache'), // the rest of what is charged: the kernel's own objects
      }
    },
    oomKills: () => Number(/oom_kill (\d+)/.exec(readFileSync(join(dir, 'memory.oom_control'), 'utf8'))?.[1] ?? 0),
    remove: () => {
      for (let i = 0; i < 50; i++) {
        try {
          return rmdirSync(dir)
        } catch {
          execFileSync('sleep', ['0.1'])
        }
      }
    },
  }
}

// Progress: one line that updates on a terminal; plain lines in the log, and on stderr when it is not a
// terminal, one a phase.
function progress(logFile: string, started: number) {
  let lastPhase = ''
  return {
    say(line: string, phase: string) {
      appendFileSync(logFile, `${new Date().toISOString()} ${line}\n`)
      if (process.stderr.isTTY) process.stderr.write(`\r\x1b[2K${line}`)
      else if (phase !== lastPhase) log(line)
      lastPhase = phase
    },
    done() {
      if (process.stderr.isTTY) process.stderr.write('\r\x1b[2K')
    },
    elapsed: () => (performance.now() - started) / 1000,
  }
}

const clock = (s: number) => `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s`

// What failed first in a level that failed: memory (the cgroup killed, or would have), files, the core
// (over 90% busy), failed requests (or a generator or the server died); else latency: p95 or p99 over
// the line with every request answered and the core under 90% on average.
export function limitOf(level: {
  outOfMemory: boolean
  said: string
  server_cpu: number
  failed: number
  complete: boolean
}): Limit {
  if (level.outOfMemory) return 'memory'
  if (/EMFILE|too many open files/i.test(level.said)) return 'files'
  if (level.server_cpu > 0.9) return 'cpu'
  if (level.failed >= 0.01 || !level.complete) return 'errors'
  return 'latency'
}

type Lengths = { ramp: number; hold: number }
type Progress = ReturnType<typeof progress>

// A score run as it goes: the server's seed and flags, the levels so far (each also a line of the log),
// the progress line, and how long is left of the run besides the level under way.
// `replay`: the levels an interrupted run measured, taken again in its order instead of measured anew.
export type Scoring = {
  seed: Seed
  flags: string[]
  levels: Level[]
  replay: Level[]
  logFile: string
  p: Progress
  remaining: () => number
}

// The challenge's lengths with --full; shorter by default, to fit in about 20 minutes.
const lengthsOf = (full: boolean) => ({
  warmup: full ? { ramp: 30, hold: 120 } : { ramp: 15, hold: 30 },
  search: full ? { ramp: 60, hold: 60 } : { ramp: 30, hold: 30 },
  confirm: full ? { ramp: 60, hold: 300 } : { ramp: 60, hold: 60 },
})
const levelSeconds = (l: Lengths) => l.ramp + l.hold + 15
// The search's levels from 2,500 to the expected score, doubling.
const doublingsTo = (expected: number) => Math.max(1, Math.ceil(Math.log2(expected / 2500)) + 1)

export async function scoreBench({
  seed,
  flags,
  full,
  estimate,
  commit,
  confirmFrom,
  resume,
}: {
  seed: Seed
  flags: string[]
  full: boolean
  commit: string
  // Skip the search and the narrowing: the confirmation starts here (a level an earlier run found).
  confirmFrom?: number
  // The log of an interrupted run of the same commit and settings: its levels are taken, not measured.
  resume?: string
  estimate: { users: number; mix_rps: number; mix_cpu_us: number; c0_us: number }
}) {
  mkdirSync(RESULTS, { recursive: true })
  const run = { commit, full, flags, confirmFrom: confirmFrom ?? null }
  const logFile = resume ?? join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commit}-score.log`)
  const replay = resume ? levelsOfLog(resume, run) : []
  if (!resume) appendFileSync(logFile, `${JSON.stringify({ run })}\n`)
  const p = progress(logFile, performance.now())
  const s: Scoring = { seed, flags, levels: [], replay, logFile, p, remaining: () => 0 }
  if (resume) log(`score: resuming ${resume}: ${replay.length} level${replay.length === 1 ? '' : 's'} measured already`)
  const lengths = lengthsOf(full)
  const probe = boxCgroup('probe')
  probe.remove()
  log(
    `score: the server on one core (taskset), ${probe.note}; users on the other core; ` +
      `${full ? "the challenge's lengths (--full)" : "shorter lengths than the challenge's (--full for those)"}`,
  )
  const expected = Math.max(2500, estimate.users)
  s.remaining = () => levelSeconds(lengths.search) * (doublingsTo(expected) + 4) + levelSeconds(lengths.confirm)
  await level(s, 1000, 'warm-up', lengths.warmup)
  const { passed, resolution } = await search(s, { full, lengths, confirmFrom, expected })
  const { score, confirmed } = await confirm(s, { from: passed, resolution, lengths })
  // Processes: the box holds 65,535 files a process, this machine 20,000. Where the score needed more
  // processes here than it would there, the same users in both ways, one after the other.
  const cost = await processesCost(s, score, confirmed, lengths.search)
  s.p.done()
  return reportScore(s, { score, confirmed, cost, estimate, full })
}

// The levels, the memory and the estimate printed; the score as bench/score.json records it.
function reportScore(
  s: Scoring,
  {
    score,
    confirmed,
    cost,
    estimate,
    full,
  }: {
    score: number
    confirmed?: Level
    cost: Awaited<ReturnType<typeof processesCost>>
    estimate: { users: number; mix_rps: number }
    full: boolean
  },
) {
  printLevels(s.levels)
  console.log('')
  console.log(`measured in ${clock(s.p.elapsed())}: log ${s.logFile}`)
  if (cost) console.log(cost.line)
  const binds = printMemory(s.levels, score, confirmed)
  console.log(
    `estimate from CPU alone, beside it: 0.8 x ${fmt(estimate.mix_rps)} mix req/s / ${USER_RATE} = ` +
      `${fmt(estimate.users)} users on one core of this machine`,
  )
  const line = scoreText(s.levels, score, confirmed)
  console.log(line)
  const box = { memory_mb: BOX_MEMORY_MB, files: BOX_FILES }
  const scored = confirmed?.pass ? score : 0
  return {
    box,
    full,
    levels: s.levels,
    score: scored,
    confirmed,
    processes_cost: cost,
    memory_binds_users: binds,
    line,
  }
}

type Search = { full: boolean; lengths: ReturnType<typeof lengthsOf>; confirmFrom?: number; expected: number }

// Doubling from 2,500 while each level passes, then narrowing: halving the bracket until it is within
// 250 users (--full), or an eighth of the best. --confirm-from skips both. Gives the best level passed,
// and the step the confirmation starts stepping down by.
export async function search(s: Scoring, { full, lengths, confirmFrom, expected }: Search) {
  const { search: searching, confirm } = lengths
  const doublings = () => doublingsTo(expected)
  let passed = confirmFrom ?? 0
  let failedAt = confirmFrom ?? 0
  if (confirmFrom)
    log(`score: no search and no narrowing (--confirm-from): the confirmation starts at ${fmt(confirmFrom)} users`)
  for (let users = 2500, n = 0; !confirmFrom; users *= 2, n++) {
    s.remaining = () => levelSeconds(searching) * (Math.max(0, doublings() - n - 1) + 4) + levelSeconds(confirm)
    const result = await level(s, users, 'search', searching)
    if (!result.pass) {
      failedAt = users
      break
    }
    passed = users
  }
  const resolution = full || confirmFrom ? STEP : round(passed / 8)
  const steps = () => Math.max(0, Math.ceil(Math.log2(Math.max(1, (failedAt - passed) / resolution))))
  while (failedAt - passed > resolution) {
    s.remaining = () => levelSeconds(searching) * (steps() - 1) + levelSeconds(confirm)
    const users = round((passed + failedAt) / 2)
    if (users <= passed || users >= failedAt) break
    const result = await level(s, users, 'narrowing', searching)
    if (result.pass) passed = users
    else failedAt = users
  }
  return { passed, resolution }
}

// The confirmation: the best level of the search, held for the challenge's 5 minutes. Where it fails, the
// step down doubles (250, 500, 1,000, ...) until a level holds, then the bracket between it and the lowest
// level that failed is halved to within the resolution, every level held 5 minutes: the challenge's own
// narrowing, on its own lengths, where a step of 250 at a time could take hours.
export async function confirm(
  s: Scoring,
  { from, resolution, lengths }: { from: number; resolution: number; lengths: ReturnType<typeof lengthsOf> },
) {
  const tried = (users: number) => level(s, users, 'confirmation', lengths.confirm)
  let held: Level | undefined
  let last: Level | undefined
  let failedAt = Infinity
  for (let users = from, step = resolution; !held && users > 0; users -= step, step *= 2) {
    s.remaining = () => levelSeconds(lengths.confirm)
    last = await tried(users)
    if (last.pass) held = last
    else failedAt = users
  }
  while (held && failedAt - held.users > resolution) {
    const steps = Math.ceil(Math.log2((failedAt - held.users) / resolution))
    s.remaining = () => levelSeconds(lengths.confirm) * steps
    const users = round((held.users + failedAt) / 2)
    if (users <= held.users || users >= failedAt) break
    const result = await tried(users)
    if (result.pass) held = result
    else failedAt = users
  }
  return { score: held?.users ?? 0, confirmed: held ?? last }
}

// One level: the server as shipped (its Node flags, WORKERS unset) on the server core, in a box's
// cgroup, under a limit of open files when given one; the users on the other core (bench/hold.ts).
async function level(s: Scoring, users: number, phase: string, lengths: Lengths, nofile?: number): Promise<Level> {
  const { ramp, hold } = lengths
  const recorded = s.replay.shift()
  if (recorded) {
    if (recorded.users !== users || recorded.phase !== phase) {
      throw new Error(
        `--resume: the log's next level is ${recorded.phase} at ${recorded.users}, the run's ${phase} at ${users}`,
      )
    }
    s.levels.push(recorded)
    return recorded
  }
  const cgroup = boxCgroup(String(s.levels.length))
  const node = nofile ? 'prlimit' : process.execPath
  const nodeFlags = nofile ? [`--nofile=${nofile}`, process.execPath, ...s.flags] : s.flags
  const shipped = { node, flags: nodeFlags, seed: s.seed, cgroup: cgroup.dir, env: { HOST: '0.0.0.0' } }
  const server: Server = await benchServer(join(ROOT, 'dist', 'app.js'), shipped)
  const levelStarted = performance.now()
  // The copy of the seed was written from here: out of the page cache with it, so that the server's
  // reads are charged to its cgroup, as the box's page cache is to the box.
  execFileSync('dd', [`if=${join(WORKDIR, 'feed.db')}`, 'iflag=nocache', 'count=0', 'status=none'])
  const usersHold = startUsers({ url: server.url, users, tokens: s.seed.tokens, ramp, hold })
  const memory = memoryWatch(cgroup, server.pid)
  const cpu = cpuWatch(server.pid)
  const phaseOf = { name: 'ramp', started: performance.now() }
  const sample = () => {
    memory.sample()
    cpu.sample()
    const inPhase = (performance.now() - phaseOf.started) / 1000
    const length = phaseOf.name === 'ramp' ? ramp : hold
    const processes = memory.processes
    const left = s.remaining() + Math.max(0, ramp + hold - (performance.now() - levelStarted) / 1000)
    s.p.say(
      `${phase}: ${fmt(users)} users, ${phaseOf.name} ${fmt(Math.min(inPhase, length))}/${length} s, ` +
        `${processes} process${processes > 1 ? 'es' : ''}, ${fmt(memory.peak / 2 ** 20)} MiB; ` +
        `${clock(s.p.elapsed())} elapsed, about ${clock(left)} left`,
      `${phase} ${users} ${phaseOf.name}`,
    )
  }
  const sampler = setInterval(sample, 1000)
  try {
    const arrival = await usersHold.arrived()
    Object.assign(phaseOf, { name: 'hold', started: performance.now() })
    cpu.start()
    const holdStarted = performance.now()
    const tally = await usersHold.done()
    const wall = (performance.now() - holdStarted) / 1000
    const cpuUs = cpu.used() * TICK_US
    sample()
    const result = levelOf({ users, phase, ramp, hold }, { arrival, tally, wall, cpuUs, memory, server, cgroup })
    s.levels.push(result)
    appendFileSync(s.logFile, `${JSON.stringify(result)}\n`)
    return result
  } finally {
    clearInterval(sampler)
    usersHold.stop()
    await server.stop().catch(() => {})
    cgroup.remove()
  }
}

// The levels of an interrupted run's log (one JSON line each, after the run's own), refused where the
// log is of another commit or other settings: its search would not be this one's.
export function levelsOfLog(file: string, run: object) {
  const lines = readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line))
  const [first, ...levels] = lines
  if (JSON.stringify(first?.run) !== JSON.stringify(run)) {
    throw new Error(`--resume: ${file} is a run of ${JSON.stringify(first?.run)}, not of ${JSON.stringify(run)}`)
  }
  return levels as Level[]
}

// The cgroup's memory at its peak, what it held that the kernel cannot reclaim, and the server's
// processes at most, sampled.
function memoryWatch(cgroup: ReturnType<typeof boxCgroup>, pid: number) {
  const watch = {
    peak: 0,
    held: 0,
    atPeak: { rss_mb: 0, cache_mb: 0, sockets_mb: 0, kernel_mb: 0 } as Level['memory_at_peak'],
    processes: 0,
    sample: () => {
      try {
        const charged = cgroup.charged()
        const parts = cgroup.parts()
        if (charged > watch.peak) ((watch.peak = charged), (watch.atPeak = parts ?? watch.atPeak))
        if (parts) watch.held = Math.max(watch.held, parts.rss_mb + parts.kernel_mb + parts.sockets_mb)
        watch.processes = Math.max(watch.processes, processTree(pid).length)
      } catch {} // the server gone: said by the level
    },
  }
  return watch
}

type Held = {
  arrival: Arrival
  tally: Tally
  wall: number
  cpuUs: number
  memory: ReturnType<typeof memoryWatch>
  server: Server
  cgroup: ReturnType<typeof boxCgroup>
}

// A level's figures, and whether it passed: p95 < 500 ms, p99 < 1 s, under 1% failed, every generator
// and the server alive to the end, and within the box's memory.
type At = { users: number; phase: string; ramp: number; hold: number }

function levelOf(at: At, { arrival, tally, wall, cpuUs, memory, server, cgroup }: Held): Level {
  const failed = tally.sent + arrival.failedToConnect ? tally.errors / (tally.sent + arrival.failedToConnect) : 1
  const serverDied = server.child.exitCode !== null || server.child.signalCode !== null
  const output = server.stdout() + server.stderr()
  const result: Level = {
    users: at.users,
    phase: at.phase,
    ramp_s: at.ramp,
    hold_s: at.hold,
    requests: tally.sent,
    rate: tally.sent / wall,
    p95_ms: k6Percentile(tally.latencies, 95),
    p99_ms: k6Percentile(tally.latencies, 99),
    failed,
    errors: tally.errors,
    error_example: tally.example ?? tally.failure?.message ?? '',
    server_cpu: cpuUs / (wall * 1e6),
    cpu_us: cpuUs / Math.max(1, tally.answered),
    generator_cpu: tally.generatorCpu.reduce((total, cpu) => total + cpu, 0),
    memory_peak_mb: memory.peak / 2 ** 20,
    processes: memory.processes,
    memory_at_peak: memory.atPeak,
    memory_held_mb: memory.held,
    pass: false,
  }
  // Killed, or over the box's memory, or held back by the server's memory guard (server/memory.ts),
  // whose refused and closed connections count as failed requests above.
  const guarded = /^memory: .*(taking no more|closing idle)/m.test(output)
  const killed = cgroup.oomKills() > 0 || server.child.signalCode === 'SIGKILL'
  const outOfMemory = killed || memory.held > BOX_MEMORY_MB || guarded
  const complete = !tally.failure && !serverDied
  result.pass = complete && !outOfMemory && result.p95_ms < 500 && result.p99_ms < 1000 && failed < 0.01
  if (!result.pass) {
    result.limit = limitOf({
      outOfMemory,
      said: output + result.error_example,
      server_cpu: result.server_cpu,
      failed,
      complete,
    })
  }
  return result
}

// A limit of open files that splits `users` over `processes` (none for one: it holds them all here).
const nofileFor = (users: number, processes: number) =>
  processes === 1 ? undefined : Math.ceil(users / processes / 0.85) + 64

// --processes: the same users held by each number of processes in turn (a lower limit of open files
// splits them), with each set of flags given, rounds in alternating order; CPU a request against one
// process's, each round's pair alone, and the medians.
async function processesBench({
  seed,
  flagSets,
  commit,
  counts,
  users,
  rounds,
}: {
  seed: Seed
  flagSets: string[][]
  commit: string
  counts: number[]
  users: number
  rounds: number
}) {
  const logFile = join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commit}-processes.log`)
  const lengths = lengthsOf(true).search
  const runs: { round: number; flags: string; count: number; level: Level }[] = []
  const variants = flagSets.flatMap((flags) => counts.map((count) => ({ flags, count })))
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 ? [...variants].reverse() : variants
    for (const { flags, count } of order) {
      const s: Scoring = {
        seed,
        flags,
        levels: [],
        replay: [],
        logFile,
        p: progress(logFile, performance.now()),
        remaining: () => 0,
      }
      const held = await level(s, users, `${count} process${count > 1 ? 'es' : ''}`, lengths, nofileFor(users, count))
      runs.push({ round, flags: flags.join(' '), count, level: held })
    }
  }
  console.log(`${fmt(users)} users, ${lengths.ramp} s ramp, ${lengths.hold} s hold, ${rounds} rounds; medians:`)
  const lines = variants.map(({ flags, count }) => {
    const mine = runs.filter((r) => r.count === count && r.flags === flags.join(' '))
    const ratios = mine.map((r) => {
      const one = runs.find((o) => o.round === r.round && o.flags === r.flags && o.count === counts[0])!
      return r.level.cpu_us / one.level.cpu_us
    })
    const line = {
      flags: flags.join(' '),
      processes: count,
      held_by: median(mine.map((r) => r.level.processes)),
      cpu_us: median(mine.map((r) => r.level.cpu_us)),
      p99_ms: median(mine.map((r) => r.level.p99_ms)),
      memory_peak_mb: median(mine.map((r) => r.level.memory_peak_mb)),
      ratio: median(ratios),
      ratios,
      passed: mine.every((r) => r.level.pass),
    }
    console.log(
      `  ${line.flags || '(no flags)'}, ${count} process${count > 1 ? 'es' : ''} (${line.held_by} seen): ` +
        `${fmt(line.cpu_us, 1)} us a request, ${fmt(line.ratio, 3)} x ${counts[0]}'s (rounds ${ratios.map((r) => fmt(r, 3)).join(', ')}), ` +
        `p99 ${fmt(line.p99_ms, 1)} ms, ${fmt(line.memory_peak_mb)} MiB${line.passed ? '' : ', a hold FAILED'}`,
    )
    return line
  })
  return { users, rounds, lengths, lines, runs }
}

async function processesCost(s: Scoring, users: number, at: Level | undefined, lengths: Lengths) {
  if (!at) return undefined
  const here = at.processes
  const onBox = Math.ceil(users / (BOX_FILES * 0.9))
  const counted = `processes: ${here} here, ${onBox} on the box (65,535 files each)`
  if (here <= onBox) return { here, on_box: onBox, line: `${counted}: the same` }
  // The cost of the extra processes, at a level one process holds here: one, then as many as the score
  // needed, with a limit of files that splits the same users so.
  const same = Math.min(users, 15_000)
  const one = await level(s, same, 'one process', lengths)
  const many = await level(s, same, `${here} processes`, lengths, nofileFor(same, here))
  const ratio = many.cpu_us / one.cpu_us
  return {
    here,
    on_box: onBox,
    users: same,
    one,
    many,
    cpu_ratio: ratio,
    line:
      `${counted}; ${fmt(same)} users in ${many.processes} processes cost ` +
      `${fmt(ratio, 2)} x the CPU a request of one (${fmt(many.cpu_us, 1)} against ${fmt(one.cpu_us, 1)} us), ` +
      `${fmt(many.memory_peak_mb)} against ${fmt(one.memory_peak_mb)} MiB`,
  }
}

// Memory a user, all in: at the score and at the best level below it, beyond the warm-up's 1,000; gives
// the users at which the memory guard would bind at the score's rate.
function printMemory(levels: Level[], score: number, confirmed: Level | undefined) {
  const warm = levels[0]
  const below = levels
    .filter((l) => l.pass && l.users < score && l.users > warm.users)
    .sort((a, b) => b.users - a.users)[0]
  let binds: number | undefined
  for (const l of [confirmed, below]) {
    if (!l?.pass) continue
    const m = l.memory_at_peak
    const perUser = ((l.memory_peak_mb - warm.memory_peak_mb) * 1024) / (l.users - warm.users)
    console.log(
      `memory at ${fmt(l.users)} users: ${fmt(l.memory_peak_mb)} MiB at peak (processes ${fmt(m.rss_mb)}, page cache ${fmt(m.cache_mb)}, ` +
        `socket buffers ${fmt(m.sockets_mb)}, kernel ${fmt(m.kernel_mb)}): ${fmt(perUser, 1)} KB a user beyond the warm-up's`,
    )
    // The server's guard takes no more connections with a tenth of the box's memory free.
    binds ??= Math.floor(warm.users + ((BOX_MEMORY_MB * 0.9 - warm.memory_peak_mb) * 1024) / perUser)
  }
  if (binds) {
    console.log(
      `memory binds near ${fmt(binds)} users at that rate: there the memory guard takes no more connections ` +
        `(a tenth of ${fmt(BOX_MEMORY_MB)} MiB free)`,
    )
  }
  return binds
}

// The score's line, as bench/score.json and the chart keep it.
function scoreText(levels: Level[], score: number, confirmed: Level | undefined) {
  const nextFailed = levels.filter((l) => !l.pass && l.users > score).sort((a, b) => a.users - b.users)[0]
  const holdText = `${clock(confirmed?.hold_s ?? 0).replace(/m00s$/, ' min')} hold`
  const tail = nextFailed ? `next level failed on ${nextFailed.limit}` : 'no level failed'
  if (!confirmed?.pass) return `score: 0 users (no level passed its confirmation); ${tail}`
  const { p95_ms, p99_ms, failed } = confirmed
  const figures = `p95 ${fmt(p95_ms, 1)} ms, p99 ${fmt(p99_ms, 1)} ms, ${fmt(failed * 100, 2)}% failed`
  return `score: ${score} users (${holdText}, ${figures}); ${tail}`
}

// The CPU of every process of the server since start(), read at each sample (every second): a process
// that exits before the end (a helper, once the users have gone and its last connection with them)
// keeps what it had used at its last reading, where a reading of the tree at the end would lose all
// of it (a confirmation of 5 processes read 40 us a request so). A process born after start() counts
// from its birth.
function cpuWatch(pid: number) {
  const last = new Map<number, number>()
  const base = new Map<number, number>()
  const sample = () => {
    for (const p of processTree(pid)) {
      try {
        last.set(p, cpuTicks(p).total)
      } catch {} // gone meanwhile: its last reading stands
    }
  }
  return {
    sample,
    start() {
      sample()
      base.clear()
      for (const [p, ticks] of last) base.set(p, ticks)
    },
    used() {
      sample()
      let ticks = 0
      for (const [p, now] of last) ticks += now - (base.get(p) ?? 0)
      return ticks
    },
  }
}

function printLevels(levels: Level[]) {
  const header = [
    'phase',
    'users',
    'requests',
    'req/s',
    'p95 ms',
    'p99 ms',
    'failed',
    'server CPU',
    'us/req',
    'load CPU',
    'MiB peak',
    'MiB held',
    'processes',
    'result',
  ]
  const lines = levels.map((l) => [
    l.phase,
    fmt(l.users),
    fmt(l.requests),
    fmt(l.rate),
    fmt(l.p95_ms, 1),
    fmt(l.p99_ms, 1),
    `${fmt(l.failed * 100, 2)}%`,
    `${fmt(l.server_cpu * 100)}%`,
    fmt(l.cpu_us, 1),
    `${fmt(l.generator_cpu * 100)}%`,
    fmt(l.memory_peak_mb),
    fmt(l.memory_held_mb),
    String(l.processes),
    l.pass ? 'pass' : `FAIL: ${l.limit}`,
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const row = (cells: string[]) =>
    cells.map((c, i) => (i === 0 || i === cells.length - 1 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')
  console.log(row(header))
  for (const l of lines) console.log(row(l))
}

// The users generator against the real k6 at one level both can drive: the same users, ramp and hold,
// each on a fresh server in the same limits, both measured over the hold only (k6's from its CSV of
// every request), with k6's own CPU beside it: a k6 that cannot keep its users' pace measures itself.
type Check = { seed: Seed; flags: string[]; k6: string; users: number; ramp: number; hold: number }

export async function k6Check({
  users = 10_000,
  ramp = 60,
  hold = 60,
  ...rest
}: Partial<Check> & Omit<Check, 'users' | 'ramp' | 'hold'>) {
  const check: Check = { users, ramp, hold, ...rest }
  const k6Result = await k6Hold(check)
  const ours = await oursHold(check)
  console.log(`${fmt(users)} users, ${ramp} s ramp, ${hold} s hold, both over the hold:`)
  const said = (r: typeof ours) =>
    `${fmt(r.rate)} req/s (${fmt(r.requests)} requests), p95 ${fmt(r.p95_ms, 2)} ms, p99 ${fmt(r.p99_ms, 2)} ms, ${fmt(r.failed * 100, 2)}% failed`
  console.log(`  k6 ${said(k6Result)}, k6's CPU ${fmt(k6Result.cpu * 100)}% of its core (exit ${k6Result.exit})`)
  console.log(`  bench/users.ts ${said(ours)}`)
  console.log(`  expected: ${fmt(users * USER_RATE)} req/s (${fmt(users)} x ${USER_RATE})`)
  return { users, ramp, hold, k6: k6Result, ours }
}

// k6 (load.js) on the load core against a server in the box's limits; its CPU sampled every second
// (taskset execs k6: the same process).
async function k6Hold({ seed, flags, k6, users, ramp, hold }: Check) {
  const tokens = join(CACHE, `k6-tokens-${process.pid}.json`)
  writeFileSync(
    tokens,
    JSON.stringify(
      readFileSync(seed.tokens, 'utf8')
        .trim()
        .split('\n')
        .map((token) => ({ token })),
    ),
  )
  const csv = join(CACHE, `k6-requests-${process.pid}.csv`)
  const cgroup = boxCgroup('k6')
  const server = await benchServer(join(ROOT, 'dist', 'app.js'), {
    flags,
    seed,
    cgroup: cgroup.dir,
    env: { HOST: '0.0.0.0' },
  })
  try {
    const child = runK6(
      k6,
      { BASE_URL: server.url, VUS: String(users), RAMP_UP: `${ramp}s`, DURATION: `${hold}s`, TOKENS: tokens },
      csv,
    )
    const cpu: [number, number][] = []
    const sampler = setInterval(() => {
      try {
        cpu.push([Date.now() / 1000, cpuTicks(child.pid!).total])
      } catch {} // it has ended
    }, 1000)
    const [code] = await once(child, 'exit')
    clearInterval(sampler)
    if (!existsSync(csv)) throw new Error(`k6 exited with ${code} and wrote no ${csv}`)
    const { from, requests, failed, durations } = readK6Csv(csv, ramp, hold)
    const near = (t: number) =>
      cpu.reduce((best, sample) => (Math.abs(sample[0] - t) < Math.abs(best[0] - t) ? sample : best))
    const [a, b] = [near(from), near(from + hold)]
    return {
      exit: code,
      requests,
      rate: requests / hold,
      p95_ms: k6Percentile(durations, 95),
      p99_ms: k6Percentile(durations, 99),
      failed: failed / Math.max(1, requests),
      cpu: ((b[1] - a[1]) * TICK_US) / 1e6 / Math.max(1, b[0] - a[0]),
    }
  } finally {
    await server.stop()
    cgroup.remove()
    rmSync(tokens, { force: true })
    rmSync(csv, { force: true })
  }
}

// k6 running load.js on the load core with `env` as its -e settings, every request written to `csv`.
function runK6(k6: string, env: Record<string, string>, csv: string) {
  const settings = Object.entries(env).flatMap(([name, value]) => ['-e', `${name}=${value}`])
  const args = ['-c', LOAD_CORE, k6, 'run', '--quiet', '--no-color', '--out', `csv=${csv}`, ...settings]
  return spawn('taskset', [...args, join(ROOT, 'load.js')], {
    stdio: ['ignore', 'ignore', 'inherit'],
    env: { ...process.env, K6_NO_USAGE_REPORT: 'true' },
  })
}

// k6's requests over the hold: from the end of the ramp after the first request, for `hold` seconds;
// their durations sorted.
function readK6Csv(csv: string, ramp: number, hold: number) {
  const durations: number[] = []
  let requests = 0
  let failed = 0
  let from = Infinity
  for (const line of readFileSync(csv, 'utf8').split('\n')) {
    const [metric, at, value] = line.split(',', 3)
    if (metric !== 'http_req_duration' && metric !== 'http_req_failed') continue
    const t = Number(at)
    if (from === Infinity) from = t + ramp
    if (t < from || t >= from + hold) continue
    if (metric === 'http_req_duration') {
      requests++
      durations.push(Number(value))
    } else if (value === '1') failed++
  }
  durations.sort((a, b) => a - b)
  return { from, requests, failed, durations }
}

// Ours, the same way as a level of the score.
async function oursHold({ seed, flags, users, ramp, hold }: Check) {
  const cgroup = boxCgroup('ours')
  const server = await benchServer(join(ROOT, 'dist', 'app.js'), {
    flags,
    seed,
    cgroup: cgroup.dir,
    env: { HOST: '0.0.0.0' },
  })
  const usersHold = startUsers({ url: server.url, users, tokens: seed.tokens, ramp, hold })
  try {
    const arrival = await usersHold.arrived()
    const tally = await usersHold.done()
    const failure = arrival.failure ?? tally.failure
    if (failure) throw failure
    const sorted = tally.latencies
    const rate = tally.sent / tally.seconds
    const failed = tally.errors / Math.max(1, tally.sent)
    return { requests: tally.sent, rate, p95_ms: k6Percentile(sorted, 95), p99_ms: k6Percentile(sorted, 99), failed }
  } finally {
    usersHold.stop()
    await server.stop()
    cgroup.remove()
  }
}

const OPTIONS = {
  full: { type: 'boolean', default: false },
  record: { type: 'boolean', default: false },
  'confirm-from': { type: 'string' },
  resume: { type: 'string' },
  processes: { type: 'string' },
  users: { type: 'string', default: '15000' },
  rounds: { type: 'string', default: '3' },
  'against-flags': { type: 'string' },
  k6: { type: 'string' },
  flags: { type: 'string' },
} as const

// --score: the score, and its results file; with --record, bench/score.json and the chart's caption.
// --k6: the users generator against k6 instead.
export async function main(argv: string[]) {
  const { values: args } = parseArgs({ args: argv, options: OPTIONS })
  const confirmFrom = args['confirm-from'] ? Number(args['confirm-from']) : undefined
  if (confirmFrom !== undefined && !(confirmFrom >= 2500 && confirmFrom % 250 === 0)) {
    throw new Error('--confirm-from: a number of users, 2,500 or more, in steps of 250')
  }
  const { seed, flags } = prepare(args.flags)
  if (args.k6) {
    const result = await k6Check({ seed, flags, k6: args.k6 })
    writeFileSync(resultsFile(commitOf(ROOT), 'k6-check'), JSON.stringify(result, null, 2))
    return
  }
  const commit = commitOf(ROOT)
  if (args.processes) {
    const flagSets =
      args['against-flags'] === undefined ? [flags] : [flags, args['against-flags'].split(' ').filter(Boolean)]
    const counts = args.processes.split(',').map(Number)
    const result = await processesBench({
      seed,
      flagSets,
      commit,
      counts,
      users: Number(args.users),
      rounds: Number(args.rounds),
    })
    writeFileSync(resultsFile(commit, 'processes'), JSON.stringify(result, null, 2))
    return
  }
  const estimate = await estimateOf(seed, flags, commit)
  const result = await scoreBench({ seed, flags, full: args.full, estimate, commit, confirmFrom, resume: args.resume })
  const file = resultsFile(commit, 'score')
  const results = { date: new Date().toISOString(), commit, node: process.version, estimate, ...result }
  writeFileSync(file, JSON.stringify(results, null, 2))
  console.log(`results: ${file}`)
  if (args.record) {
    recordScore({
      commit,
      full: args.full,
      score: result.score,
      estimate: Math.round(estimate.users),
      line: result.line,
    })
  }
}

// The CPU estimate beside the score: the mix at saturation, against the ceiling, as the plain bench runs it.
async function estimateOf(seed: Seed, flags: string[], commit: string) {
  const ours: Variant = { name: 'ours', app: join(ROOT, 'dist', 'app.js'), flags, commit, node: process.execPath }
  const run = { settings: settingsOf(), seed }
  const ceiling = await saturate('ceiling', 'ceiling', run)
  const mix = await saturate(ours, 'mix', run)
  return { users: (0.8 * mix.rps) / USER_RATE, mix_rps: mix.rps, mix_cpu_us: mix.cpu_us, c0_us: ceiling.cpu_us }
}

// bench/score.json, and the chart's caption redrawn in place (its bars are the saturation run's).
function recordScore(recorded: { commit: string; full: boolean; score: number; estimate: number; line: string }) {
  writeFileSync(SCORE_FILE, JSON.stringify({ date: new Date().toISOString(), ...recorded }, null, 2) + '\n')
  const chart = join(ROOT, 'bench', 'chart.svg')
  const caption = /(<text x="16" y="46"[^>]*>)(?:score [^<]*Chart: )?/
  const svg = readFileSync(chart, 'utf8').replace(caption, (_, open) => `${open}${scoreLine()}`)
  writeFileSync(chart, svg)
  log('bench: wrote bench/score.json and the score into bench/chart.svg')
}
