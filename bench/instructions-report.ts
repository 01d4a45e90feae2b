// The counts compared (bench/instructions.ts): each figure's A/A noise, the table, the verdicts on
// --against's build (better, worse or noise), and CI's guard: the mix's warm count checked against this
// machine's baseline in bench/instructions.json (--check), and the baseline recorded (--record).
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import type { Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { fmt, log, printColumns } from './lib.ts'
import { cpuName, DEFAULT_N, type Figure, FIGURES, type Figures, measureTarget } from './instructions-count.ts'
import type { Kind } from './sequence.ts'

// A difference smaller than this is noise whatever one run's A/A says: runs of the same build spread
// wider than the two of one A/A (the mix's warm count: 285.2k to 286.6k in 6 runs, 0.5%).
const FLOOR = { warm: 0.01, first: 0.01, syscalls: 0.02, cpu: 0.05, alloc: 0.02 }
const BASELINE = join(ROOT, 'bench', 'instructions.json')

const pct = (x: number) => `${x >= 0 ? '+' : ''}${(100 * x).toFixed(2)}%`

export type Table = Record<string, Record<string, Figures>> // target -> kind -> figures

// The largest A/A difference of each figure, relative, over every kind.
export function noiseOf(a: Table, b: Table): Figures {
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

export const mean = (a: Figures, b: Figures): Figures =>
  Object.fromEntries(FIGURES.map((f) => [f, (a[f] + b[f]) / 2])) as Figures

// better, worse or noise: a difference counts past 3 x the A/A noise and past the floor.
function verdict(figure: Figure, ours: number, theirs: number, noise: Figures) {
  const change = (theirs - ours) / ours
  const threshold = Math.max(3 * noise[figure], FLOOR[figure])
  return { change, threshold, call: Math.abs(change) < threshold ? 'noise' : change < 0 ? 'better' : 'worse' }
}

export function print(kinds: Kind[], table: Table, passes: { a: Table; aa: Table }, noise: Figures) {
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
  printColumns(header, rows, 2)
  console.log(
    `\nA/A noise, the largest difference of the same build run twice: warm Ir ${pct(noise.warm)}, first n Ir ${pct(noise.first)}, syscalls ${pct(noise.syscalls)}, CPU time ${pct(noise.cpu)}, allocated ${pct(noise.alloc)}`,
  )
}

// Each kind's figures of `ref` against ours, called a difference only past the noise.
export function printVerdicts(
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
  const n = DEFAULT_N // --check counts with the baseline's n
  const baseline = baselines.find((b) => b.cpu === cpu && b.node === process.version && b.n === n)
  const ours = { name: 'ours', script: join(ROOT, 'dist', 'app.js'), flags }
  const measured = (await measureTarget(ours, ['mix'], seed, tokens, n, ['warm'])).mix.warm
  console.log(`the mix, warm: ${fmt(measured)} instructions a request (n = ${fmt(n)}, ${cpu}, Node ${process.version})`)
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

// What recordBaseline reads of a run: its kinds, n, CPU and both passes of ours.
type Counted = { kinds: Kind[]; n: number; cpu: string; passes: { a: Table; aa: Table } }

// This machine's baseline, from a run's A/A: the mix's warm count and its noise.
export function recordBaseline(result: Counted, commit: string) {
  if (!result.kinds.includes('mix')) throw new Error('--record needs the mix')
  const { a, aa } = result.passes
  const [x, y] = [a.ours.mix.warm, aa.ours.mix.warm]
  const entry: Baseline = {
    cpu: result.cpu,
    node: process.version,
    n: result.n,
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
