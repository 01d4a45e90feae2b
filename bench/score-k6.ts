// npm run bench -- --score --k6 <k6 binary> (bench/score.ts): the score's users generator checked
// against the real k6 running load.js, at one level both can drive, each on a fresh server in the box's
// limits as a level of the score runs it.
import { once } from 'node:events'
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { cpuTicks, TICK_US } from '../harness/proc.ts'
import { CACHE, type Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { startUsers, USER_RATE } from './hold.ts'
import { fmt, onLoadCore } from './lib.ts'
import { boxedServer, k6Percentile } from './score-level.ts'

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
  const { cgroup, server } = await boxedServer('k6', { seed, flags })
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
  const args = [k6, 'run', '--quiet', '--no-color', '--out', `csv=${csv}`, ...settings]
  return onLoadCore([...args, join(ROOT, 'load.js')], {
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
  const { cgroup, server } = await boxedServer('ours', { seed, flags })
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
