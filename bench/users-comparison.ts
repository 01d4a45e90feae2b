// The comparison's users holds (bench/hold.ts), each measured from the server's process tree: CPU (user
// and system of every thread), context switches of every thread, syscalls by perf, and RSS.
import { join } from 'node:path'
import { processTree, TICK_US, treeCpu, treeMemoryKb, treeSwitches } from '../harness/proc.ts'
import type { Seed } from '../harness/seed.ts'
import { sleep } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { type Arrival, generatorsFor, startUsers, type Tally, USER_RATE } from './hold.ts'
import { countSyscalls, fmt, log, wrk } from './lib.ts'
import { firstSnapshot, isReplicated, serve, type Settings, type Variant } from './saturation.ts'

// The users holds' lengths and count: --connections, --ramp, --hold and --rounds; and --workers.
export type UsersSettings = { connections: number; rampS: number; holdS: number; rounds: number; workers: string }
type UsersRun = { users: UsersSettings; settings: Settings; seed: Seed; cgroup?: string }

export type Hold = {
  variant: string
  round: number
  connections: number
  seconds: number
  sent: number
  answered: number
  rate: number
  errors: number
  error_example: string
  connect_failed: number
  p50_ms: number
  p95_ms: number
  p99_ms: number
  max_ms: number
  // A request's cost over the hold: CPU (user, kernel, both) in us, context switches, syscalls
  // (undefined without perf).
  cpu_us: number
  user_us: number
  sys_us: number
  voluntary_switches: number
  involuntary_switches: number
  switches: number
  syscalls?: number
  server_cpu: number
  rss_idle_mb: number
  rss_start_mb: number
  rss_peak_mb: number
  kb_per_connection: number
  generator_cpu: number
  pass: boolean
  perf_note?: string
}

// The floors: the same SQL and token check with nothing of ours around them (bench/floor-sql.ts), on
// node:http, straight on node:net, and on node:net through a minimal Hono app.
const FLOORS = [
  ['floor', 'floor.ts'],
  ['floor, node:net', 'floor-net.ts'],
  ['floor, node:net + Hono', 'floor-hono.ts'],
]

// The users comparison's variants: ours; ours again on a second server (the A/A: the method's noise; not
// with --quick); ours on @hono/node-server (HTTP_SERVER=node-server), the server it had before node:net;
// the floors, same Node and flags, where the users fit one process (one generator's); and every other
// variant of the run. With names (--hold-variants), ours and those named only, so that more rounds of
// fewer variants fit in a run.
type Fit = { floorFits: boolean; quick: boolean; names?: string[] }

export function usersVariantsOf(ours: Variant, variants: Variant[], { floorFits, quick, names }: Fit): Variant[] {
  const floors = floorFits ? FLOORS.map(([name, script]) => ({ ...ours, name, app: join(ROOT, 'bench', script) })) : []
  const again = quick ? [] : [{ ...ours, name: 'ours again' }]
  const nodeServer = { ...ours, name: 'ours, node-server', env: { HTTP_SERVER: 'node-server' } }
  const all = [ours, ...again, nodeServer, ...floors, ...variants.filter((v) => v !== ours && v.name !== 'floor')]
  if (!names) return all
  const unknown = names.filter((name) => !all.some((v) => v.name === name))
  if (unknown.length) {
    throw new Error(
      `--hold-variants: no variant ${unknown.join(', ')}; this run has ${all.map((v) => v.name).join('; ')}`,
    )
  }
  return all.filter((v) => v === ours || names.includes(v.name))
}

// Every variant of the users comparison, once a round, each on a fresh server, one after another; the
// order reversed every other round, so that drift over a round hits the first and the last alike.
export async function usersComparison(variants: Variant[], run: UsersRun): Promise<Hold[]> {
  const { users } = run
  const holds: Hold[] = []
  const perHoldS = 2 + run.settings.warmupS + 1 + users.rampS + users.holdS + 2
  const total = users.rounds * variants.length
  for (let round = 0; round < users.rounds; round++) {
    const order = round % 2 ? [...variants].reverse() : variants
    for (const variant of order) {
      const left = (total - holds.length) * perHoldS
      log(
        `bench: users ${round + 1}/${users.rounds}: ${variant.name}: ${fmt(users.connections)} users arriving over ` +
          `${fmt(users.rampS)} s, then ${fmt(users.holdS)} s measured ` +
          `(about ${Math.ceil(left / 60)} min left of the users holds)`,
      )
      holds.push(await holdVariant(variant, round + 1, run))
    }
  }
  return holds
}

