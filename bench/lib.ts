// What the benchmark and the profiler share: the seeded database, the pinned server, wrk, /proc.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { createHash } from 'node:crypto'
import { once } from 'node:events'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

export const ROOT = join(import.meta.dirname, '..')
export const CACHE = join(ROOT, 'bench', '.cache')
export const RESULTS = join(ROOT, 'bench', 'results')
export const SERVER_CORE = '1'
export const LOAD_CORE = '0'
const MEMORY_LIMIT = 2 * 1024 ** 3 // the challenge box's RAM

export const sh = (cmd: string, argv: string[], cwd = ROOT) => execFileSync(cmd, argv, { cwd, encoding: 'utf8' }).trim()
export const log = (line: string) => console.error(line)


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
    execFileSync('npm', ['install', '--no-save', '--no-audit', '--no-fund', '--prefix', prefix, `node-${process.platform}-${process.arch}@${version}`], { stdio: 'ignore' })
  }
  return bin
}

export type Seed = { db: string; tokens: string }

// One seeded database per version of the seed, kept in bench/.cache: the tests and the benchmarks copy it
// for every server they start. The version is the seed's bundle (dist/seed.js: everything the seed runs,
// the signing of its tokens included), so a change to any of it seeds again. The seed is built in a folder
// of its own and renamed into place whole: a run stopped halfway, or two runs at once, leave no half of one.
export function seededDatabase({ quiet = false } = {}): Seed {
  const hash = createHash('sha256').update(readFileSync(join(ROOT, 'dist', 'seed.js'))).digest('hex').slice(0, 12)
  const dir = join(CACHE, `seed-${hash}`)
  const seed = { db: join(dir, 'feed.db'), tokens: join(dir, 'tokens.txt') }
  if (existsSync(dir)) return seed
  log('seeding the challenge database once for this version of the seed, into bench/.cache (about 30 s)')
  const partial = `${dir}.${process.pid}`
  mkdirSync(CACHE, { recursive: true })
  for (const name of readdirSync(CACHE)) { // what runs stopped halfway left behind
    const pid = Number(/^seed-[0-9a-f]+\.(\d+)$/.exec(name)?.[1])
    if (pid && !isRunning(pid)) rmSync(join(CACHE, name), { recursive: true, force: true })
  }
  try {
    execFileSync(process.execPath, [join(ROOT, 'dist', 'seed.js'), join(partial, 'feed.db')], { stdio: ['ignore', 'ignore', quiet ? 'pipe' : 'inherit'] })
  } catch (error) {
    if (quiet) log(String((error as { stderr?: Buffer }).stderr ?? ''))
    throw error
  }
  const list = JSON.parse(readFileSync(join(partial, 'tokens.json'), 'utf8')) as { token: string }[]
  writeFileSync(join(partial, 'tokens.txt'), list.map((t) => t.token).join('\n') + '\n')
  try {
    renameSync(partial, dir)
  } catch (error) {
    if (!existsSync(dir)) throw error
    rmSync(partial, { recursive: true, force: true }) // another run finished the same seed first
  }
  return seed
}

export function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
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

export const TICK_US = 1e6 / Number(sh('getconf', ['CLK_TCK']))

// utime + stime of a process, all its threads, in clock ticks.
export function cpuTicks(pid: number): { user: number; system: number; total: number } {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')
  const user = Number(fields[11])
  const system = Number(fields[12])
  return { user, system, total: user + system }
}

export function memoryKb(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  return Number(new RegExp(`${field}:\\s+(\\d+)`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1])
}

// A server is its process and every descendant (cluster workers): their CPU and memory add up.
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const ppid = Number(readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1].split(' ')[1])
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)])
    } catch {} // gone meanwhile
  }
  const tree = [pid]
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]) ?? []))
  return tree
}

export const treeCpuTicks = (pid: number) => processTree(pid).reduce((sum, p) => sum + cpuTicks(p).total, 0)

