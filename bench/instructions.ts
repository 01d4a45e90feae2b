// npm run bench -- --instructions: what a request costs, counted rather than timed, for ours and the
// floor (bench/floor.ts), each endpoint alone and the mix (bench/sequence.ts: the same requests on
// every run, every answer checked). Three figures a request, from runs on fresh copies of the seed;
// ours is measured twice, the same build (A/A), to know each figure's noise, the floor once:
//
//   instructions  valgrind's count (cachegrind, user space only) of runs of 0, n and 2n requests:
//                 warm = (Ir(2n) - Ir(n)) / n, first n = (Ir(n) - Ir(0)) / n (the JIT's warm-up)
//   CPU time      one plain run: every thread's time on a CPU between request n and 2n, over n
//   allocated     the same run: the bytes V8 allocated between request n and 2n, over n (the garbage a
//                 request leaves, and what it costs in scavenges)
//   syscalls      the same run: perf's count of the syscall tracepoint between 2n and 3n, over n
//
// Under valgrind the server runs with what makes the count repeat (bench/README.md): V8's predictable
// mode (no background threads, no time-driven GC), fixed random and hash seeds, and no address space
// randomization. The syscall and CPU runs use the shipped flags alone.
//
//   --against <ref>   the same for that build; a difference is called only past 3 x the A/A noise
//   --floors          the node:net floors too (bench/floor-net.ts, bench/floor-hono.ts), counted once each
//   --check           CI's guard: the mix's warm instructions against bench/instructions.json
//   --record          writes this machine's baseline into bench/instructions.json
//
//   npm run bench -- --instructions [--only mix] [--against <ref>] [--check | --record] [--n 2000]
//                                   [--flags=<node flags>]
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { cpus } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { processTree } from '../harness/proc.ts'
import { CACHE, DEFAULT_SECRET, type Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { buildAgainst, commitOf, fmt, log, prepare, RESULTS, resultsFile } from './lib.ts'
import { endpointsOf } from './saturation.ts'
import { KINDS, send, sequence, type Kind } from './sequence.ts'

// Requests a window: the first n warm the JIT up, the next n are counted. --n sets it (the guard's is 2,000).
export const DEFAULT_N = 2_000
let N = DEFAULT_N
// Under valgrind: a repeatable count (bench/README.md, "Counting instructions").
const PREDICTABLE = ['--predictable', '--random-seed=1', '--hash-seed=1']
// A difference smaller than this is noise whatever one run's A/A says: runs of the same build spread
// wider than the two of one A/A (the mix's warm count: 285.2k to 286.6k in 6 runs, 0.5%).
const FLOOR = { warm: 0.01, first: 0.01, syscalls: 0.02, cpu: 0.05, alloc: 0.02 }
const BASELINE = join(ROOT, 'bench', 'instructions.json')

export type Target = { name: string; script: string; flags: string[] }
type Figures = { warm: number; first: number; syscalls: number; cpu: number; alloc: number }
type Figure = keyof Figures
const FIGURES: Figure[] = ['warm', 'first', 'syscalls', 'cpu', 'alloc']

const pct = (x: number) => `${x >= 0 ? '+' : ''}${(100 * x).toFixed(2)}%`

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
  const run = await startTarget(target, seed, prefix, [...target.flags, ...PREDICTABLE])
  try {
    await answered(run, kind, 0, k, tokens)
    await run.stop()
  } finally {
    rmSync(run.dir, { recursive: true, force: true })
  }
  const total = Number(/^summary: (\d+)$/m.exec(readFileSync(out, 'utf8'))?.[1])
  rmSync(out, { force: true })
  if (!total) throw new Error(`no instruction count in ${out}`)
  return total
}

// Preloaded in the plain run: on SIGUSR2 the server writes the bytes V8 has allocated since it started.
const ALLOCATED = `--import=data:text/javascript,${encodeURIComponent(
  "import { getHeapStatistics } from 'node:v8'; process.on('SIGUSR2', () => process.stderr.write(`allocated ${getHeapStatistics().total_allocated_bytes}\\n`))",
)}`

