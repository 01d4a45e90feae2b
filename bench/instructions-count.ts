// Counting (bench/instructions.ts): the figures a request of one server, each endpoint alone or the mix
// (bench/sequence.ts), on fresh copies of the seed: valgrind's instruction counts of runs of 0, n and 2n
// requests, one plain run for the CPU time and the syscalls, and one with the inspector for the bytes
// allocated. Under valgrind the server runs with what makes the count repeat (bench/README.md,
// "Counting instructions").
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { processTree } from '../harness/proc.ts'
import { openInspector } from '../harness/server.ts'
import { CACHE, DEFAULT_SECRET, type Seed } from '../harness/seed.ts'
import { fmt, log } from './lib.ts'
import { send, sequence, type Kind } from './sequence.ts'

// Requests a window: the first n warm the JIT up, the next n are counted. --n sets it (the guard's is 2,000).
export const DEFAULT_N = 2_000
// Under valgrind: a repeatable count (bench/README.md, "Counting instructions").
export const PREDICTABLE = ['--predictable', '--random-seed=1', '--hash-seed=1']

export type Target = { name: string; script: string; flags: string[] }
export type Figures = { warm: number; first: number; syscalls: number; cpu: number; alloc: number }
export type Figure = keyof Figures
export const FIGURES: Figure[] = ['warm', 'first', 'syscalls', 'cpu', 'alloc']

// This machine's CPU, by name and by the features that choose code paths (glibc, V8, OpenSSL): counts
// from different ones are not compared.
export const cpuName = () =>
  `${cpus()[0].model} (${readFileSync('/proc/cpuinfo', 'utf8')
    .match(/^flags\s*:\s*(.*)$/m)?.[1]
    .split(' ')
    .filter((f) => /^(avx|avx2|avx512f|bmi2|sha_ni|fma)$/.test(f))
    .join(' ')})`

type Run = { child: ChildProcess; port: number; dir: string; output: () => string; stop: () => Promise<number | null> }