// utime and stime of the process tree, all threads, in clock ticks: the user and kernel sides apart.
export function treeCpu(pid: number): { user: number; system: number } {
  const sum = { user: 0, system: 0 }
  for (const p of processTree(pid)) {
    try {
      const { user, system } = cpuTicks(p)
      sum.user += user
      sum.system += system
    } catch {} // gone meanwhile
  }
  return sum
}

// Context switches of every thread of the process tree (/proc/<pid>/task/*/status): voluntary (the thread
// waited: epoll_wait, a futex, I/O) and involuntary (the scheduler took the core from it). A thread that
// ends between two readings takes its count with it; Node's threads live as long as the process.
export function treeSwitches(pid: number): { voluntary: number; involuntary: number } {
  const sum = { voluntary: 0, involuntary: 0 }
  for (const p of processTree(pid)) {
    let tasks: string[] = []
    try {
      tasks = readdirSync(`/proc/${p}/task`)
    } catch {} // gone meanwhile
    for (const task of tasks) {
      try {
        const status = readFileSync(`/proc/${p}/task/${task}/status`, 'utf8')
        sum.voluntary += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1])
        sum.involuntary += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1])
      } catch {} // a thread that ended meanwhile
    }
  }
  return sum
}

// Every syscall the processes' threads enter from now until stop(), counted by perf on the load core
// (`perf stat -e raw_syscalls:sys_enter -p <pids>`, as bench/instructions.ts counts them). Where perf is
// missing or cannot count here, stop() gives no count and says why, and nothing fails. Counting costs
// each syscall a little kernel time, which the server's sys time includes.
export function countSyscalls(pids: number[]): { stop: () => Promise<{ count?: number; note?: string }> } {
  if (spawnSync('which', ['perf']).status !== 0) return { stop: async () => ({ note: 'perf is not installed (apt-get install linux-perf)' }) }
  const perf = spawn('taskset', ['-c', LOAD_CORE, 'perf', 'stat', '-x,', '-e', 'raw_syscalls:sys_enter', '-p', pids.join(',')], { stdio: ['ignore', 'ignore', 'pipe'] })
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
      return count > 0 ? { count } : { note: `perf counted nothing here: ${output.trim().split('\n')[0] || `it exited with ${perf.exitCode ?? perf.signalCode}`}` }
    },
  }
}
export const treeMemoryKb = (pid: number, field: 'VmHWM' | 'VmRSS') => processTree(pid).reduce((sum, p) => sum + memoryKb(p, field), 0)

// The Node flags the image runs with: the benchmark measures the server as it is shipped.
export function shippedNodeFlags(): string[] {
  const cmd = /^CMD\s+(\[.*\])\s*$/m.exec(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))
  const argv = JSON.parse(cmd![1]) as string[]
  return argv.slice(1, -1)
}

// The allocator the image preloads (its Dockerfile's LD_PRELOAD), as this machine's Debian has it:
// every server the benchmark starts runs with it, as shipped. The instruction count keeps glibc's.
let shippedEnvironment: Record<string, string> | undefined
export function shippedEnv(): Record<string, string> {
  if (shippedEnvironment) return shippedEnvironment
  shippedEnvironment = {}
  if (!/^ENV LD_PRELOAD=\S*libmimalloc/m.test(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))) return shippedEnvironment
  const lib = ['3', '2'].map((major) => `/usr/lib/${process.arch === 'arm64' ? 'aarch64' : 'x86_64'}-linux-gnu/libmimalloc.so.${major}`).find((path) => existsSync(path))
  if (lib) shippedEnvironment.LD_PRELOAD = lib
  else log("bench: the image preloads mimalloc and this machine has none (Debian's libmimalloc2.0 or libmimalloc3): the servers run on glibc's malloc")
  return shippedEnvironment
}

export type Server = { child: ChildProcess; pid: number; url: string; stdout: () => string; stderr: () => string; stop: () => Promise<void> }

