// The servers the comparison measures (its variants), and each endpoint at saturation: wrk with 64
// connections on the load core against one variant, or against several at once (--together). The score
// measures its CPU estimate here too.
import { rmSync } from 'node:fs'
import { basename, join } from 'node:path'
import { cpuTicks, TICK_US, treeCpuTicks, treeMemoryKb } from '../harness/proc.ts'
import { startS3rver } from '../harness/s3.ts'
import type { Seed } from '../harness/seed.ts'
import type { Server } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { benchServer, LOAD_CORE, WORKDIR, wrk, type WrkResult } from './lib.ts'

const ENDPOINTS = ['ceiling', 'feed', 'post', 'like', 'create', 'mix'] as const
export type Endpoint = (typeof ENDPOINTS)[number]
export const LABEL: Record<Endpoint, string> = {
  ceiling: 'ceiling: node:http, constant feed body',
  feed: 'GET /feed',
  post: 'GET /posts/:id',
  like: 'POST /posts/:id/like',
  create: 'POST /posts',
  mix: 'mix (k6 proportions)',
}

// The endpoints of --only, or these; the ceiling always first, since every figure is read against it.
export function endpointsOf(only: string | undefined, otherwise: Endpoint[]): Endpoint[] {
  const endpoints = only ? (only.split(',') as Endpoint[]) : [...otherwise]
  const unknown = endpoints.find((e) => !ENDPOINTS.includes(e))
  if (unknown) throw new Error(`--only takes ${ENDPOINTS.join(', ')}, not ${unknown}`)
  if (!endpoints.includes('ceiling')) endpoints.unshift('ceiling')
  return endpoints
}

// workers, cores and env, when given, override --workers, the server core and the server's environment.
export type Variant = {
  name: string
  app: string
  flags: string[]
  commit: string
  node: string
  workers?: string
  cores?: string
  env?: Record<string, string>
}

// How a run measures: --quick's shorter lengths, --workers, and --s3 for the replicated variants.
export type Settings = { quick: boolean; warmupS: number; measureS: number; workers: string; s3: boolean }
export const settingsOf = ({ quick = false, workers = '0', s3 = false } = {}): Settings => ({
  quick,
  warmupS: quick ? 1 : 2,
  measureS: quick ? 3 : 10,
  workers,
  s3,
})

export type Saturation = {
  endpoint: Endpoint
  variant: string
  rps: number
  p50_ms: number
  p99_ms: number
  errors: number
  error_example: string
  cpu_us: number
  litestream_cpu_us: number
  replica_behind_ms: number
  server_cpu: number
  load_cpu: number
  peak_rss_mb: number
}

// With --s3, the replicas are in s3rver, on the load core; started once, on the first replicated start,
// and stopped by stopS3() at the end of the run.
let s3: Awaited<ReturnType<typeof startS3rver>> | undefined
const S3_OBJECTS = join(WORKDIR, 's3rver')
export const stopS3 = async () => s3?.stop()

// A replicated variant replicates to a folder in its own workdir, or to a prefix of its own in s3rver;
// either starts empty.
async function replicaFor(workdir: string, settings: Settings): Promise<Record<string, string>> {
  if (!settings.s3) return { LITESTREAM_REPLICA_URL: `file://${join(workdir, 'replica')}` }
  s3 ??= await startS3rver(0, S3_OBJECTS, LOAD_CORE)
  rmSync(join(S3_OBJECTS, 'feed', basename(workdir)), { recursive: true, force: true })
  return { LITESTREAM_REPLICA_URL: `s3://feed/${basename(workdir)}/feed.db`, ...s3.env }
}

type Serving = { settings: Settings; seed: Seed; cgroup?: string; host?: string; workdir?: string }

export async function serve(variant: Variant | 'ceiling', serving: Serving) {
  const { settings, seed, cgroup, host = '127.0.0.1', workdir = WORKDIR } = serving
  if (variant === 'ceiling') return benchServer(join(ROOT, 'bench', 'ceiling.ts'), { cgroup })
  const replica = isReplicated(variant) && (await replicaFor(workdir, settings))
  return benchServer(variant.app, {
    node: variant.node,
    flags: variant.flags,
    seed,
    cgroup,
    cores: variant.cores,
    workdir,
    env: { WORKERS: variant.workers ?? settings.workers, HOST: host, ...variant.env, ...replica },
  })
}