// A server on a fresh copy of the seed, in a folder of its own; prefix runs before node (valgrind...).
async function startTarget(target: Target, seed: Seed, prefix: string[], nodeFlags: string[]): Promise<Run> {
  const dir = join(CACHE, `instructions-${process.pid}-${Math.random().toString(36).slice(2, 8)}`)
  mkdirSync(dir, { recursive: true })
  copyFileSync(seed.db, join(dir, 'feed.db'))
  const command = [...prefix, process.execPath, ...nodeFlags, target.script]
  const child = spawn(command[0], command.slice(1), {
    env: {
      PATH: process.env.PATH,
      SQLITE_PATH: join(dir, 'feed.db'),
      HOST: '127.0.0.1',
      PORT: '0',
      JWT_SECRET: DEFAULT_SECRET,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout!.on('data', (chunk) => (output += chunk))
  child.stderr!.on('data', (chunk) => (output += chunk))
  const deadline = performance.now() + 120_000
  while (!/listening on http:\/\/[^:]+:\d+/.test(output)) {
    if (child.exitCode !== null || performance.now() > deadline) {
      child.kill('SIGKILL')
      throw new Error(`${target.name} did not start: ${output.slice(-2000)}`)
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  const port = Number(/listening on http:\/\/[^:]+:(\d+)/.exec(output)![1])
  // SIGINT to node itself (the last process with the script on its command line): the server stops
  // as it does on Ctrl-C.
  const stop = async () => {
    const node =
      processTree(child.pid!)
        .filter((pid) => readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').includes(target.script))
        .at(-1) ?? child.pid!
    process.kill(node, 'SIGINT')
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000)
    const [code] = child.exitCode === null ? await once(child, 'exit') : [child.exitCode]
    clearTimeout(timer)
    if (code !== 0) throw new Error(`${target.name} exited with ${code}: ${output.slice(-2000)}`)
    return code
  }
  return { child, port, dir, output: () => output, stop }
}

async function answered(run: Run, kind: Kind, from: number, to: number, tokens: string[]) {
  await send(run.port, sequence(kind, to, tokens).slice(from), { timeoutMs: 120_000 })
}

// A server started under valgrind (prefix) serves what `send` sends, then stops, writing valgrind's
// output; a run that failed leaves no server behind.
export async function underValgrind(target: Target, seed: Seed, prefix: string[], send: (run: Run) => Promise<void>) {
  const run = await startTarget(target, seed, prefix, [...target.flags, ...PREDICTABLE])
  try {
    await send(run)
    await run.stop()
  } catch (error) {
    run.child.kill('SIGKILL')
    throw error
  } finally {
    rmSync(run.dir, { recursive: true, force: true })
  }
}

// valgrind's instruction count of a whole run that serves the first k requests of the kind.
async function instructions(target: Target, kind: Kind, k: number, seed: Seed, tokens: string[]): Promise<number> {
  const dir = join(CACHE, `cachegrind-${process.pid}`)
  mkdirSync(dir, { recursive: true })
  const out = join(
    dir,
    `${target.name.replace(/\W+/g, '-')}-${kind}-${k}-${Math.random().toString(36).slice(2, 8)}.out`,
  )
  const prefix = [
    'setarch',
    process.arch === 'x64' ? 'x86_64' : 'aarch64',
    '-R',
    'valgrind',
    '--tool=cachegrind',
    '--cache-sim=no',
    `--cachegrind-out-file=${out}`,
  ]
  await underValgrind(target, seed, prefix, (run) => answered(run, kind, 0, k, tokens))
  const total = Number(/^summary: (\d+)$/m.exec(readFileSync(out, 'utf8'))?.[1])
  rmSync(out, { force: true })
  if (!total) throw new Error(`no instruction count in ${out}`)
  return total
}

// One plain run: every thread's time on a CPU a request, between request n and 2n, then every thread's
// syscalls a request between 2n and 3n (perf counting the syscall tracepoint, which slows each one a
// little: not while the CPU time is taken).
async function plainRun(
  target: Target,
  kind: Kind,
  seed: Seed,
  tokens: string[],
  n: number,
): Promise<{ cpu: number; syscalls: number }> {
  const run = await startTarget(target, seed, [], target.flags)
  const pid = run.child.pid!
  const onCpuNs = () =>
    readdirSync(`/proc/${pid}/task`).reduce((sum, task) => {
      try {
        return sum + Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0])
      } catch {
        return sum // a thread that ended meanwhile
      }
    }, 0)
  try {
    await answered(run, kind, 0, n, tokens)
    const before = onCpuNs()
    await answered(run, kind, n, 2 * n, tokens)
    const cpu = (onCpuNs() - before) / 1000 / n
    const perf = spawn('perf', ['stat', '-x,', '-e', 'raw_syscalls:sys_enter', '-p', String(pid)], {
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    let counted = ''
    perf.stderr.on('data', (chunk) => (counted += chunk))
    await new Promise((resolve) => setTimeout(resolve, 500)) // perf attaches to every thread
    await answered(run, kind, 2 * n, 3 * n, tokens)
    perf.kill('SIGINT')
    await once(perf, 'exit')
    const total = Number(/^(\d+),[^,]*,raw_syscalls:sys_enter/m.exec(counted)?.[1])
    if (!total) throw new Error(`perf counted no syscalls: ${counted}`)
    return { cpu, syscalls: total / n }
  } finally {
    await run.stop()
    rmSync(run.dir, { recursive: true, force: true })
  }
}

// The bytes V8 allocated a request between request n and 2n: the sum of its sampling heap profile, a
// sample every 64 bytes on average, with every object a GC took kept in it (the inspector's
// HeapProfiler, as DevTools records allocations). Not v8.getHeapStatistics()'s total_allocated_bytes,
// which counts the areas V8 hands out to allocate in: an empty timer's tick reads about 46 KB there
// (BENCHMARKS.md, "What a request allocates, counted by object").
async function allocationRun(target: Target, kind: Kind, seed: Seed, tokens: string[], n: number): Promise<number> {
  const run = await startTarget(target, seed, [], [...target.flags, '--inspect=127.0.0.1:0'])
  try {
    const inspector = await openInspector(run.output)
    await inspector.send('HeapProfiler.enable')
    await answered(run, kind, 0, n, tokens)
    await inspector.send('HeapProfiler.startSampling', {
      samplingInterval: 64,
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true,
    })
    await answered(run, kind, n, 2 * n, tokens)
    const { profile } = await inspector.send('HeapProfiler.stopSampling')
    inspector.close()
    return bytesOf(profile.head) / n
  } finally {
    await run.stop()
    rmSync(run.dir, { recursive: true, force: true })
  }
}

type HeapNode = { selfSize: number; children: HeapNode[] }
const bytesOf = (node: HeapNode): number => node.children.reduce((sum, child) => sum + bytesOf(child), node.selfSize)

// Runs the jobs two at a time (valgrind keeps a process on one core; these machines have two).
// A failed job stops the rest, and is thrown once the other job running has ended (each stops its server).
async function inPairs<T>(jobs: (() => Promise<T>)[]): Promise<T[]> {
  const results: T[] = new Array(jobs.length)
  const failures: unknown[] = []
  let next = 0
  const worker = async () => {
    while (next < jobs.length && failures.length === 0) {
      const i = next++
      try {
        results[i] = await jobs[i]()
      } catch (error) {
        failures.push(error)
      }
    }
  }
  await Promise.all([worker(), worker()])
  if (failures.length) throw failures[0]
  return results
}

// Every figure of every kind for one target, one pass, in windows of n requests.
export async function measureTarget(
  target: Target,
  kinds: Kind[],
  seed: Seed,
  tokens: string[],
  n: number,
  figures: Figure[] = FIGURES,
): Promise<Record<string, Figures>> {
  const wants = (f: Figure) => figures.includes(f)
  const jobs: Record<string, () => Promise<number>> = {}
  if (wants('first')) jobs['ir 0'] = () => instructions(target, 'feed', 0, seed, tokens)
  for (const kind of kinds) {
    if (wants('warm') || wants('first')) jobs[`ir ${kind} n`] = () => instructions(target, kind, n, seed, tokens)
    if (wants('warm')) jobs[`ir ${kind} 2n`] = () => instructions(target, kind, 2 * n, seed, tokens)
  }
  const names = Object.keys(jobs)
  log(`bench: ${target.name}: ${names.length} valgrind runs of up to ${fmt(2 * n)} requests`)
  const counted = Object.fromEntries(
    (await inPairs(names.map((name) => jobs[name]))).map((value, i) => [names[i], value]),
  )
  const result: Record<string, Figures> = {}
  for (const kind of kinds) {
    result[kind] = {
      warm: wants('warm') ? (counted[`ir ${kind} 2n`] - counted[`ir ${kind} n`]) / n : NaN,
      first: wants('first') ? (counted[`ir ${kind} n`] - counted['ir 0']) / n : NaN,
      syscalls: NaN,
      cpu: NaN,
      alloc: NaN,
    }
  }
  // The CPU time and the syscalls, then the allocations, one run at a time: the CPU time is timed.
  for (const kind of kinds) {
    if (wants('syscalls') || wants('cpu')) Object.assign(result[kind], await plainRun(target, kind, seed, tokens, n))
    if (wants('alloc')) result[kind].alloc = await allocationRun(target, kind, seed, tokens, n)
  }
  return result
}
