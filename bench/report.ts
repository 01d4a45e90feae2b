// The comparison's report at saturation: each endpoint's medians over the rounds, the ratios to ours,
// and --record's row in BENCHMARKS.md with the chart redrawn; the chart's caption leads with the score.
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { ROOT } from '../harness/tools.ts'
import { renderChart } from './chart.ts'
import { fmt, log, median, printColumns, red, yellow } from './lib.ts'
import { scoreLine } from './score-report.ts'
import { type Endpoint, LABEL, type Saturation } from './saturation.ts'
import type { summarizeHolds } from './users-report.ts'

export function summarize(runs: Saturation[], endpoint: Endpoint, variant: string) {
  const mine = runs.filter((r) => r.endpoint === endpoint && r.variant === variant)
  if (mine.length === 0) return undefined
  const pick = (key: keyof Saturation) => median(mine.map((r) => r[key] as number))
  return {
    endpoint,
    variant,
    rounds: mine.length,
    rps: pick('rps'),
    p50_ms: pick('p50_ms'),
    p99_ms: pick('p99_ms'),
    cpu_us: pick('cpu_us'),
    litestream_cpu_us: pick('litestream_cpu_us'),
    replica_behind_ms: Math.max(...mine.map((r) => r.replica_behind_ms)),
    server_cpu: pick('server_cpu'),
    load_cpu: Math.max(...mine.map((r) => r.load_cpu)),
    peak_rss_mb: pick('peak_rss_mb'),
    errors: mine.reduce((sum, r) => sum + r.errors, 0),
    error_example: mine.find((r) => r.errors)?.error_example ?? '',
  }
}
export type Summary = NonNullable<ReturnType<typeof summarize>>

// The ratio of each round's pair, which drift moves less than the medians' ratio above: with --together
// the two ran at the same time, and otherwise one right after the other.
export function roundByRound(runs: Saturation[], endpoint: Endpoint, variant: string): string {
  const cpu = (name: string) => runs.filter((r) => r.endpoint === endpoint && r.variant === name).map((r) => r.cpu_us)
  const ours = cpu('ours')
  const ratios = cpu(variant)
    .map((us, i) => us / ours[i])
    .sort((x, y) => x - y)
  if (ratios.length < 2) return ''
  return `   round by round ${fmt(ratios[0], 3)} to ${fmt(ratios.at(-1)!, 3)}, median ${fmt(median(ratios), 3)}`
}

export function printTable(rows: Summary[], c0: number) {
  const header = [
    'endpoint',
    'variant',
    'req/s',
    'p50 ms',
    'p99 ms',
    'errors',
    'CPU us/req',
    'x c0',
    'server CPU',
    'load CPU',
    'peak RSS MB',
  ]
  const lines = rows.map((r) => {
    const load = `${fmt(r.load_cpu * 100)}%`
    return [
      LABEL[r.endpoint],
      r.variant,
      fmt(r.rps),
      fmt(r.p50_ms, 2),
      fmt(r.p99_ms, 2),
      r.errors ? red(String(r.errors)) : '0',
      fmt(r.cpu_us, 1),
      fmt(r.cpu_us / c0, 2),
      `${fmt(r.server_cpu * 100)}%`,
      r.load_cpu > 0.95 ? yellow(load) : load,
      fmt(r.peak_rss_mb),
    ]
  })
  printColumns(header, lines, 2)
}

// users: the users holds' settings, and ours' medians over them (none without the holds).
type UsersRow = { connections: number; holdS: number; ours?: ReturnType<typeof summarizeHolds> }

export function recordInBenchmarks(result: Record<string, any>, rows: Summary[], users: UsersRow, c0: number) {
  const file = join(ROOT, 'BENCHMARKS.md')
  const text = readFileSync(file, 'utf8')
  const marker = '<!-- bench:rows -->'
  if (!text.includes(marker)) throw new Error(`BENCHMARKS.md has no ${marker} line to record before`)
  const ratio = (e: Endpoint) => {
    const r = rows.find((x) => x.endpoint === e && x.variant === 'ours')
    return r ? fmt(r.cpu_us / c0, 2) : '-'
  }
  const mix = rows.find((x) => x.endpoint === 'mix' && x.variant === 'ours')
  // Ours' medians of the users holds; KB/conn since these are the looping users' (bench/README.md).
  const hold = users.ours
  const holdCell = hold
    ? `${fmt(users.connections)} conns at ${fmt(hold.rate)}/s, ${fmt(users.holdS)} s: p99 ${fmt(hold.p99_ms, 1)} ms, ` +
      `${hold.errors} errors, ${fmt(hold.kb_per_connection, 1)} KB/conn, ${fmt(hold.rss_peak_mb)} MB ` +
      (hold.passed === hold.rounds ? 'PASS' : 'FAIL')
    : '-'
  const cells = [
    result.date.slice(0, 10),
    `\`${result.commit}\``,
    fmt(c0, 1),
    ratio('feed'),
    ratio('post'),
    ratio('like'),
    ratio('create'),
    ratio('mix'),
    mix ? fmt(mix.rps) : '-',
    holdCell,
    result.users_estimate ? fmt(result.users_estimate) : '-',
  ]
  writeFileSync(file, text.replace(marker, `| ${cells.join(' | ')} |\n${marker}`))
  const caption = `${scoreLine()}${result.date.slice(0, 10)}, ${result.commit}`
  const charted = rows.filter((r) => r.variant === 'ours' || r.variant === 'ceiling')
  writeFileSync(join(ROOT, 'bench', 'chart.svg'), renderChart(charted, c0, caption))
  log('bench: recorded a row in BENCHMARKS.md and redrew bench/chart.svg')
}