// Where each server's copy of the seed goes, and a replica when it has one (the --replicate variant).
export const WORKDIR = join(CACHE, `run-${process.pid}`)
export const REPLICA_URL = `file://${join(WORKDIR, 'replica')}`
// Litestream 0.5.17 or later: LITESTREAM_BIN, else the workplace's build beside the clone
// (../shared/tools/litestream). Undefined where there is none. The tests use the same one.
export const LITESTREAM = [process.env.LITESTREAM_BIN, join(ROOT, '..', 'shared', 'tools', 'litestream'), '/work/shared/tools/litestream'].find((path) => path && existsSync(path))

// s3rver (S3 on npm) in a process of its own, on the given port (0: any) and cores, one bucket (feed),
// its objects in a folder; stop() ends it. Litestream gets `env`; a restore by hand takes `url`.
export async function startS3rver(port: number, directory: string, cores?: string) {
  const script = `
    import S3rver from 's3rver'
    const [directory, port] = process.argv.slice(1)
    const { port: bound } = await new S3rver({ address: '127.0.0.1', port: Number(port), silent: true, directory, configureBuckets: [{ name: 'feed' }] }).run()
    console.log(bound)`
  const command = [process.execPath, '--input-type=module', '-e', script, directory, String(port)]
  const [file, ...argv] = cores ? ['taskset', '-c', cores, ...command] : command
  const child = spawn(file, argv, { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] })
  // Its port once it listens; an exit or 20 s without it fail the start.
  const started = await Promise.race([
    once(child.stdout!, 'data').then(([chunk]) => String(chunk).trim()),
    once(child, 'exit').then(([code]) => `exited with ${code}`),
    new Promise<string>((resolve) => setTimeout(resolve, 20_000, 'no answer within 20 s').unref()),
  ])
  if (!/^\d+$/.test(started)) {
    child.kill('SIGKILL')
    throw new Error(`s3rver did not start: ${started}`)
  }
  port = Number(started)
  return {
    env: { AWS_ENDPOINT_URL_S3: `http://127.0.0.1:${port}`, AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER' },
    url: `s3://feed/feed.db?endpoint=http://127.0.0.1:${port}`,
    // SIGKILL: on SIGTERM s3rver closes gently, and waits for connections a client keeps open.
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.kill('SIGKILL')
      await once(child, 'exit')
    },
  }
}

// A server run by this Node (or the given one) on the server core (or the given cores), on a fresh copy
// of the seed when given one, in the cgroup when given one.
// Servers that run at the same time each need a workdir of their own.
export async function startServer(script: string, { node = process.execPath, flags = [], seed, cgroup, cores = SERVER_CORE, env = {}, workdir = WORKDIR }: { node?: string; flags?: string[]; seed?: Seed; cgroup?: string; cores?: string; env?: Record<string, string>; workdir?: string }): Promise<Server> {
  mkdirSync(workdir, { recursive: true })
  const copy = join(workdir, 'feed.db')
  // The copy, and the replica and Litestream's own files beside it when it was replicated.
  const clean = () => {
    for (const suffix of ['', '-wal', '-shm']) rmSync(copy + suffix, { force: true })
    for (const path of [join(workdir, 'replica'), join(workdir, '.feed.db-litestream'), join(workdir, '.feed.db-litestream.yml')]) rmSync(path, { recursive: true, force: true })
  }
  clean()
  if (seed) copyFileSync(seed.db, copy)
  // In the cgroup before it starts, so that all it allocates is charged there.
  const command = ['taskset', '-c', cores, node, ...flags, script]
  const [file, ...argv] = cgroup ? ['sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, ...command] : command
  const child = spawn(file, argv, {
    // The seed signs tokens.json with the default secret; naming it also silences the server's warning.
    env: { PATH: process.env.PATH, ...shippedEnv(), SQLITE_PATH: copy, HOST: '127.0.0.1', PORT: '0', JWT_SECRET: 'twelve-dollar-challenge', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => {
    stderr += chunk
    if (!/Debugger|inspector|For help, see|level=INFO/.test(String(chunk))) process.stderr.write(chunk)
  })
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (chunk) => {
      output += chunk
      const match = /listening on (http:\/\/\S+)/.exec(output)
      if (match) resolve(match[1].replace('0.0.0.0', '127.0.0.1'))
    })
    child.once('exit', (code) => reject(new Error(`server exited with ${code}: ${output}${stderr}`)))
  })
  return {
    child,
    pid: child.pid!,
    url,
    stdout: () => output,
    stderr: () => stderr,
    stop: async () => {
      child.kill('SIGTERM')
      if (child.exitCode === null && child.signalCode === null) await once(child, 'exit')
      clean()
    },
  }
}

