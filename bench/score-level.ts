// One level of the score (bench/score.ts): N users held against the server as shipped, in the box's
// limits (a memory cgroup of what the box leaves the server, its limit of open files), measured over the
// hold, and whether it passed the challenge's line; what a level is, the run's state that the search
// and the confirmation carry from level to level, and the progress line and log they write.
import { execFileSync } from 'node:child_process'
import { appendFileSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { cpuTicks, processTree, TICK_US } from '../harness/proc.ts'
import type { Seed } from '../harness/seed.ts'
import type { Server } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { type Arrival, startUsers, type Tally } from './hold.ts'
import { benchServer, fmt, log, WORKDIR } from './lib.ts'

// A 2 GB droplet's kernel shows about 1,967 MiB; Ubuntu 24.04 at rest holds about 320 MiB of it (systemd
// and journald, snapd, multipathd, the droplet agent, sshd): our estimate of what is left for the
// server, its page cache and the kernel memory its sockets take.
export const BOX_MEMORY_MB = 1650
export const BOX_FILES = 65_535 // LimitNOFILE of the challenge's systemd unit

type Limit = 'cpu' | 'memory' | 'files' | 'latency' | 'errors'
export type Level = {
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

// k6's percentile of a Trend: linear between the two closest ranks.
export function k6Percentile(sorted: number[], p: number) {
  if (sorted.length === 0) return 0
  const rank = (p / 100) * (sorted.length - 1)
  const low = Math.floor(rank)
  return sorted[low] + (sorted[Math.min(low + 1, sorted.length - 1)] - sorted[low]) * (rank - low)
}

// A cgroup v1 memory group of BOX_MEMORY_MB for one level, socket buffers counted (v1 charges them only
// once their own limit is set). The kernel kills inside it on going over, as on the box.
export function boxCgroup(name: string) {
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
export function progress(logFile: string, started: number) {
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

export const clock = (s: number) => `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s`

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

export type Lengths = { ramp: number; hold: number }
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

// The server as shipped (its Node flags, WORKERS unset) on the server core, listening on every address,
// in a box's cgroup of its own, under a limit of open files when given one.
export async function boxedServer(
  name: string,
  { seed, flags, nofile }: { seed: Seed; flags: string[]; nofile?: number },
) {
  const cgroup = boxCgroup(name)
  const node = nofile ? 'prlimit' : process.execPath
  const nodeFlags = nofile ? [`--nofile=${nofile}`, process.execPath, ...flags] : flags
  const shipped = { node, flags: nodeFlags, seed, cgroup: cgroup.dir, env: { HOST: '0.0.0.0' } }
  const server: Server = await benchServer(join(ROOT, 'dist', 'app.js'), shipped)
  return { cgroup, server }
}

// One level: the boxed server, and the users on the other core (bench/hold.ts), measured over the hold;
// or, resuming, the level the log has next.
export async function level(
  s: Scoring,
  users: number,
  phase: string,
  lengths: Lengths,
  nofile?: number,
): Promise<Level> {
  const { ramp, hold } = lengths
  const recorded = replayed(s, users, phase)
  if (recorded) return recorded
  const { cgroup, server } = await boxedServer(String(s.levels.length), { seed: s.seed, flags: s.flags, nofile })
  const at = { users, phase, ramp, hold, started: performance.now() }
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
    sayProgress(s, at, phaseOf, memory)
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
    const result = levelOf(at, { arrival, tally, wall, cpuUs, memory, server, cgroup })
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

// Resuming: the log's next level, which must be the one the run asks for.
function replayed(s: Scoring, users: number, phase: string) {
  const recorded = s.replay.shift()
  if (recorded && (recorded.users !== users || recorded.phase !== phase)) {
    throw new Error(
      `--resume: the log's next level is ${recorded.phase} at ${recorded.users}, the run's ${phase} at ${users}`,
    )
  }
  if (recorded) s.levels.push(recorded)
  return recorded
}

// The progress line of a level under way: how far into its phase, its processes and memory so far, and
// about how long the run has left.
function sayProgress(
  s: Scoring,
  { users, phase, ramp, hold, started }: At & { started: number },
  phaseOf: { name: string; started: number },
  memory: { processes: number; peak: number },
) {
  const inPhase = (performance.now() - phaseOf.started) / 1000
  const length = phaseOf.name === 'ramp' ? ramp : hold
  const processes = memory.processes
  const left = s.remaining() + Math.max(0, ramp + hold - (performance.now() - started) / 1000)
  s.p.say(
    `${phase}: ${fmt(users)} users, ${phaseOf.name} ${fmt(Math.min(inPhase, length))}/${length} s, ` +
      `${processes} process${processes > 1 ? 'es' : ''}, ${fmt(memory.peak / 2 ** 20)} MiB; ` +
      `${clock(s.p.elapsed())} elapsed, about ${clock(left)} left`,
    `${phase} ${users} ${phaseOf.name}`,
  )
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
