// npm run bench -- --caches: what a request of the mix costs in the caches, simulated, ours against the
// node:net floor. Counted instructions leave out what the held users show: a user's next request finds
// its connection's state, and the code of a longer path, gone from the caches. Here valgrind's
// cachegrind simulates the caches of one core while the requests go one at a time, each on the next of
// --connections keep-alive connections in turn (bench/sequence.ts, sendInTurn), to a server on a fresh
// copy of the seed under the same flags as --instructions; runs of n and 2n requests, each figure a
// request (run(2n) - run(n)) / n; the figures repeat within a few percent (bench/README.md, "Simulated
// caches"):
//
//   Ir             instructions, as --instructions counts them
//   L1 misses      of the 32 KB instruction and data caches (8-way, 64 B lines: this machine's)
//   LL misses      of an 8 MB last level (16-way): a quarter of this host's 32 MB L3, the share a guest
//                  among others may count on
//   est. cycles    Ir + 10 x L1 misses + 100 x LL misses, KCachegrind's cycle estimate (CEst) without
//                  its branch terms
//
//   npm run bench -- --caches [--connections 4000] [--n 20000] [--floors]
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { CACHE, type Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { type Target, underValgrind } from './instructions-count.ts'
import { commitOf, fmt, log, prepare, printColumns, RESULTS, resultsFile } from './lib.ts'
import { sendInTurn, sequence } from './sequence.ts'

const CACHES = ['--I1=32768,8,64', '--D1=32768,8,64', '--LL=8388608,16,64']
const TARGETS = [
  ['ours', join('dist', 'app.js')],
  ['floor, node:net', join('bench', 'floor-net.ts')],
]
const MORE_FLOORS = [
  ['floor, node:net + Hono', join('bench', 'floor-hono.ts')],
  ['floor, node:http', join('bench', 'floor.ts')],
]

type Misses = { ir: number; l1: number; ll: number }
const cycles = ({ ir, l1, ll }: Misses) => ir + 10 * l1 + 100 * ll

// cachegrind's totals for a whole run that answers k requests of the mix after every connection's first.
async function simulated(target: Target, seed: Seed, tokens: string[], connections: number, k: number) {
  const out = join(CACHE, `caches-${process.pid}-${Math.random().toString(36).slice(2, 8)}.out`)
  const valgrind = ['valgrind', '--tool=cachegrind', '--cache-sim=yes', ...CACHES, `--cachegrind-out-file=${out}`]
  const prefix = ['setarch', process.arch === 'x64' ? 'x86_64' : 'aarch64', '-R', ...valgrind]
  let text: string
  try {
    await underValgrind(target, seed, prefix, (run) =>
      sendInTurn(run.port, sequence('mix', k, tokens), connections, 120_000),
    )
    text = readFileSync(out, 'utf8')
  } finally {
    rmSync(out, { force: true })
  }
  const events = /^events: (.*)$/m.exec(text)?.[1].trim().split(' ') ?? []
  const totals = /^summary: (.*)$/m.exec(text)?.[1].trim().split(' ').map(Number) ?? []
  const total = (...names: string[]) => names.reduce((sum, name) => sum + totals[events.indexOf(name)], 0)
  const misses = { ir: total('Ir'), l1: total('I1mr', 'D1mr', 'D1mw'), ll: total('ILmr', 'DLmr', 'DLmw') }
  if (!(misses.ir > 0 && Number.isFinite(misses.l1 + misses.ll))) throw new Error(`no cache figures in ${out}`)
  return misses
}

// A target's figures a request: its runs of n and 2n requests, side by side on the two cores.
async function measure(target: Target, seed: Seed, tokens: string[], connections: number, n: number) {
  log(`bench: ${target.name}: 2 valgrind runs, ${fmt(connections)} connections, up to ${fmt(2 * n)} requests`)
  // Both settled before a failure is thrown: each failed run stops its server, and the other's is not left.
  const runs = await Promise.allSettled([n, 2 * n].map((k) => simulated(target, seed, tokens, connections, k)))
  const failed = runs.find((run) => run.status === 'rejected')
  if (failed) throw failed.reason
  const [first, second] = runs.map((run) => (run as PromiseFulfilledResult<Misses>).value)
  return { ir: (second.ir - first.ir) / n, l1: (second.l1 - first.l1) / n, ll: (second.ll - first.ll) / n }
}

export async function main(argv: string[]) {
  const options = {
    connections: { type: 'string', default: '4000' },
    n: { type: 'string', default: '20000' },
    floors: { type: 'boolean', default: false },
    flags: { type: 'string' },
  } as const
  const { values: args } = parseArgs({ args: argv, options })
  const [connections, n] = [Number(args.connections), Number(args.n)]
  if (!(Number.isInteger(connections) && connections >= 1 && Number.isInteger(n) && n >= 1))
    throw new Error('--connections and --n are whole numbers of at least 1')
  const { seed, flags } = prepare(args.flags)
  const tokens = readFileSync(seed.tokens, 'utf8').trim().split('\n')
  const commit = commitOf(ROOT)
  console.log(`bench ${new Date().toISOString()}: commit ${commit}, Node ${process.version}`)
  console.log(`caches: the mix, n = ${fmt(n)}, ${fmt(connections)} connections in turn; ${CACHES.join(' ')}\n`)
  const table: Record<string, Misses> = {}
  for (const [name, script] of [...TARGETS, ...(args.floors ? MORE_FLOORS : [])])
    table[name] = await measure({ name, script: join(ROOT, script), flags }, seed, tokens, connections, n)
  const floor = table['floor, node:net']
  const header = [
    'server',
    'Ir/req',
    'L1 misses/req',
    'LL misses/req',
    'est. cycles/req',
    'Ir x floor',
    'cycles x floor',
  ]
  const rows = Object.entries(table).map(([name, m]) => [
    name,
    fmt(m.ir),
    fmt(m.l1),
    fmt(m.ll, 1),
    fmt(cycles(m)),
    fmt(m.ir / floor.ir, 3),
    fmt(cycles(m) / cycles(floor), 3),
  ])
  printColumns(header, rows)
  mkdirSync(RESULTS, { recursive: true })
  const file = resultsFile(commit, 'caches')
  const result = {
    date: new Date().toISOString(),
    commit,
    node: process.version,
    n,
    connections,
    caches: CACHES,
    table,
  }
  writeFileSync(file, JSON.stringify(result, null, 2))
  console.log(`\nresults: ${file}`)
}