// N users (N x 0.106 requests a second) on a fresh server with a fresh copy of the seed, after the
// saturation warm-up; the hold after the ramp is measured, by the server's process tree and by the
// generators (every answer checked and timed). A generator that dies or hangs fails the run.
async function holdVariant(variant: Variant, round: number, run: UsersRun): Promise<Hold> {
  const { users, settings, seed } = run
  const count = generatorsFor(users.connections)
  const server = await serve(variant, { settings, seed, cgroup: run.cgroup, host: count > 1 ? '0.0.0.0' : '127.0.0.1' })
  let hold: ReturnType<typeof startUsers> | undefined
  let meter: ReturnType<typeof meterServer> | undefined
  try {
    if (isReplicated(variant)) await firstSnapshot(server, settings.quick)
    await wrk(server.url, 'mix', settings.warmupS, seed.tokens)
    await sleep(1000)
    const rssIdle = treeMemoryKb(server.pid, 'VmRSS')
    const deadlines = { arriveMs: (users.rampS + 120) * 1000, doneMs: (users.holdS + 60) * 1000, name: variant.name }
    const { connections, rampS: ramp, holdS: holdFor } = users
    hold = startUsers({ url: server.url, users: connections, tokens: seed.tokens, ramp, hold: holdFor, deadlines })
    const arrival = await hold.arrived()
    if (arrival.failure) throw arrival.failure
    // Every user has arrived: the generators measure from now (no idle time), and so does this.
    meter = meterServer(server.pid)
    log(
      `bench: ${fmt(arrival.open)} users have arrived (${count} generator${count > 1 ? 's' : ''}); ` +
        `measuring ${fmt(users.holdS)} s (about ${fmt(arrival.open * USER_RATE)} requests/s)`,
    )
    const tally = await hold.done()
    if (tally.failure) throw tally.failure
    return holdOf(variant, round, { arrival, tally, server: await meter.stop(), rssIdle, users: users.connections })
  } finally {
    meter?.clear()
    hold?.stop()
    await server.stop()
  }
}

// The server's process tree from now until stop(): CPU ticks (user, system) and context switches of
// every thread, its syscalls by perf, and its RSS at the start and at its peak, sampled every 500 ms.
function meterServer(pid: number) {
  const perf = countSyscalls(processTree(pid))
  const cpuBefore = treeCpu(pid)
  const switchesBefore = treeSwitches(pid)
  const started = performance.now()
  const rssStart = treeMemoryKb(pid, 'VmRSS')
  let rssPeak = rssStart
  const sampler = setInterval(() => {
    try {
      rssPeak = Math.max(rssPeak, treeMemoryKb(pid, 'VmRSS'))
    } catch {} // a worker gone meanwhile
  }, 500)
  return {
    clear: () => clearInterval(sampler),
    stop: async () => {
      const [cpuAfter, switchesAfter] = [treeCpu(pid), treeSwitches(pid)]
      const wallS = (performance.now() - started) / 1000
      clearInterval(sampler)
      rssPeak = Math.max(rssPeak, treeMemoryKb(pid, 'VmRSS'))
      return {
        userUs: (cpuAfter.user - cpuBefore.user) * TICK_US,
        sysUs: (cpuAfter.system - cpuBefore.system) * TICK_US,
        wallS,
        voluntary: switchesAfter.voluntary - switchesBefore.voluntary,
        involuntary: switchesAfter.involuntary - switchesBefore.involuntary,
        rssStart,
        rssPeak,
        syscalls: await perf.stop(),
      }
    },
  }
}

type Metered = Awaited<ReturnType<ReturnType<typeof meterServer>['stop']>>
type Measured = { arrival: Arrival; tally: Tally; server: Metered; rssIdle: number; users: number }

function holdOf(variant: Variant, round: number, { arrival, tally, server, rssIdle, users }: Measured): Hold {
  const { latencies, seconds } = tally
  const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? 0
  const answered = Math.max(1, tally.answered)
  const failedToConnect = arrival.failedToConnect
  return {
    variant: variant.name,
    round,
    connections: arrival.open,
    seconds,
    sent: tally.sent,
    answered: tally.answered,
    rate: tally.answered / seconds,
    errors: tally.errors,
    // The failures that carry no answer to show: connections that never opened, requests never answered.
    error_example:
      tally.example ??
      [
        failedToConnect && `${fmt(failedToConnect)} of ${fmt(users)} connections failed to open`,
        tally.unanswered && `${fmt(tally.unanswered)} requests unanswered 5 s after the hold`,
      ]
        .filter(Boolean)
        .join('; '),
    connect_failed: failedToConnect,
    p50_ms: at(50),
    p95_ms: at(95),
    p99_ms: at(99),
    max_ms: latencies.at(-1) ?? 0,
    cpu_us: (server.userUs + server.sysUs) / answered,
    user_us: server.userUs / answered,
    sys_us: server.sysUs / answered,
    voluntary_switches: server.voluntary / answered,
    involuntary_switches: server.involuntary / answered,
    switches: (server.voluntary + server.involuntary) / answered,
    syscalls: server.syscalls.count === undefined ? undefined : server.syscalls.count / answered,
    perf_note: server.syscalls.note,
    server_cpu: (server.userUs + server.sysUs) / (server.wallS * 1e6),
    rss_idle_mb: rssIdle / 1024,
    rss_start_mb: server.rssStart / 1024,
    rss_peak_mb: server.rssPeak / 1024,
    kb_per_connection: (server.rssStart - rssIdle) / Math.max(1, arrival.open),
    generator_cpu: Math.max(...tally.generatorCpu),
    // The challenge's pass line for a level.
    pass: at(95) < 500 && at(99) < 1000 && tally.errors / Math.max(1, tally.sent) < 0.01 && failedToConnect === 0,
  }
}