// The inspector protocol over the WebSocket a server's --inspect opened; output is what it has printed.
export async function openInspector(output: () => string) {
  let wsUrl: string | undefined
  for (let i = 0; i < 100 && !wsUrl; i++) {
    wsUrl = /ws:\/\/\S+/.exec(output())?.[0]
    if (!wsUrl) await new Promise((resolve) => setTimeout(resolve, 50))
  }
  if (!wsUrl) throw new Error('the server did not print its inspector address')
  const socket = new WebSocket(wsUrl)
  await new Promise((resolve, reject) => ((socket.onopen = resolve), (socket.onerror = reject)))
  let id = 0
  const pending = new Map<number, (result: any) => void>()
  socket.onmessage = (event) => {
    const message = JSON.parse(String(event.data))
    pending.get(message.id)?.(message.result)
    pending.delete(message.id)
  }
  return {
    send: (method: string, params = {}) =>
      new Promise<any>((resolve) => {
        pending.set(++id, resolve)
        socket.send(JSON.stringify({ id, method, params }))
      }),
    close: () => socket.close(),
  }
}

export type WrkResult = {
  requests: number; duration_us: number; bad: number; bad_example: string; non2xx: number; socket_errors: number
  p50_us: number; p90_us: number; p99_us: number; max_us: number; loadCpu: number
}

// wrk on the load core; its own CPU is sampled so a run it could not saturate is called out. A request
// unanswered after timeoutS counts as an error.
export async function wrk(url: string, kind: string, seconds: number, tokens: string, { connections = 64, timeoutS = 2 } = {}): Promise<WrkResult> {
  const child = spawn('taskset', ['-c', LOAD_CORE, 'wrk', '-t1', `-c${connections}`, `--timeout`, `${timeoutS}s`, `-d${seconds}s`, '-s', join(ROOT, 'bench', 'wrk.lua'), url, '--', kind, tokens], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  let output = ''
  child.stdout.on('data', (chunk) => (output += chunk))
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
  const loadCpu = first && last && last[0] > first[0] ? ((last[1] - first[1]) * TICK_US) / ((last[0] - first[0]) * 1000) : 0
  return { ...result, loadCpu }
}

// One users generator (bench/users.ts) on the load core, and its JSON events as they come: next('connected')
// once every user has had its first answer, next('done') with the results (bench/users.ts says what).
export function usersGenerator(o: { url: string; connections: number; tokens: string; latencies: string; idle: number; hold: number; ramp: number; loopOnArrival?: boolean }) {
  const child = spawn('taskset', ['-c', LOAD_CORE, process.execPath, join(ROOT, 'bench', 'users.ts'),
    '--url', o.url, '--connections', String(o.connections), '--idle', String(o.idle), '--hold', String(o.hold),
    '--ramp', String(o.ramp), '--tokens', o.tokens, '--latencies', o.latencies, ...(o.loopOnArrival ? ['--loop-on-arrival'] : []),
  ], { stdio: ['ignore', 'pipe', 'inherit'] })
  const events: Record<string, any>[] = []
  let buffered = ''
  const waiters: (() => void)[] = []
  child.stdout.on('data', (chunk) => {
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
      child.once('exit', (code) => (events.some((e) => e.event === name) ? check() : reject(new Error(`a users generator exited with ${code}`))))
      check()
    })
  return { next, pid: child.pid!, kill: () => child.kill('SIGKILL') }
}
