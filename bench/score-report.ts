// What a score run prints and records (bench/score.ts): the table of its levels, the memory a user, the
// score's line; bench/score.json with --record, and the chart's caption, which leads with that score.
import { existsSync, readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { ROOT } from '../harness/tools.ts'
import { USER_RATE } from './hold.ts'
import { fmt, log } from './lib.ts'
import { BOX_FILES, BOX_MEMORY_MB, clock, type Level, type Scoring } from './score-level.ts'
import type { processesCost } from './score-processes.ts'

// The levels, the memory and the estimate printed; the score as bench/score.json records it.
export function reportScore(
  s: Scoring,
  {
    score,
    confirmed,
    cost,
    estimate,
    full,
  }: {
    score: number
    confirmed?: Level
    cost: Awaited<ReturnType<typeof processesCost>>
    estimate: { users: number; mix_rps: number }
    full: boolean
  },
) {
  printLevels(s.levels)
  console.log('')
  console.log(`measured in ${clock(s.p.elapsed())}: log ${s.logFile}`)
  if (cost) console.log(cost.line)
  const binds = printMemory(s.levels, score, confirmed)
  console.log(
    `estimate from CPU alone, beside it: 0.8 x ${fmt(estimate.mix_rps)} mix req/s / ${USER_RATE} = ` +
      `${fmt(estimate.users)} users on one core of this machine`,
  )
  const line = scoreText(s.levels, score, confirmed)
  console.log(line)
  const box = { memory_mb: BOX_MEMORY_MB, files: BOX_FILES }
  const scored = confirmed?.pass ? score : 0
  return {
    box,
    full,
    levels: s.levels,
    score: scored,
    confirmed,
    processes_cost: cost,
    memory_binds_users: binds,
    line,
  }
}

// Memory a user, all in: at the score and at the best level below it, beyond the warm-up's 1,000; gives
// the users at which the memory guard would bind at the score's rate.
function printMemory(levels: Level[], score: number, confirmed: Level | undefined) {
  const warm = levels[0]
  const below = levels
    .filter((l) => l.pass && l.users < score && l.users > warm.users)
    .sort((a, b) => b.users - a.users)[0]
  let binds: number | undefined
  for (const l of [confirmed, below]) {
    if (!l?.pass) continue
    const m = l.memory_at_peak
    const perUser = ((l.memory_peak_mb - warm.memory_peak_mb) * 1024) / (l.users - warm.users)
    console.log(
      `memory at ${fmt(l.users)} users: ${fmt(l.memory_peak_mb)} MiB at peak (processes ${fmt(m.rss_mb)}, page cache ${fmt(m.cache_mb)}, ` +
        `socket buffers ${fmt(m.sockets_mb)}, kernel ${fmt(m.kernel_mb)}): ${fmt(perUser, 1)} KB a user beyond the warm-up's`,
    )
    // The server's guard takes no more connections with a tenth of the box's memory free.
    binds ??= Math.floor(warm.users + ((BOX_MEMORY_MB * 0.9 - warm.memory_peak_mb) * 1024) / perUser)
  }
  if (binds) {
    console.log(
      `memory binds near ${fmt(binds)} users at that rate: there the memory guard takes no more connections ` +
        `(a tenth of ${fmt(BOX_MEMORY_MB)} MiB free)`,
    )
  }
  return binds
}

// The score's line, as bench/score.json and the chart keep it.
function scoreText(levels: Level[], score: number, confirmed: Level | undefined) {
  const nextFailed = levels.filter((l) => !l.pass && l.users > score).sort((a, b) => a.users - b.users)[0]
  const holdText = `${clock(confirmed?.hold_s ?? 0).replace(/m00s$/, ' min')} hold`
  const tail = nextFailed ? `next level failed on ${nextFailed.limit}` : 'no level failed'
  if (!confirmed?.pass) return `score: 0 users (no level passed its confirmation); ${tail}`
  const { p95_ms, p99_ms, failed } = confirmed
  const figures = `p95 ${fmt(p95_ms, 1)} ms, p99 ${fmt(p99_ms, 1)} ms, ${fmt(failed * 100, 2)}% failed`
  return `score: ${score} users (${holdText}, ${figures}); ${tail}`
}

function printLevels(levels: Level[]) {
  const header = [
    'phase',
    'users',
    'requests',
    'req/s',
    'p95 ms',
    'p99 ms',
    'failed',
    'server CPU',
    'us/req',
    'load CPU',
    'MiB peak',
    'MiB held',
    'processes',
    'result',
  ]
  const lines = levels.map((l) => [
    l.phase,
    fmt(l.users),
    fmt(l.requests),
    fmt(l.rate),
    fmt(l.p95_ms, 1),
    fmt(l.p99_ms, 1),
    `${fmt(l.failed * 100, 2)}%`,
    `${fmt(l.server_cpu * 100)}%`,
    fmt(l.cpu_us, 1),
    `${fmt(l.generator_cpu * 100)}%`,
    fmt(l.memory_peak_mb),
    fmt(l.memory_held_mb),
    String(l.processes),
    l.pass ? 'pass' : `FAIL: ${l.limit}`,
  ])
  const widths = header.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i].length)))
  const row = (cells: string[]) =>
    cells.map((c, i) => (i === 0 || i === cells.length - 1 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')
  console.log(row(header))
  for (const l of lines) console.log(row(l))
}

// The chart says the measured score first, then the estimate, then its own run: bench/score.json is
// what --score --record last measured.
const SCORE_FILE = join(ROOT, 'bench', 'score.json')
export function scoreLine() {
  if (!existsSync(SCORE_FILE)) return ''
  const s = JSON.parse(readFileSync(SCORE_FILE, 'utf8'))
  return (
    `score ${fmt(s.score)} users measured in the box's limits (${s.date.slice(0, 10)}, ${s.commit}${s.full ? ', --full' : ''}); ` +
    `estimate from CPU ${fmt(s.estimate)}. Chart: `
  )
}

// bench/score.json, and the chart's caption redrawn in place (its bars are the saturation run's).
export function recordScore(recorded: {
  commit: string
  full: boolean
  score: number
  estimate: number
  line: string
}) {
  writeFileSync(SCORE_FILE, JSON.stringify({ date: new Date().toISOString(), ...recorded }, null, 2) + '\n')
  const chart = join(ROOT, 'bench', 'chart.svg')
  const caption = /(<text x="16" y="46"[^>]*>)(?:score [^<]*Chart: )?/
  const svg = readFileSync(chart, 'utf8').replace(caption, (_, open) => `${open}${scoreLine()}`)
  writeFileSync(chart, svg)
  log('bench: wrote bench/score.json and the score into bench/chart.svg')
}