// One plain run: every thread's time on a CPU and the bytes V8 allocated, a request, between request n
// and 2n, then every thread's syscalls a request between 2n and 3n (perf counting the syscall
// tracepoint, which slows each one a little: not while the CPU time is taken).
async function plainRun(
  target: Target,
  kind: Kind,
  seed: Seed,
  tokens: string[],
): Promise<{ cpu: number; syscalls: number; alloc: number }> {
  const run = await startTarget(target, seed, [], [...target.flags, ALLOCATED])
  const pid = run.child.pid!
  const allocated = async () => {
    const from = run.output().length
    process.kill(pid, 'SIGUSR2')
    const deadline = performance.now() + 10_000
    let said
    while (!(said = /allocated (\d+)\n/.exec(run.output().slice(from)))) {
      if (performance.now() > deadline) throw new Error(`${target.name} did not say what it allocated`)
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
    return Number(said[1])
  }
  const onCpuNs = () =>
    readdirSync(`/proc/${pid}/task`).reduce((sum, task) => {
      try {
        return sum + Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0])
      } catch {
        return sum // a thread that ended meanwhile
      }
    }, 0)
  try {
    await answered(run, kind, 0, N, tokens)
    const allocatedBefore = await allocated()
    const before = onCpuNs()
    await answered(run, kind, N, 2 * N, tokens)
    const cpu = (onCpuNs() - before) / 1000 / N
    const alloc = ((await allocated()) - allocatedBefore) / N
    const perf = spawn('perf', ['stat', '-x,', '-e', 'raw_syscalls:sys_enter', '-p', String(pid)], {
      stdio: ['ignore', 'ignore', 'pipe'],
    })
    let counted = ''
    perf.stderr.on('data', (chunk) => (counted += chunk))
    await new Promise((resolve) => setTimeout(resolve, 500)) // perf attaches to every thread
    await answered(run, kind, 2 * N, 3 * N, tokens)
    perf.kill('SIGINT')
    await once(perf, 'exit')
    const total = Number(/^(\d+),[^,]*,raw_syscalls:sys_enter/m.exec(counted)?.[1])
    if (!total) throw new Error(`perf counted no syscalls: ${counted}`)
    return { cpu, syscalls: total / N, alloc }
  } finally {
    await run.stop()
    rmSync(run.dir, { recursive: true, force: true })
  }
}

// Runs the jobs two at a time (valgrind keeps a process on one core; these machines have two).
async function inPairs<T>(jobs: (() => Promise<T>)[]): Promise<T[]> {
  const results: T[] = new Array(jobs.length)
  let next = 0
  const worker = async () => {
    while (next < jobs.length) {
      const i = next++
      results[i] = await jobs[i]()
    }
  }
  await Promise.all([worker(), worker()])
  return results
}

// Every figure of every kind for one target, one pass.
async function measureTarget(
  target: Target,
  kinds: Kind[],
  seed: Seed,
  tokens: string[],
  figures: Figure[] = FIGURES,
): Promise<Record<string, Figures>> {
  const wants = (f: Figure) => figures.includes(f)
  const jobs: Record<string, () => Promise<number>> = {}
  if (wants('first')) jobs['ir 0'] = () => instructions(target, 'feed', 0, seed, tokens)
  for (const kind of kinds) {
    if (wants('warm') || wants('first')) jobs[`ir ${kind} n`] = () => instructions(target, kind, N, seed, tokens)
    if (wants('warm')) jobs[`ir ${kind} 2n`] = () => instructions(target, kind, 2 * N, seed, tokens)
  }
  const names = Object.keys(jobs)
  log(`bench: ${target.name}: ${names.length} valgrind runs of up to ${fmt(2 * N)} requests`)
  const counted = Object.fromEntries(
    (await inPairs(names.map((name) => jobs[name]))).map((value, i) => [names[i], value]),
  )
  const result: Record<string, Figures> = {}
  for (const kind of kinds) {
    result[kind] = {
      warm: wants('warm') ? (counted[`ir ${kind} 2n`] - counted[`ir ${kind} n`]) / N : NaN,
      first: wants('first') ? (counted[`ir ${kind} n`] - counted['ir 0']) / N : NaN,
      syscalls: NaN,
      cpu: NaN,
      alloc: NaN,
    }
  }
  // The CPU time, the allocations and the syscalls, one run at a time: the CPU time is timed.
  for (const kind of kinds) {
    if (wants('syscalls') || wants('cpu') || wants('alloc'))
      Object.assign(result[kind], await plainRun(target, kind, seed, tokens))
  }
  return result
}

