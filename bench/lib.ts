// What the benchmark's modes share beyond harness/ (which the tests share too): the cores, the results'
// folder, the shipped server under measurement, wrk, the users generator, perf, and the figures' format
// (numbers, medians, colours and columns).
import { execFileSync, spawn, type SpawnOptions, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { cpuTicks, TICK_US } from '../harness/proc.ts'
import { CACHE, DEFAULT_SECRET, type Seed, seededDatabase } from '../harness/seed.ts'
import { type Server, shippedNodeFlags, startServer } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'

export const RESULTS = join(ROOT, 'bench', 'results')
export const SERVER_CORE = '1'
export const LOAD_CORE = '0'
const MEMORY_LIMIT = 2 * 1024 ** 3 // the challenge box's RAM

// A command on the load core, away from the server's: wrk, the users generators, perf, k6.
export const onLoadCore = (argv: string[], options: SpawnOptions) =>
  spawn('taskset', ['-c', LOAD_CORE, ...argv], options)

export const sh = (cmd: string, argv: string[], cwd = ROOT) => execFileSync(cmd, argv, { cwd, encoding: 'utf8' }).trim()
export const log = (line: string) => console.error(line)
// A figure as the reports print it: thousands separated, `digits` decimals.
export const fmt = (n: number, digits = 0) =>
  n.toLocaleString('en', { minimumFractionDigits: digits, maximumFractionDigits: digits })

// The middle value, or the mean of the two middle ones.
export const median = (values: number[]) => {
  const sorted = [...values].sort((a, b) => a - b)
  const middle = (sorted.length - 1) / 2
  return (sorted[Math.floor(middle)] + sorted[Math.ceil(middle)]) / 2
}

// Columns, the first one or two left-aligned and the rest right-aligned, colours not counted.
export function printColumns(header: string[], lines: string[][], left = 1) {
  const visible = (s: string) => s.replace(/\x1b\[\d+m/g, '').length
  const widths = header.map((h, i) => Math.max(visible(h), ...lines.map((l) => visible(l[i]))))
  const pad = (c: string, i: number) => ' '.repeat(widths[i] - visible(c))
  const row = (cells: string[]) =>
    cells
      .map((c, i) => (i < left ? c + pad(c, i) : pad(c, i) + c))
      .join('  ')
      .trimEnd()
  console.log(row(header))
  for (const l of lines) console.log(row(l))
}

const color = (code: number) => (text: string) => (process.stdout.isTTY ? `\x1b[${code}m${text}\x1b[0m` : text)
export const red = color(31)
export const green = color(32)
export const yellow = color(33)

// What every mode does first: the tools, a fresh build, the folders, the seeded database; and the
// servers' Node flags, --flags or else the shipped ones.
export function prepare(flags: string | undefined) {
  ensureTools()
  execFileSync(process.execPath, ['build.mjs'], { cwd: ROOT, stdio: 'ignore' })
  mkdirSync(CACHE, { recursive: true })
  mkdirSync(RESULTS, { recursive: true })
  return { seed: seededDatabase(), flags: flags === undefined ? shippedNodeFlags() : flags.split(' ').filter(Boolean) }
}

// The commit measured, +dirty when tracked files differ from it (but for the two that --record writes).
export function commitOf(dir: string) {
  const sha = sh('git', ['rev-parse', '--short', 'HEAD'], dir)
  const pathspec = ['--', '.', ':!BENCHMARKS.md', ':!bench/chart.svg']
  const changed = sh('git', ['status', '--porcelain', '--untracked-files=no', ...pathspec], dir)
  return changed ? `${sha}+dirty` : sha
}

// The other build for --against: a worktree of that ref, installed and built, reused while the ref is.
export function buildAgainst(ref: string): string {
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

// A results file's name: the time, the commit and what it holds.
export const resultsFile = (commit: string, kind = '') =>
  join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commit}${kind && `-${kind}`}.json`)

export function ensureTools() {
  const missing = ['wrk', 'taskset'].filter((tool) => spawnSync('which', [tool]).status !== 0)
  if (missing.length === 0) return
  log(`bench: installing ${missing.join(', ')} (apt-get)`)
  const pkgs = missing.map((tool) => (tool === 'taskset' ? 'util-linux' : tool))
  const install = spawnSync('apt-get', ['install', '-y', '--no-install-recommends', ...pkgs], { stdio: 'inherit' })
  if (install.status !== 0) throw new Error(`bench needs ${missing.join(', ')}: apt-get install ${pkgs.join(' ')}`)
}

// Another release of Node, the official build from the npm registry as pinned-node/ brings ours, kept in
// bench/.cache: the benchmark runs the same bundle on it to compare runtimes.
export function nodeRelease(version: string): string {
  const prefix = join(CACHE, `node-${version}`)
  const bin = join(prefix, 'node_modules', '.bin', 'node')
  if (!existsSync(bin)) {
    log(`bench: fetching Node ${version} from the npm registry`)
    execFileSync(
      'npm',
      [
        'install',
        '--no-save',
        '--no-audit',
        '--no-fund',
        '--prefix',
        prefix,
        `node-${process.platform}-${process.arch}@${version}`,
      ],
      { stdio: 'ignore' },
    )
  }
  return bin
}

// A 2 GB memory cgroup (v1) for the server, where the machine lets us make one.
export function memoryCgroup(): { dir?: string; note: string } {
  const dir = `/sys/fs/cgroup/memory/feed-bench-${process.pid}`
  try {
    mkdirSync(dir)
    writeFileSync(join(dir, 'memory.limit_in_bytes'), String(MEMORY_LIMIT))
    return { dir, note: 'memory cgroup of 2 GB' }
  } catch (err) {
    return { note: `no memory cgroup (${(err as Error).message.split(':')[0]}): memory not limited` }
  }
}

// Every syscall the processes' threads enter from now until stop(), counted by perf on the load core
// (`perf stat -e raw_syscalls:sys_enter -p <pids>`, as bench/instructions-count.ts counts them). Where perf is
// missing or cannot count here, stop() gives no count and says why, and nothing fails. Counting costs
// each syscall a little kernel time, which the server's sys time includes.
export function countSyscalls(pids: number[]): { stop: () => Promise<{ count?: number; note?: string }> } {
  if (spawnSync('which', ['perf']).status !== 0)
    return { stop: async () => ({ note: 'perf is not installed (apt-get install linux-perf)' }) }
  const perf = onLoadCore(['perf', 'stat', '-x,', '-e', 'raw_syscalls:sys_enter', '-p', pids.join(',')], {
    stdio: ['ignore', 'ignore', 'pipe'],
  })
  let output = ''
  perf.stderr!.on('data', (chunk) => (output += chunk))
  const exited = once(perf, 'exit').catch(() => {})
  return {
    stop: async () => {
      if (perf.exitCode === null && perf.signalCode === null) perf.kill('SIGINT')
      const timer = setTimeout(() => perf.kill('SIGKILL'), 10_000)
      await exited
      clearTimeout(timer)
      const count = Number(/^(\d+),[^,]*,raw_syscalls:sys_enter/m.exec(output)?.[1])
      return count > 0
        ? { count }
        : {
            note: `perf counted nothing here: ${output.trim().split('\n')[0] || `it exited with ${perf.exitCode ?? perf.signalCode}`}`,
          }
    },
  }
}

// The allocator the image preloads (its Dockerfile's LD_PRELOAD), as this machine's Debian has it:
// every server the benchmark starts runs with it, as shipped. The instruction count keeps glibc's.
let shippedEnvironment: Record<string, string> | undefined
export function shippedEnv(): Record<string, string> {
  if (shippedEnvironment) return shippedEnvironment
  shippedEnvironment = {}
  if (!/^ENV LD_PRELOAD=\S*libmimalloc/m.test(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))) return shippedEnvironment
  const lib = ['3', '2']
    .map((major) => `/usr/lib/${process.arch === 'arm64' ? 'aarch64' : 'x86_64'}-linux-gnu/libmimalloc.so.${major}`)
    .find((path) => existsSync(path))
  if (lib) shippedEnvironment.LD_PRELOAD = lib
  else
    log(
      "bench: the image preloads mimalloc and this machine has none (Debian's libmimalloc2.0 or libmimalloc3): the servers run on glibc's malloc",
    )
  return shippedEnvironment
}

// Where each server's copy of the seed goes, and a replica when it has one (the --replicate variant).
export const WORKDIR = join(CACHE, `run-${process.pid}`)
export const REPLICA_URL = `file://${join(WORKDIR, 'replica')}`

// A server as the benchmark measures it: this Node (or the given one) with the flags, on the server core
// (or the given cores), on a fresh copy of the seed when given one, in the cgroup when given one, with the
// shipped allocator and the seed's secret (which also silences the server's warning). Servers that run at
// the same time each need a workdir of their own; stop() removes the copy, and a replica beside it.
export async function benchServer(
  script: string,
  {
    node = process.execPath,
    flags = [],
    seed,
    cgroup,
    cores = SERVER_CORE,
    env = {},
    workdir = WORKDIR,
    timeoutMs,
  }: {
    node?: string
    flags?: string[]
    seed?: Seed
    cgroup?: string
    cores?: string
    env?: Record<string, string>
    workdir?: string
    timeoutMs?: number
  },
): Promise<Server> {
  mkdirSync(workdir, { recursive: true })
  const copy = join(workdir, 'feed.db')
  // The copy, and the replica and Litestream's own files beside it when it was replicated.
  const clean = () => {
    for (const suffix of ['', '-wal', '-shm']) rmSync(copy + suffix, { force: true })
    for (const path of [
      join(workdir, 'replica'),
      join(workdir, '.feed.db-litestream'),
      join(workdir, '.feed.db-litestream.yml'),
    ])
      rmSync(path, { recursive: true, force: true })
  }
  clean()
  if (seed) copyFileSync(seed.db, copy)
  const server = await startServer(node, [...flags, script], {
    cores,
    cgroup,
    timeoutMs,
    env: { ...shippedEnv(), SQLITE_PATH: copy, JWT_SECRET: DEFAULT_SECRET, ...env },
    // Its stderr on ours, but for the inspector's and Litestream's chatter.
    onStderr: (chunk) => {
      if (!/Debugger|inspector|For help, see|level=INFO/.test(String(chunk))) process.stderr.write(chunk)
    },
  })
  const stop = async (signal?: NodeJS.Signals) => {
    const code = await server.stop(signal)
    clean()
    return code
  }
  return { ...server, stop }
}

export type WrkResult = {
  requests: number
  duration_us: number
  bad: number
  bad_example: string
  non2xx: number
  socket_errors: number
  p50_us: number
  p90_us: number
  p99_us: number
  max_us: number
  loadCpu: number
}

// wrk on the load core; its own CPU is sampled so a run it could not saturate is called out. A request
// unanswered after timeoutS counts as an error.
export async function wrk(
  url: string,
  kind: string,
  seconds: number,
  tokens: string,
  { connections = 64, timeoutS = 2 } = {},
): Promise<WrkResult> {
  const child = onLoadCore(
    [
      'wrk',
      '-t1',
      `-c${connections}`,
      `--timeout`,
      `${timeoutS}s`,
      `-d${seconds}s`,
      '-s',
      join(ROOT, 'bench', 'wrk.lua'),
      url,
      '--',
      kind,
      tokens,
    ],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  )
  let output = ''
  child.stdout!.on('data', (chunk) => (output += chunk))
  const samples: [number, number][] = []
  const sampler = setInterval(() => {
    try {
      samples.push([performance.now(), cpuTicks(child.pid!).total])
    } catch {}
  }, 250)
  const [code] = await once(child, 'exit')
  clearInterval(sampler)
  if (code !== 0) throw new Error(`wrk exited with ${code}: ${output}`)
  const result = JSON.parse(output.trim().split('\n').at(-1)!)
  const [first, last] = [samples[0], samples.at(-1)]
  const loadCpu =
    first && last && last[0] > first[0] ? ((last[1] - first[1]) * TICK_US) / ((last[0] - first[0]) * 1000) : 0
  return { ...result, loadCpu }
}

// One users generator (bench/users.ts) on the load core, and its JSON events as they come: next('connected')
// once every user has had its first answer, next('done') with the results (bench/users.ts says what).
export function usersGenerator(o: {
  url: string
  connections: number
  tokens: string
  latencies: string
  idle: number
  hold: number
  ramp: number
  loopOnArrival?: boolean
}) {
  const child = onLoadCore(
    [
      process.execPath,
      join(ROOT, 'bench', 'users.ts'),
      '--url',
      o.url,
      '--connections',
      String(o.connections),
      '--idle',
      String(o.idle),
      '--hold',
      String(o.hold),
      '--ramp',
      String(o.ramp),
      '--tokens',
      o.tokens,
      '--latencies',
      o.latencies,
      ...(o.loopOnArrival ? ['--loop-on-arrival'] : []),
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  )
  const events: Record<string, any>[] = []
  let buffered = ''
  const waiters: (() => void)[] = []
  child.stdout!.on('data', (chunk) => {
    buffered += chunk
    const lines = buffered.split('\n')
    buffered = lines.pop()!
    for (const line of lines) events.push(JSON.parse(line))
    for (const wake of waiters.splice(0)) wake()
  })
  const next = (name: string) =>
    new Promise<Record<string, any>>((resolve, reject) => {
      const check = () => {
        const found = events.find((e) => e.event === name)
        if (found) resolve(found)
        else waiters.push(check)
      }
      child.once('exit', (code) =>
        events.some((e) => e.event === name) ? check() : reject(new Error(`a users generator exited with ${code}`)),
      )
      check()
    })
  return { next, pid: child.pid!, kill: () => child.kill('SIGKILL') }
}
