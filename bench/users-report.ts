// The users comparison's report: each variant's medians over its rounds, its ratios to ours round by
// round (the A/A first, to read them against), and its CPU a request over the floors'.
import { PER_GENERATOR } from './hold.ts'
import { fmt, green, median, printColumns, red, yellow } from './lib.ts'
import type { Variant } from './saturation.ts'
import type { Hold, UsersSettings } from './users-comparison.ts'

// Each variant's medians over its rounds.
export function summarizeHolds(holds: Hold[], variant: string) {
  const mine = holds.filter((h) => h.variant === variant)
  const pick = (key: keyof Hold) => median(mine.map((h) => h[key] as number))
  const syscalls = mine.map((h) => h.syscalls).filter((n): n is number => n !== undefined)
  return {
    variant,
    rounds: mine.length,
    rate: pick('rate'),
    cpu_us: pick('cpu_us'),
    user_us: pick('user_us'),
    sys_us: pick('sys_us'),
    server_cpu: pick('server_cpu'),
    switches: pick('switches'),
    voluntary_switches: pick('voluntary_switches'),
    involuntary_switches: pick('involuntary_switches'),
    syscalls: syscalls.length ? median(syscalls) : undefined,
    rss_idle_mb: pick('rss_idle_mb'),
    rss_peak_mb: pick('rss_peak_mb'),
    kb_per_connection: pick('kb_per_connection'),
    p50_ms: pick('p50_ms'),
    p95_ms: pick('p95_ms'),
    p99_ms: pick('p99_ms'),
    errors: mine.reduce((sum, h) => sum + h.errors, 0),
    passed: mine.filter((h) => h.pass).length,
  }
}

// The figures compared with ours, each round's pair alone (variant / ours, the same round).
const RATIOS = [
  ['cpu_us', 'CPU/req'],
  ['user_us', 'user'],
  ['sys_us', 'sys'],
  ['switches', 'switches/req'],
  ['syscalls', 'syscalls/req'],
] as const
type Ratio = (typeof RATIOS)[number][0]
type Spread = { rounds: number[]; min: number; max: number; median: number }

// A figure of the variant's over the same figure of the base's, each round's pair alone.
function ratioSpread(holds: Hold[], variant: string, base: string, key: Ratio): Spread | undefined {
  const rounds = holds
    .filter((h) => h.variant === variant)
    .flatMap((h) => {
      const theirs = holds.find((o) => o.variant === base && o.round === h.round)?.[key]
      const mine = h[key]
      return mine !== undefined && theirs ? [mine / theirs] : []
    })
  if (!rounds.length) return undefined
  const sorted = [...rounds].sort((a, b) => a - b)
  return { rounds, min: sorted[0], max: sorted.at(-1)!, median: median(sorted) }
}

function ratiosToOurs(holds: Hold[], variant: string): Record<Ratio, Spread | undefined> {
  return Object.fromEntries(RATIOS.map(([key]) => [key, ratioSpread(holds, variant, 'ours', key)])) as Record<
    Ratio,
    Spread | undefined
  >
}

// lowest-highest (median) of the rounds, or the one round's figure.
const spreadCell = (s?: Spread) =>
  !s ? '' : s.rounds.length > 1 ? `${fmt(s.min, 3)}-${fmt(s.max, 3)} (${fmt(s.median, 3)})` : fmt(s.median, 3)

// The floors each variant is read against: the stack with nothing of ours (node:http), and the same work
// straight on node:net, which is where ours now serves from.
const FLOOR_BASES = [
  ['floor', '/ floor (node:http)'],
  ['floor, node:net', '/ floor, node:net'],
] as const

// Each variant's CPU a request over each floor's that ran, each round's pair alone, as the ratios to ours.
function printFloorRatios(holds: Hold[], variants: Variant[]) {
  const bases = FLOOR_BASES.filter(([base]) => holds.some((h) => h.variant === base))
  if (!bases.length) return undefined
  const over = (v: Variant) =>
    bases.map(([base]) => [base, v.name === base ? undefined : ratioSpread(holds, v.name, base, 'cpu_us')])
  const ratios = Object.fromEntries(variants.map((v) => [v.name, Object.fromEntries(over(v))]))
  const rounds = Math.max(...bases.map(([base]) => holds.filter((h) => h.variant === base).length))
  console.log(
    `\nCPU/req over the floors', each round's pair${rounds > 1 ? ': lowest-highest (median) of the rounds' : ''}`,
  )
  const lines = variants.map((v) => [v.name, ...bases.map(([base]) => spreadCell(ratios[v.name][base]))])
  printColumns(['', ...bases.map(([, label]) => label)], lines)
  return ratios
}

