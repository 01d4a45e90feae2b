// The writes of the cluster's measures (bench/cluster.ts), each sent to a node's API as a user would:
// likes one at a time (3.), with each one's latency and the CPU of the processes counted, and the lag
// (4.), from a new post's 201 on the primary to the replica's file holding it, idle or at a write rate.
import { DatabaseSync } from 'node:sqlite'
import { TICK_US } from '../harness/proc.ts'
import { sleep } from '../harness/time.ts'
import { fmt } from './lib.ts'

export const randomPost = () => 1 + Math.floor(Math.random() * 500_000)
const at = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN
// A like 15 times for every 2 new posts, as in the k6 loop.
const CREATE_SHARE = 2 / 17

// Likes one at a time: latency, and CPU a write of each counter (CPU ticks of some processes).
export async function oneAtATime(tokens: string[], url: string, count: number, counters: (() => number)[]) {
  const latencies: number[] = []
  let notCaughtUp = 0
  const before = counters.map((ticks) => ticks())
  for (let i = 0; i < count; i++) {
    const started = performance.now()
    const res = await fetch(`${url}/posts/${randomPost()}/like`, {
      method: 'POST',
      headers: { authorization: `Bearer ${tokens[i % tokens.length]}` },
      signal: AbortSignal.timeout(15_000),
    })
    await res.arrayBuffer()
    if (res.status !== 201 && res.status !== 200) throw new Error(`a like answered ${res.status}`)
    if (res.headers.get('litestream-caught-up') === 'false') notCaughtUp++
    latencies.push(performance.now() - started)
  }
  const cpu_us = counters.map((ticks, i) => ((ticks() - before[i]) * TICK_US) / count)
  latencies.sort((x, y) => x - y)
  return {
    count,
    p50_ms: at(latencies, 0.5),
    p99_ms: at(latencies, 0.99),
    max_ms: latencies.at(-1)!,
    cpu_us,
    not_caught_up: notCaughtUp,
  }
}

// From a new post's 201 on the primary to a read of the replica's file finding it (this process reads
// the file every 2 ms). Idle: one post at a time, at random moments against the replication's clock;
// with `rate`, writes at that rate for `seconds` (likes and new posts, as the challenge writes), each
// new post timed. The counters' CPU is given per second of the run.
export async function lag(
  tokens: string[],
  primaryUrl: string,
  replicaDb: string,
  { rate, seconds, posts }: { rate?: number; seconds?: number; posts?: number },
  counters: (() => number)[] = [],
) {
  const probe = lagProbe(tokens, primaryUrl, replicaDb)
  const before = counters.map((ticks) => ticks())
  const started = performance.now()
  if (rate) {
    const inFlight: Promise<void>[] = []
    for (let i = 0; performance.now() - started < seconds! * 1000; await sleep(10)) {
      const due = ((performance.now() - started) / 1000) * rate
      for (; i < due; i++) inFlight.push(probe.write(i, Math.random() < CREATE_SHARE))
    }
    await Promise.all(inFlight)
  } else {
    for (let i = 0; i < posts!; i++) {
      await probe.write(i, true)
      await probe.seen(10_000)
      await sleep(Math.random() * 1_000)
    }
  }
  await probe.seen(10_000)
  const elapsedS = (performance.now() - started) / 1000
  const { lags, lost, written, errors, example } = await probe.stop()
  return {
    writes_per_s: written / elapsedS,
    timed: lags.length,
    p50_ms: at(lags, 0.5),
    p99_ms: at(lags, 0.99),
    max_ms: lags.at(-1) ?? NaN,
    not_seen_in_10_s: lost,
    errors,
    example,
    cpu_per_s: counters.map((ticks, i) => ((ticks() - before[i]) * TICK_US) / 1e6 / elapsedS),
  }
}

// Writes to the primary, each new post's id kept until the replica's file holds it (read every 2 ms);
// seen() waits, up to its deadline, for every post written so far; stop() gives each timed post's lag
// (sorted), the posts not seen, and the writes and bad answers.
function lagProbe(tokens: string[], primaryUrl: string, replicaDb: string) {
  const replica = new DatabaseSync(replicaDb, { readOnly: true, timeout: 5_000 })
  const newest = replica.prepare('SELECT max(id) AS id FROM posts')
  const seenUpTo = () => {
    try {
      return Number((newest.get() as { id: number }).id)
    } catch {
      return 0 // Litestream holding the locks past the timeout: nothing new seen
    }
  }
  const lags: number[] = []
  const counts = { written: 0, errors: 0, example: '' }
  const pending: { id: number; at: number }[] = []
  let seen = seenUpTo()
  let polling = true
  const poller = (async () => {
    while (polling) {
      seen = seenUpTo()
      const now = performance.now()
      while (pending.length && pending[0].id <= seen) lags.push(now - pending.shift()!.at)
      await sleep(2)
    }
  })()
  const write = async (i: number, create: boolean) => {
    const token = tokens[(i * 7919) % tokens.length]
    const res = await fetch(create ? `${primaryUrl}/posts` : `${primaryUrl}/posts/${randomPost()}/like`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: create ? JSON.stringify({ body: `Lag probe ${i}` }) : undefined,
      signal: AbortSignal.timeout(15_000),
    }).catch((error: Error) => ({ status: 0, text: async () => error.message }))
    const text = await res.text()
    if (!(res.status === 201 || (!create && res.status === 200))) {
      counts.errors++
      counts.example ||= `${res.status} ${text.slice(0, 80)}`
      return
    }
    counts.written++
    if (!create) return
    const id = (JSON.parse(text) as { post: { id: number } }).post.id
    const now = performance.now()
    if (id <= seen) return void lags.push(0) // the replica had it before its answer reached here
    const later = pending.findIndex((p) => p.id > id) // answers may come out of order: kept by id
    pending.splice(later === -1 ? pending.length : later, 0, { id, at: now })
  }
  const seenAll = async (timeoutMs: number) => {
    const deadline = performance.now() + timeoutMs
    while (pending.length && performance.now() < deadline) await sleep(2)
  }
  const stop = async () => {
    polling = false
    await poller
    replica.close()
    lags.sort((x, y) => x - y)
    return { lags, lost: pending.length, ...counts } // lost: never seen within 10 s
  }
  return { write, seen: seenAll, stop }
}
export const lagText = (l: Awaited<ReturnType<typeof lag>>) =>
  `p50 ${fmt(l.p50_ms, 1)} ms, p99 ${fmt(l.p99_ms, 1)} ms, max ${fmt(l.max_ms, 1)} ms (${fmt(l.timed)} posts)` +
  (l.not_seen_in_10_s ? `; ${l.not_seen_in_10_s} not on the replica after 10 s` : '') +
  (l.errors ? `; ${l.errors} bad answers, e.g. ${l.example}` : '')

export const writeText = (r: Awaited<ReturnType<typeof oneAtATime>>) =>
  `p50 ${fmt(r.p50_ms, 2)} ms, p99 ${fmt(r.p99_ms, 2)} ms (${r.count}); CPU ${r.cpu_us.map((x) => fmt(x)).join(' + ')} = ${fmt(r.cpu_us.reduce((x, y) => x + y))} us` +
  (r.not_caught_up ? `; ${r.not_caught_up} answered before the replica had them` : '')
