// npm run bench -- --instructions: what a request costs, counted rather than timed, for ours and the
// floor (bench/floor.ts), each endpoint alone and the mix (bench/sequence.ts: the same requests on
// every run, every answer checked). Three figures a request, from runs on fresh copies of the seed;
// ours is measured twice, the same build (A/A), to know each figure's noise, the floor once:
//
//   instructions  valgrind's count (cachegrind, user space only) of runs of 0, n and 2n requests:
//                 warm = (Ir(2n) - Ir(n)) / n, first n = (Ir(n) - Ir(0)) / n (the JIT's warm-up)
//   CPU time      one plain run: every thread's time on a CPU between request n and 2n, over n
//   syscalls      the same run: perf's count of the syscall tracepoint between 2n and 3n, over n
//   allocated     a run with the inspector: the bytes of the objects V8 allocated between request n and
//                 2n, over n, by its sampling heap profile (the garbage a request leaves, and what it
//                 costs in scavenges)
//
// Under valgrind the server runs with what makes the count repeat (bench/README.md): V8's predictable
// mode (no background threads, no time-driven GC), fixed random and hash seeds, and no address space
// randomization. The syscall and CPU runs use the shipped flags alone.
//
//   --against <ref>   the same for that build; a difference is called only past 3 x the A/A noise
//   --against-flags=<node flags>
//                     that build (or this one, without --against) with these Node flags in place of ours
//   --floors          the node:net floors too (bench/floor-net.ts, bench/floor-hono.ts), counted once each
//   --check           CI's guard: the mix's warm instructions against bench/instructions.json
//   --record          writes this machine's baseline into bench/instructions.json
//
//   npm run bench -- --instructions [--only mix] [--against <ref>] [--against-flags=<node flags>]
//                                   [--check | --record] [--n 2000] [--flags=<node flags>]
//
// Counting is bench/instructions-count.ts; the comparison, the table and the baseline
// bench/instructions-report.ts.
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import type { Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { buildAgainst, commitOf, fmt, prepare, RESULTS, resultsFile } from './lib.ts'
import { cpuName, DEFAULT_N, type Figures, measureTarget, PREDICTABLE, type Target } from './instructions-count.ts'
import {
  checkBaseline,
  mean,
  noiseOf,
  print,
  printVerdicts,
  recordBaseline,
  type Table,
} from './instructions-report.ts'
import { endpointsOf } from './saturation.ts'
import { KINDS, type Kind } from './sequence.ts'

const NET_FLOORS = [
  ['floor, node:net', 'floor-net.ts'],
  ['floor, node:net + Hono', 'floor-hono.ts'],
] as const

type Options = {
  seed: Seed
  flags: string[]
  only?: Kind[]
  against?: { ref: string; app: string; flags: string[] }
  floors?: boolean // the node:net floors too: what node:http costs, and what Hono adds on node:net
  n?: number
}

// Ours twice (the A/A), the floor once, then the node:net floors and --against's build when asked for;
// the table printed, and the verdicts on --against's build.
async function instructionsBench({ seed, flags, only, against, floors = false, n = DEFAULT_N }: Options) {
  const kinds = only ?? [...KINDS]
  const tokens = readFileSync(seed.tokens, 'utf8').trim().split('\n')
  const measure = (target: Target) => measureTarget(target, kinds, seed, tokens, n)
  printSettings(n, flags)
  const ours: Target = { name: 'ours', script: join(ROOT, 'dist', 'app.js'), flags }
  const table: Table = { ours: await measure(ours) }
  const aa: Table = { ours: await measure(ours) }
  const noise = noiseOf(table, aa)
  const averaged: Table = {
    ours: Object.fromEntries(kinds.map((k) => [k, mean(table.ours[k], aa.ours[k])])),
    floor: await measure({ name: 'floor', script: join(ROOT, 'bench', 'floor.ts'), flags }),
  }
  for (const [name, script] of floors ? NET_FLOORS : []) {
    averaged[name] = await measure({ name, script: join(ROOT, 'bench', script), flags })
  }
  let theirs: Record<string, Figures> | undefined
  if (against) {
    theirs = await measure({ name: `against ${against.ref}`, script: against.app, flags: against.flags })
    averaged[`against ${against.ref}`] = theirs
  }
  print(kinds, averaged, { a: table, aa }, noise)
  if (theirs) printVerdicts(kinds, against!.ref, averaged.ours, theirs, noise)
  const passes = { a: table, aa }
  return { kinds, n, cpu: cpuName(), flags, predictable: PREDICTABLE, table: averaged, passes, noise }
}

// What the run counts with: n, the CPU, valgrind, and each kind of run's Node flags.
function printSettings(n: number, flags: string[]) {
  const valgrind = execFileSync('valgrind', ['--version'], { encoding: 'utf8' }).trim()
  console.log(`instructions: n = ${fmt(n)}, one keep-alive connection, ${cpuName()}, valgrind ${valgrind}`)
  console.log(
    `under valgrind: node ${[...flags, ...PREDICTABLE].join(' ')}, setarch -R; CPU time and syscalls: node ${flags.join(' ')}\n`,
  )
}

function saveResult(result: object, commit: string) {
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
  'against-flags': { type: 'string' },
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
  const againstFlags = args['against-flags']?.split(' ').filter(Boolean)
  const against =
    args.against || againstFlags
      ? {
          ref: [args.against, againstFlags?.join(' ')].filter(Boolean).join(', '),
          app: args.against ? buildAgainst(args.against) : join(ROOT, 'dist', 'app.js'),
          flags: againstFlags ?? flags,
        }
      : undefined
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
