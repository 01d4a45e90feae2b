// npm run bench -- --score [--full]: the challenge's score, found the way the challenge finds it, in the
// box's limits on this machine (bench/README.md, "The score").
//
//   npm run bench -- --score [--full] [--record] [--flags=<node flags>]
//   npm run bench -- --score --full --confirm-from <users>   only its warm-up and confirmation, from there down
//   npm run bench -- --score --full --resume <its log>       an interrupted run, on from its last level
//   npm run bench -- --score --processes 1,3,5 [--users 15000] [--rounds 3] [--against-flags=<flags>]
//                                                            the same users held by 1, 3 and 5 processes
//   npm run bench -- --score --k6 <k6 binary>                its users generator against the real k6, at 10,000 users
//
// The challenge: 1,000 users for 2 minutes as a warm-up; then from 2,500 users, doubling until a level
// fails, then narrowing to within 250; the best level confirmed by a 5-minute hold (after a 60 s ramp),
// and where it fails, the narrowing done again below it on 5-minute holds.
// A level passes at p95 < 500 ms, p99 < 1 s and under 1% failed requests. Here every user is one
// keep-alive connection running the challenge's loop (bench/users.ts), the server runs as shipped on one
// core, the users on the other, and a memory cgroup holds the server to what the box leaves it.
//
// This module is the mode: its options, the run (a warm-up, the search, the confirmation, the processes)
// and the estimate beside it. The procedure is bench/score-search.ts, one level bench/score-level.ts,
// the report bench/score-report.ts, --processes bench/score-processes.ts, --k6 bench/score-k6.ts.
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import type { Seed } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { USER_RATE } from './hold.ts'
import { commitOf, log, prepare, RESULTS, resultsFile } from './lib.ts'
import { saturate, settingsOf, type Variant } from './saturation.ts'
import { boxCgroup, level, levelsOfLog, progress, type Scoring } from './score-level.ts'
import { k6Check } from './score-k6.ts'
import { processesBench, processesCost } from './score-processes.ts'
import { recordScore, reportScore } from './score-report.ts'
import { confirm, doublingsTo, lengthsOf, levelSeconds, search } from './score-search.ts'

async function scoreBench({
  seed,
  flags,
  full,
  estimate,
  commit,
  confirmFrom,
  resume,
}: {
  seed: Seed
  flags: string[]
  full: boolean
  commit: string
  // Skip the search and the narrowing: the confirmation starts here (a level an earlier run found).
  confirmFrom?: number
  // The log of an interrupted run of the same commit and settings: its levels are taken, not measured.
  resume?: string
  estimate: { users: number; mix_rps: number; mix_cpu_us: number; c0_us: number }
}) {
  mkdirSync(RESULTS, { recursive: true })
  const run = { commit, full, flags, confirmFrom: confirmFrom ?? null }
  const logFile = resume ?? join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commit}-score.log`)
  const replay = resume ? levelsOfLog(resume, run) : []
  if (!resume) appendFileSync(logFile, `${JSON.stringify({ run })}\n`)
  const p = progress(logFile, performance.now())
  const s: Scoring = { seed, flags, levels: [], replay, logFile, p, remaining: () => 0 }
  if (resume) log(`score: resuming ${resume}: ${replay.length} level${replay.length === 1 ? '' : 's'} measured already`)
  const lengths = lengthsOf(full)
  const probe = boxCgroup('probe')
  probe.remove()
  log(
    `score: the server on one core (taskset), ${probe.note}; users on the other core; ` +
      `${full ? "the challenge's lengths (--full)" : "shorter lengths than the challenge's (--full for those)"}`,
  )
  const expected = Math.max(2500, estimate.users)
  s.remaining = () => levelSeconds(lengths.search) * (doublingsTo(expected) + 4) + levelSeconds(lengths.confirm)
  await level(s, 1000, 'warm-up', lengths.warmup)
  const { passed, resolution } = await search(s, { full, lengths, confirmFrom, expected })
  const { score, confirmed } = await confirm(s, { from: passed, resolution, lengths })
  // Processes: the box holds 65,535 files a process, this machine 20,000. Where the score needed more
  // processes here than it would there, the same users in both ways, one after the other.
  const cost = await processesCost(s, score, confirmed, lengths.search)
  s.p.done()
  return reportScore(s, { score, confirmed, cost, estimate, full })
}

const OPTIONS = {
  full: { type: 'boolean', default: false },
  record: { type: 'boolean', default: false },
  'confirm-from': { type: 'string' },
  resume: { type: 'string' },
  processes: { type: 'string' },
  users: { type: 'string', default: '15000' },
  rounds: { type: 'string', default: '3' },
  'against-flags': { type: 'string' },
  k6: { type: 'string' },
  flags: { type: 'string' },
} as const

// --score: the score, and its results file; with --record, bench/score.json and the chart's caption.
// --k6: the users generator against k6 instead.
export async function main(argv: string[]) {
  const { values: args } = parseArgs({ args: argv, options: OPTIONS })
  const confirmFrom = args['confirm-from'] ? Number(args['confirm-from']) : undefined
  if (confirmFrom !== undefined && !(confirmFrom >= 2500 && confirmFrom % 250 === 0)) {
    throw new Error('--confirm-from: a number of users, 2,500 or more, in steps of 250')
  }
  const { seed, flags } = prepare(args.flags)
  if (args.k6) {
    const result = await k6Check({ seed, flags, k6: args.k6 })
    writeFileSync(resultsFile(commitOf(ROOT), 'k6-check'), JSON.stringify(result, null, 2))
    return
  }
  const commit = commitOf(ROOT)
  if (args.processes) {
    const flagSets =
      args['against-flags'] === undefined ? [flags] : [flags, args['against-flags'].split(' ').filter(Boolean)]
    const counts = args.processes.split(',').map(Number)
    const result = await processesBench({
      seed,
      flagSets,
      commit,
      counts,
      users: Number(args.users),
      rounds: Number(args.rounds),
    })
    writeFileSync(resultsFile(commit, 'processes'), JSON.stringify(result, null, 2))
    return
  }
  const estimate = await estimateOf(seed, flags, commit)
  const result = await scoreBench({ seed, flags, full: args.full, estimate, commit, confirmFrom, resume: args.resume })
  const file = resultsFile(commit, 'score')
  const results = { date: new Date().toISOString(), commit, node: process.version, estimate, ...result }
  writeFileSync(file, JSON.stringify(results, null, 2))
  console.log(`results: ${file}`)
  if (args.record) {
    recordScore({
      commit,
      full: args.full,
      score: result.score,
      estimate: Math.round(estimate.users),
      line: result.line,
    })
  }
}

// The CPU estimate beside the score: the mix at saturation, against the ceiling, as the plain bench runs it.
async function estimateOf(seed: Seed, flags: string[], commit: string) {
  const ours: Variant = { name: 'ours', app: join(ROOT, 'dist', 'app.js'), flags, commit, node: process.execPath }
  const run = { settings: settingsOf(), seed }
  const ceiling = await saturate('ceiling', 'ceiling', run)
  const mix = await saturate(ours, 'mix', run)
  return { users: (0.8 * mix.rps) / USER_RATE, mix_rps: mix.rps, mix_cpu_us: mix.cpu_us, c0_us: ceiling.cpu_us }
}