type Table = Record<string, Record<string, Figures>> // target -> kind -> figures

// The largest A/A difference of each figure, relative, over every kind.
function noiseOf(a: Table, b: Table): Figures {
  const noise: Figures = { warm: 0, first: 0, syscalls: 0, cpu: 0, alloc: 0 }
  for (const target of Object.keys(a)) {
    for (const kind of Object.keys(a[target])) {
      for (const f of FIGURES) {
        const [x, y] = [a[target][kind][f], b[target][kind][f]]
        if (Number.isFinite(x) && Number.isFinite(y)) noise[f] = Math.max(noise[f], Math.abs(x - y) / ((x + y) / 2))
      }
    }
  }
  return noise
}

const mean = (a: Figures, b: Figures): Figures =>
  Object.fromEntries(FIGURES.map((f) => [f, (a[f] + b[f]) / 2])) as Figures

// better, worse or noise: a difference counts past 3 x the A/A noise and past the floor.
function verdict(figure: Figure, ours: number, theirs: number, noise: Figures) {
  const change = (theirs - ours) / ours
  const threshold = Math.max(3 * noise[figure], FLOOR[figure])
  return { change, threshold, call: Math.abs(change) < threshold ? 'noise' : change < 0 ? 'better' : 'worse' }
}

function print(kinds: Kind[], table: Table, passes: { a: Table; aa: Table }, noise: Figures) {
  const header = [
    'endpoint',
    'server',
    'warm Ir/req',
    'A/A',
    'first n Ir/req',
    'A/A',
    'x floor',
    'syscalls/req',
    'A/A',
    'CPU us/req',
    'A/A',
    'alloc B/req',
    'A/A',
  ]
  const rows: string[][] = []
  const aaCell = (target: string, kind: Kind, f: Figure) => {
    const [x, y] = [passes.a[target]?.[kind]?.[f], passes.aa[target]?.[kind]?.[f]]
    return x !== undefined && y !== undefined && Number.isFinite(x) && Number.isFinite(y)
      ? `${((100 * Math.abs(x - y)) / ((x + y) / 2)).toFixed(2)}%`
      : '-'
  }
  for (const kind of kinds) {
    for (const target of Object.keys(table)) {
      const f = table[target][kind]
      const floor = table.floor?.[kind]?.warm
      rows.push([
        kind,
        target,
        fmt(f.warm),
        aaCell(target, kind, 'warm'),
        fmt(f.first),
        aaCell(target, kind, 'first'),
        floor ? fmt(f.warm / floor, 2) : '-',
        fmt(f.syscalls, 2),
        aaCell(target, kind, 'syscalls'),
        fmt(f.cpu, 1),
        aaCell(target, kind, 'cpu'),
        fmt(f.alloc),
        aaCell(target, kind, 'alloc'),
      ])
    }
  }
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)))
  const line = (cells: string[]) =>
    cells.map((c, i) => (i < 2 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')
  console.log(line(header))
  for (const r of rows) console.log(line(r))
  console.log(
    `\nA/A noise, the largest difference of the same build run twice: warm Ir ${pct(noise.warm)}, first n Ir ${pct(noise.first)}, syscalls ${pct(noise.syscalls)}, CPU time ${pct(noise.cpu)}, allocated ${pct(noise.alloc)}`,
  )
}

// Each kind's figures of `ref` against ours, called a difference only past the noise.
function printVerdicts(
  kinds: Kind[],
  ref: string,
  ours: Record<string, Figures>,
  theirs: Record<string, Figures>,
  noise: Figures,
) {
  console.log('')
  const floors = FIGURES.map((f) => pct(FLOOR[f])).join('/')
  for (const kind of kinds) {
    const calls = FIGURES.map((f) => {
      const v = verdict(f, ours[kind][f], theirs[kind][f], noise)
      return `${f} ${pct(v.change)} ${v.call}`
    })
    console.log(
      `${kind.padEnd(7)} ${ref} against ours: ${calls.join(', ')}   (called past 3 x the A/A noise and ${floors})`,
    )
  }
}

const NET_FLOORS = [
  ['floor, node:net', 'floor-net.ts'],
  ['floor, node:net + Hono', 'floor-hono.ts'],
] as const

export async function instructionsBench({
  seed,
  flags,
  only,
  against,
  floors = false,
  n = DEFAULT_N,
}: {
  seed: Seed
  flags: string[]
  only?: Kind[]
  against?: { ref: string; app: string }
  floors?: boolean // the node:net floors too: what node:http costs, and what Hono adds on node:net
  n?: number
}) {
  N = n
  const kinds = only ?? [...KINDS]
  const tokens = readFileSync(seed.tokens, 'utf8').trim().split('\n')
  const targets: Target[] = [
    { name: 'ours', script: join(ROOT, 'dist', 'app.js'), flags },
    { name: 'floor', script: join(ROOT, 'bench', 'floor.ts'), flags },
  ]
  console.log(
    `instructions: n = ${fmt(N)}, one keep-alive connection, ${cpuName()}, valgrind ${execFileSync('valgrind', ['--version'], { encoding: 'utf8' }).trim()}`,
  )
  console.log(
    `under valgrind: node ${[...flags, ...PREDICTABLE].join(' ')}, setarch -R; CPU time and syscalls: node ${flags.join(' ')}\n`,
  )
  // Ours twice (the A/A), the floor once.
  const [ours, floor] = targets
  const table: Table = { ours: await measureTarget(ours, kinds, seed, tokens) }
  const aa: Table = { ours: await measureTarget(ours, kinds, seed, tokens) }
  const noise = noiseOf(table, aa)
  const averaged: Table = {
    ours: Object.fromEntries(kinds.map((k) => [k, mean(table.ours[k], aa.ours[k])])),
    floor: await measureTarget(floor, kinds, seed, tokens),
  }
  for (const [name, script] of floors ? NET_FLOORS : []) {
    averaged[name] = await measureTarget({ name, script: join(ROOT, 'bench', script), flags }, kinds, seed, tokens)
  }
  let theirs: Record<string, Figures> | undefined
  if (against) {
    theirs = await measureTarget({ name: `against ${against.ref}`, script: against.app, flags }, kinds, seed, tokens)
    averaged[`against ${against.ref}`] = theirs
  }
  print(kinds, averaged, { a: table, aa }, noise)
  if (theirs) printVerdicts(kinds, against!.ref, averaged.ours, theirs, noise)
  return {
    kinds,
    n: N,
    cpu: cpuName(),
    flags,
    predictable: PREDICTABLE,
    table: averaged,
    passes: { a: table, aa },
    noise,
  }
}

type Baseline = {
  cpu: string
  node: string
  n: number
  mix_warm_ir: number
  noise: number
  recorded: string
  commit: string
}

// CI's guard: the mix's warm instructions a request, ours, against this CPU's recorded baseline.
export async function checkBaseline({ seed, flags }: { seed: Seed; flags: string[] }): Promise<boolean> {
  const tokens = readFileSync(seed.tokens, 'utf8').trim().split('\n')
  const baselines: Baseline[] = existsSync(BASELINE) ? JSON.parse(readFileSync(BASELINE, 'utf8')) : []
  const cpu = cpuName()
  const baseline = baselines.find((b) => b.cpu === cpu && b.node === process.version && b.n === N)
  const measured = (
    await measureTarget({ name: 'ours', script: join(ROOT, 'dist', 'app.js'), flags }, ['mix'], seed, tokens, ['warm'])
  ).mix.warm
  console.log(`the mix, warm: ${fmt(measured)} instructions a request (n = ${fmt(N)}, ${cpu}, Node ${process.version})`)
  const update =
    'if a change means it, run `npm run bench -- --instructions --only mix --record` on such a machine and commit bench/instructions.json with the change, saying why'
  if (!baseline) {
    console.log(
      `no baseline for this CPU and Node in bench/instructions.json (it has: ${baselines.map((b) => `${b.cpu}, Node ${b.node}`).join('; ') || 'none'}): not checked; to add one, ${update.slice(update.indexOf('run'))}`,
    )
    return true
  }
  const { change, threshold, call } = verdict('warm', baseline.mix_warm_ir, measured, {
    warm: baseline.noise,
    first: 0,
    syscalls: 0,
    cpu: 0,
    alloc: 0,
  })
  console.log(
    `baseline ${fmt(baseline.mix_warm_ir)} (${baseline.commit}, ${baseline.recorded}): ${pct(change)}, ${call} (threshold ${pct(threshold)}: 3 x its A/A noise, at least ${pct(FLOOR.warm)})`,
  )
  // Better counts too: a baseline left behind a gain would let a later loss of as much pass unseen.
  if (call !== 'noise')
    console.log(`the mix costs ${pct(change)} instructions against the baseline: find out why, or ${update}`)
  return call === 'noise'
}

// This machine's baseline, from a run's A/A: the mix's warm count and its noise.
export function recordBaseline(result: Awaited<ReturnType<typeof instructionsBench>>, commit: string) {
  if (!result.kinds.includes('mix')) throw new Error('--record needs the mix')
  const { a, aa } = result.passes
  const [x, y] = [a.ours.mix.warm, aa.ours.mix.warm]
  const entry: Baseline = {
    cpu: result.cpu,
    node: process.version,
    n: N,
    mix_warm_ir: Math.round((x + y) / 2),
    noise: Math.abs(x - y) / ((x + y) / 2),
    recorded: new Date().toISOString().slice(0, 10),
    commit,
  }
  const baselines: Baseline[] = existsSync(BASELINE) ? JSON.parse(readFileSync(BASELINE, 'utf8')) : []
  const kept = baselines.filter((b) => !(b.cpu === entry.cpu && b.node === entry.node && b.n === entry.n))
  writeFileSync(BASELINE, JSON.stringify([...kept, entry], null, 2) + '\n')
  log(
    `bench: recorded ${fmt(entry.mix_warm_ir)} instructions a request (A/A ${pct(entry.noise)}) for ${entry.cpu} in bench/instructions.json`,
  )
}

export function saveResult(result: object, commit: string) {
  mkdirSync(RESULTS, { recursive: true })
  const file = resultsFile(commit, 'instructions')
  writeFileSync(file, JSON.stringify(result, null, 2))
  console.log(`\nresults: ${file}`)
}

const OPTIONS = {
  only: { type: 'string' },
  against: { type: 'string' },
  floors: { type: 'boolean', default: false },
  check: { type: 'boolean', default: false },
  record: { type: 'boolean', default: false },
  n: { type: 'string' },
  flags: { type: 'string' },
} as const

// --instructions: the count of --only's kinds (every one by default), ours, the floor and --against's
// build, into a results file; --record makes it this machine's baseline; --check is CI's guard.
export async function main(argv: string[]) {
  const { values: args } = parseArgs({ args: argv, options: OPTIONS })
  const kinds = endpointsOf(args.only, [...KINDS]).filter((e) => e !== 'ceiling') as Kind[]
  if (args.check && args.n) throw new Error("--check counts with the baseline's n; leave --n out")
  if (args.record && args.n) throw new Error("--record writes the guard's baseline, counted with its n; leave --n out")
  const { seed, flags } = prepare(args.flags)
  const packages: Record<string, string> = { valgrind: 'valgrind', setarch: 'util-linux', perf: 'linux-perf' }
  // The guard counts instructions only: no perf.
  const needed = Object.keys(packages).filter((tool) => tool !== 'perf' || !args.check)
  const missing = needed.filter((tool) => spawnSync('which', [tool]).status !== 0)
  if (missing.length) {
    throw new Error(
      `--instructions needs ${missing.join(', ')}: apt-get install ${missing.map((t) => packages[t]).join(' ')}`,
    )
  }
  if (args.check) {
    process.exitCode = (await checkBaseline({ seed, flags })) ? 0 : 1
    return
  }
  const against = args.against ? { ref: args.against, app: buildAgainst(args.against) } : undefined
  const commit = commitOf(ROOT)
  console.log(`bench ${new Date().toISOString()}: commit ${commit}, Node ${process.version}`)
  const result = await instructionsBench({
    seed,
    flags,
    only: kinds,
    against,
    floors: args.floors,
    n: args.n ? Number(args.n) : undefined,
  })
  saveResult({ date: new Date().toISOString(), commit, node: process.version, ...result }, commit)
  if (args.record) recordBaseline(result, commit)
}