export function printUsersReport(holds: Hold[], variants: Variant[], users: UsersSettings) {
  const rows = variants.map((v) => summarizeHolds(holds, v.name))
  const rounds = Math.max(...rows.map((r) => r.rounds))
  const many = users.connections > PER_GENERATOR ? 'WORKERS unset' : 'one process'
  const processes = users.workers !== '0' ? `WORKERS=${users.workers}` : many
  console.log(
    `users hold: ${fmt(users.connections)} users (${processes}) arriving over ${fmt(users.rampS)} s, ` +
      `each looping from its arrival, then ${fmt(users.holdS)} s measured; ` +
      `a fresh server each, ${rounds} round${rounds > 1 ? 's' : ''}${rounds > 1 ? ', the order reversed every other round; medians' : ''}`,
  )
  printMedians(rows)
  const ratios = printRatiosToOurs(holds, variants, rounds)
  const cpuToFloors = printFloorRatios(holds, variants)
  const note = holds.find((h) => h.perf_note)?.perf_note
  if (note) console.log(yellow(`syscalls/req left empty: ${note}`))
  for (const h of holds) {
    const what = `users hold (${h.variant}, round ${h.round})`
    if (h.generator_cpu > 0.9) {
      console.log(
        yellow(
          `${what}: a users generator used ${fmt(h.generator_cpu * 100)}% of its core: its timing may be the limit`,
        ),
      )
    }
    if (h.server_cpu > 0.9) {
      console.log(
        yellow(`${what}: the server's core was ${fmt(h.server_cpu * 100)}% busy: near saturation, not the sparse load`),
      )
    }
  }
  return { medians: rows, ratios, cpu_to_floors: cpuToFloors }
}

const MEDIANS = [
  'variant',
  'req/s',
  'CPU us/req',
  'user',
  'sys',
  'core',
  'switches/req',
  'invol',
  'syscalls/req',
  'idle MB',
  'peak MB',
  'KB/conn',
  'p50 ms',
  'p95 ms',
  'p99 ms',
  'errors',
  'pass',
]

function printMedians(rows: ReturnType<typeof summarizeHolds>[]) {
  const syscalls = (n?: number) => (n === undefined ? '' : fmt(n, 1))
  printColumns(
    MEDIANS,
    rows.map((r) => [
      r.variant,
      fmt(r.rate),
      fmt(r.cpu_us, 1),
      fmt(r.user_us, 1),
      fmt(r.sys_us, 1),
      `${fmt(r.server_cpu * 100)}%`,
      fmt(r.switches, 2),
      fmt(r.involuntary_switches, 2),
      syscalls(r.syscalls),
      fmt(r.rss_idle_mb),
      fmt(r.rss_peak_mb),
      fmt(r.kb_per_connection, 1),
      fmt(r.p50_ms, 1),
      fmt(r.p95_ms, 1),
      fmt(r.p99_ms, 1),
      r.errors ? red(fmt(r.errors)) : '0',
      r.passed === r.rounds ? green('PASS') : red(`FAIL ${r.rounds - r.passed}/${r.rounds}`),
    ]),
  )
}

// Every other variant over ours, the A/A first: the same build on a second server, the method's noise,
// to read the others against.
function printRatiosToOurs(holds: Hold[], variants: Variant[], rounds: number) {
  const others = variants.filter((v) => v.name !== 'ours')
  const ratios = Object.fromEntries(others.map((v) => [v.name, ratiosToOurs(holds, v.name)]))
  if (!others.length) return ratios
  console.log(`\nvariant / ours, each round's pair${rounds > 1 ? ': lowest-highest (median) of the rounds' : ''}`)
  const aaFirst = [...others].sort((a, b) => Number(b.name === 'ours again') - Number(a.name === 'ours again'))
  const name = (v: Variant) => (v.name === 'ours again' ? 'ours again (A/A: the noise)' : v.name)
  printColumns(
    ['', ...RATIOS.map(([, label]) => label)],
    aaFirst.map((v) => [name(v), ...RATIOS.map(([key]) => spreadCell(ratios[v.name][key]))]),
  )
  if (others.some((v) => v.name === 'ours again'))
    console.log('A/A: ours on a second server; a ratio within its spread of 1 is no difference.')
  else console.log(yellow('no A/A (--quick holds ours once): read no ratio here as a difference'))
  return ratios
}