// Replicated, the process started is Litestream, and the server its child.
export const isReplicated = (variant: Variant | 'ceiling') =>
  variant !== 'ceiling' && !!variant.env?.LITESTREAM_REPLICA_URL

// Nothing is measured before Litestream has sent its first snapshot of the whole file, and made its
// first level-1 compaction (every 30 s by the clock), which reads that whole snapshot once again. Both
// come once after a start; measured, they would weigh on 10 s as they never do on a box that runs.
// --quick, a smoke test, waits for the snapshot only.
export async function firstSnapshot(server: Server, quick: boolean) {
  const ready = quick ? /snapshot complete/ : /snapshot complete[^]*compaction complete.*level=1/
  for (const deadline = performance.now() + 60_000; !ready.test(server.stdout());) {
    if (performance.now() > deadline) {
      throw new Error(`no first snapshot and compaction from Litestream within 60 s:\n${server.stdout().slice(-2000)}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}

export async function saturate(variant: Variant | 'ceiling', endpoint: Endpoint, run: Serving): Promise<Saturation> {
  const [result] = await saturateTogether([variant], endpoint, { ...run, workdir: WORKDIR })
  return result
}

// --together: the variants at the same time on the same core, each with a wrk of its own, so that the
// machine's drift hits all of them at once. Each server has about its share of the core.
type Variants = (Variant | 'ceiling')[]

export async function saturateTogether(variants: Variants, endpoint: Endpoint, run: Serving): Promise<Saturation[]> {
  const { settings, seed } = run
  const workdir = (i: number) => run.workdir ?? join(WORKDIR, `together-${i}`)
  const servers = await Promise.all(variants.map((variant, i) => serve(variant, { ...run, workdir: workdir(i) })))
  const replicated = (i: number) => isReplicated(variants[i])
  try {
    await Promise.all(servers.map((server, i) => replicated(i) && firstSnapshot(server, settings.quick)))
    await Promise.all(servers.map((server) => wrk(server.url, endpoint, settings.warmupS, seed.tokens)))
    const ticks = servers.map((server) => treeCpuTicks(server.pid))
    const litestreamTicks = servers.map((server, i) => (replicated(i) ? cpuTicks(server.pid).total : 0))
    const lags = servers.map((server, i) => (replicated(i) ? followLag(server.url) : undefined))
    const started = performance.now()
    const measuring = servers.map((server) => wrk(server.url, endpoint, settings.measureS, seed.tokens))
    const results = await Promise.all(measuring)
    const wall = performance.now() - started
    return await Promise.all(
      results.map(async (result, i) => {
        const server = servers[i]
        const litestreamUs = replicated(i) ? (cpuTicks(server.pid).total - litestreamTicks[i]) * TICK_US : 0
        const cpuUs = (treeCpuTicks(server.pid) - ticks[i]) * TICK_US
        const sample = saturation(variants[i], endpoint, result, { cpuUs, wall, litestreamUs, pid: server.pid })
        return { ...sample, replica_behind_ms: (await lags[i]?.stop()) ?? 0 }
      }),
    )
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
      const health = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) }).then(
        (res) => res.json(),
        () => undefined,
      )
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

type Measured = { cpuUs: number; wall: number; litestreamUs: number; pid: number }

function saturation(variant: Variant | 'ceiling', endpoint: Endpoint, result: WrkResult, m: Measured): Saturation {
  return {
    endpoint,
    variant: variant === 'ceiling' ? 'ceiling' : variant.name,
    rps: result.requests / (result.duration_us / 1e6),
    p50_ms: result.p50_us / 1000,
    p99_ms: result.p99_us / 1000,
    errors: result.bad + result.socket_errors,
    error_example: result.bad_example,
    cpu_us: m.cpuUs / result.requests,
    litestream_cpu_us: m.litestreamUs / result.requests,
    replica_behind_ms: 0,
    server_cpu: m.cpuUs / (m.wall * 1000),
    load_cpu: result.loadCpu,
    peak_rss_mb: treeMemoryKb(m.pid, 'VmHWM') / 1024,
  }
}
