// Processes in the score (bench/score.ts): the box holds 65,535 files a process, this machine 20,000, so
// a score here may need more processes than there. processesCost() measures what the extra ones cost at
// the end of a score run; --processes (processesBench) holds the same users by each number of processes.
import { join } from 'node:path'
import type { Seed } from '../harness/seed.ts'
import { fmt, median, RESULTS } from './lib.ts'
import { BOX_FILES, type Lengths, type Level, level, progress, type Scoring } from './score-level.ts'
import { lengthsOf } from './score-search.ts'

// A limit of open files that splits `users` over `processes` (none for one: it holds them all here).
const nofileFor = (users: number, processes: number) =>
  processes === 1 ? undefined : Math.ceil(users / processes / 0.85) + 64

// --processes: the same users held by each number of processes in turn (a lower limit of open files
// splits them), with each set of flags given, rounds in alternating order; CPU a request against one
// process's, each round's pair alone, and the medians.
export async function processesBench({
  seed,
  flagSets,
  commit,
  counts,
  users,
  rounds,
}: {
  seed: Seed
  flagSets: string[][]
  commit: string
  counts: number[]
  users: number
  rounds: number
}) {
  const logFile = join(RESULTS, `${new Date().toISOString().replace(/[:.]/g, '-')}-${commit}-processes.log`)
  const lengths = lengthsOf(true).search
  const runs: Held[] = []
  const variants = flagSets.flatMap((flags) => counts.map((count) => ({ flags, count })))
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 ? [...variants].reverse() : variants
    for (const { flags, count } of order) {
      const s: Scoring = {
        seed,
        flags,
        levels: [],
        replay: [],
        logFile,
        p: progress(logFile, performance.now()),
        remaining: () => 0,
      }
      const held = await level(s, users, `${count} process${count > 1 ? 'es' : ''}`, lengths, nofileFor(users, count))
      runs.push({ round, flags: flags.join(' '), count, level: held })
    }
  }
  console.log(`${fmt(users)} users, ${lengths.ramp} s ramp, ${lengths.hold} s hold, ${rounds} rounds; medians:`)
  const lines = variants.map(({ flags, count }) => printVariant(runs, flags.join(' '), count, counts[0]))
  return { users, rounds, lengths, lines, runs }
}

type Held = { round: number; flags: string; count: number; level: Level }

// One variant's medians over the rounds, and its CPU a request against the first count's, each round's
// pair alone.
function printVariant(runs: Held[], flags: string, count: number, first: number) {
  const mine = runs.filter((r) => r.count === count && r.flags === flags)
  const ratios = mine.map((r) => {
    const one = runs.find((o) => o.round === r.round && o.flags === r.flags && o.count === first)!
    return r.level.cpu_us / one.level.cpu_us
  })
  const line = {
    flags,
    processes: count,
    held_by: median(mine.map((r) => r.level.processes)),
    cpu_us: median(mine.map((r) => r.level.cpu_us)),
    p99_ms: median(mine.map((r) => r.level.p99_ms)),
    memory_peak_mb: median(mine.map((r) => r.level.memory_peak_mb)),
    ratio: median(ratios),
    ratios,
    passed: mine.every((r) => r.level.pass),
  }
  console.log(
    `  ${line.flags || '(no flags)'}, ${count} process${count > 1 ? 'es' : ''} (${line.held_by} seen): ` +
      `${fmt(line.cpu_us, 1)} us a request, ${fmt(line.ratio, 3)} x ${first}'s (rounds ${ratios.map((r) => fmt(r, 3)).join(', ')}), ` +
      `p99 ${fmt(line.p99_ms, 1)} ms, ${fmt(line.memory_peak_mb)} MiB${line.passed ? '' : ', a hold FAILED'}`,
  )
  return line
}

// The cost of the processes a score needed here beyond the box's: none where the box needs as many;
// otherwise the same users held by one process and by as many as the score needed, CPU a request of each.
export async function processesCost(s: Scoring, users: number, at: Level | undefined, lengths: Lengths) {
  if (!at) return undefined
  const here = at.processes
  const onBox = Math.ceil(users / (BOX_FILES * 0.9))
  const counted = `processes: ${here} here, ${onBox} on the box (65,535 files each)`
  if (here <= onBox) return { here, on_box: onBox, line: `${counted}: the same` }
  // The cost of the extra processes, at a level one process holds here: one, then as many as the score
  // needed, with a limit of files that splits the same users so.
  const same = Math.min(users, 15_000)
  const one = await level(s, same, 'one process', lengths)
  const many = await level(s, same, `${here} processes`, lengths, nofileFor(same, here))
  const ratio = many.cpu_us / one.cpu_us
  return {
    here,
    on_box: onBox,
    users: same,
    one,
    many,
    cpu_ratio: ratio,
    line:
      `${counted}; ${fmt(same)} users in ${many.processes} processes cost ` +
      `${fmt(ratio, 2)} x the CPU a request of one (${fmt(many.cpu_us, 1)} against ${fmt(one.cpu_us, 1)} us), ` +
      `${fmt(many.memory_peak_mb)} against ${fmt(one.memory_peak_mb)} MiB`,
  }
}
