// npm run bench: what the challenge scores, on one core of this machine. First the users holds: 15,000
// users (each a keep-alive connection sending a request every 9 s or so, so that each request arrives
// alone), held by ours, by ours on a second server (the A/A), by ours on @hono/node-server and by the
// three floors (node:http, node:net, node:net with Hono), alternating rounds; then each endpoint at
// saturation, against the Node ceiling measured in the same run. See bench/README.md.
//
//   npm run bench [-- --quick] [--only feed,mix] [--hold 5m] [--ramp 60s] [--connections 15000] [--workers 1]
//                    [--record] [--rounds 3] [--against <git ref>] [--flags=<node flags>]
//                    [--against-flags=<node flags>] [--against-node <version>] [--against-env "<NAME=value ...>"]
//                    [--replicate [--sync-wait] [--s3]]
//                    [--floor] [--together] [--hold-variants "ours again;floor, node:net"]
//   npm run bench -- --box [--rounds 3]       one box: the mix and the write ceiling, one process on one
//                                             core against WORKERS=2 on both
import { rmdirSync, writeFileSync } from 'node:fs'
import { cpus, release, totalmem } from 'node:os'
import { dirname, join } from 'node:path'
import { parseArgs } from 'node:util'
import type { Seed } from '../harness/seed.ts'
import { LITESTREAM, ROOT } from '../harness/tools.ts'
import { PER_GENERATOR, USER_RATE } from './hold.ts'
import {
  buildAgainst,
  commitOf,
  fmt,
  LOAD_CORE,
  log,
  memoryCgroup,
  nodeRelease,
  prepare,
  red,
  REPLICA_URL,
  RESULTS,
  SERVER_CORE,
  sh,
  shippedEnv,
  yellow,
} from './lib.ts'
import { printTable, recordInBenchmarks, roundByRound, type Summary, summarize } from './report.ts'
import {
  type Endpoint,
  endpointsOf,
  LABEL,
  type Saturation,
  saturate,
  saturateTogether,
  type Settings,
  settingsOf,
  stopS3,
  type Variant,
} from './saturation.ts'
import { type Hold, usersComparison, type UsersSettings, usersVariantsOf } from './users-comparison.ts'
import { printUsersReport } from './users-report.ts'

const OPTIONS = {
  quick: { type: 'boolean', default: false },
  only: { type: 'string' },
  hold: { type: 'string' },
  connections: { type: 'string' },
  record: { type: 'boolean', default: false },
  rounds: { type: 'string' },
  ramp: { type: 'string' },
  against: { type: 'string' },
  flags: { type: 'string' },
  workers: { type: 'string', default: '0' }, // as shipped: one process, more only past its open-file limit
  'against-flags': { type: 'string' },
  'against-env': { type: 'string' },
  'against-node': { type: 'string' },
  box: { type: 'boolean', default: false },
  replicate: { type: 'boolean', default: false },
  'sync-wait': { type: 'boolean', default: false },
  s3: { type: 'boolean', default: false },
  floor: { type: 'boolean', default: false },
  together: { type: 'boolean', default: false },
  'hold-variants': { type: 'string' }, // the users holds' variants besides ours, by name, separated by ';'
} as const
type Args = ReturnType<typeof parseArgs<{ options: typeof OPTIONS }>>['values']

// What a comparison measures: its endpoints at saturation, in rounds, and the users holds unless the
// run is about saturation (--only, --box) and no --hold asks for them.
type Plan = {
  only: Endpoint[]
  rounds: number
  settings: Settings
  users: UsersSettings
  runUsers: boolean
  together: boolean
}

function parseDuration(text: string): number {
  const match = /^(\d+(?:\.\d+)?)(s|m)?$/.exec(text)
  if (!match) throw new Error(`a duration is like 60s or 5m, not ${text}`)
  return Number(match[1]) * (match[2] === 'm' ? 60 : 1)
}

function planOf(args: Args): Plan {
  const quick = args.quick
  const settings = settingsOf({ quick, workers: args.workers, s3: args.s3 })
  // The users hold: the users arrive evenly over the ramp, each running its loop from its arrival as a
  // k6 user does; the hold after the ramp is what is measured.
  const users: UsersSettings = {
    connections: Number(args.connections ?? (quick ? 2_000 : 15_000)),
    rampS: parseDuration(args.ramp ?? (quick ? '10s' : '60s')),
    holdS: parseDuration(args.hold ?? (quick ? '15s' : '90s')),
    rounds: Number(args.rounds ?? (quick ? 1 : 2)),
    workers: args.workers,
  }
  const only = endpointsOf(args.only, args.box ? ['mix', 'like', 'create'] : ['feed', 'post', 'like', 'create', 'mix'])
  const runUsers = args.hold !== undefined || (!args.only && !args.box)
  return { only, rounds: Number(args.rounds ?? 1), settings, users, runUsers, together: args.together }
}

export async function main(argv: string[]) {
  const { values: args } = parseArgs({ args: argv, options: OPTIONS })
  const plan = planOf(args)
  const { seed, flags } = prepare(args.flags)
  const cgroup = memoryCgroup()
  const app = join(ROOT, 'dist', 'app.js')
  const ours: Variant = { name: 'ours', app, flags, commit: commitOf(ROOT), node: process.execPath }
  const variants = variantsOf(args, ours)
  const floorFits = plan.users.connections <= PER_GENERATOR
  const names = args['hold-variants']?.split(';').map((name) => name.trim())
  const fit = { floorFits, quick: plan.settings.quick, names }
  const usersVariants = plan.runUsers ? usersVariantsOf(ours, variants, fit) : []
  const sqlite = describe(plan, { ours, variants, usersVariants, floorFits, cgroupNote: cgroup.note })
  try {
    let holds: Hold[] = []
    let users: ReturnType<typeof printUsersReport> | undefined
    if (plan.runUsers) {
      const run = { users: plan.users, settings: plan.settings, seed, cgroup: cgroup.dir }
      holds = await usersComparison(usersVariants, run)
      console.log('')
      users = printUsersReport(holds, usersVariants, plan.users)
    }
    const runs = await saturationRounds(variants, plan, seed, cgroup.dir)
    const rows = plan.only
      .flatMap((e) => (e === 'ceiling' ? ['ceiling'] : variants.map((v) => v.name)).map((v) => summarize(runs, e, v)))
      .filter((r): r is Summary => !!r)
    const c0 = rows.find((r) => r.endpoint === 'ceiling')!.cpu_us
    console.log('')
    printTable(rows, c0)
    if (variants.length > 1) printRatios(rows, runs, variants, plan.only)
    const mix = rows.find((r) => r.endpoint === 'mix' && r.variant === 'ours')
    const usersEstimate = mix ? (0.8 * mix.rps) / USER_RATE : undefined
    if (usersEstimate) {
      console.log(
        `\nestimate, not a measurement: users ~ 0.8 x ${fmt(mix!.rps)} mix req/s / 0.106 = ` +
          `${fmt(usersEstimate)} on one core of this machine`,
      )
    }
    const measured = { sqlite, workers: Number(args.workers), cgroupNote: cgroup.note, holds, users, runs, rows, c0 }
    const result = resultOf(plan, { ours, variants, usersVariants }, { ...measured, usersEstimate })
    const file = join(RESULTS, `${result.date.replace(/[:.]/g, '-')}-${ours.commit}.json`)
    writeFileSync(file, JSON.stringify(result, null, 2))
    console.log(`\nresults: ${file}`)
    const oursHeld = users?.medians.find((m) => m.variant === 'ours')
    const usersRow = { connections: plan.users.connections, holdS: plan.users.holdS, ours: oursHeld }
    if (args.record) recordInBenchmarks(result, rows, usersRow, c0)
    process.exitCode = sayFailures(rows, holds) ? 1 : 0
  } finally {
    await stopS3()
    if (cgroup.dir) rmdirSync(cgroup.dir)
  }
}

type Measured = {
  sqlite: string
  workers: number
  cgroupNote: string
  holds: Hold[]
  users?: ReturnType<typeof printUsersReport>
  runs: Saturation[]
  rows: Summary[]
  c0: number
  usersEstimate?: number
}

// The run's results file: what ran, where and how, every hold and every saturation run, and the summaries.
function resultOf(plan: Plan, { ours, variants, usersVariants }: Omit<Cast, 'floorFits' | 'cgroupNote'>, m: Measured) {
  const { settings, users } = plan
  return {
    date: new Date().toISOString(),
    commit: ours.commit,
    node: process.version,
    sqlite: m.sqlite,
    machine: {
      cpu: cpus()[0].model,
      cores: cpus().length,
      kernel: release(),
      memory_gb: Math.round(totalmem() / 1024 ** 3),
    },
    settings: {
      quick: settings.quick,
      warmup_s: settings.warmupS,
      measure_s: settings.measureS,
      rounds: plan.rounds,
      workers: m.workers,
      cgroup: m.cgroupNote,
      variants,
    },
    // The users holds: each hold (its round and variant), each variant's medians, each variant's ratios
    // to ours round by round (min, max, median), for CPU a request, user, sys, switches, syscalls, and
    // its CPU a request over each floor's the same way (cpu_to_floors).
    users_hold: m.users && {
      settings: {
        connections: users.connections,
        ramp_s: users.rampS,
        hold_s: users.holdS,
        rounds: users.rounds,
        loop_on_arrival: true,
        variants: usersVariants.map((v) => v.name),
      },
      ...m.users,
    },
    holds: m.holds,
    c0_us: m.c0,
    saturation: m.rows,
    runs: m.runs,
    users_estimate: m.usersEstimate,
  }
}

// The variants at saturation: ours, and what the options add to compare it with.
function variantsOf(args: Args, ours: Variant): Variant[] {
  const variants = [ours]
  // One box: the same build as WORKERS=2 on both cores (wrk shares core 0 with it: read its req/s as
  // a floor, its CPU per request as the figure).
  const cores = `${LOAD_CORE},${SERVER_CORE}`
  if (args.box) variants.push({ ...ours, name: 'WORKERS=2, 2 cores', workers: '2', cores })
  const againstFlags = args['against-flags']?.split(' ').filter(Boolean)
  // The same build with more in its environment: an allocator preloaded, say (LD_PRELOAD=... MALLOC_CONF=...).
  const pairs = args['against-env']?.split(' ').filter(Boolean)
  const split = (pair: string) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]
  const againstEnv = pairs && Object.fromEntries(pairs.map(split))
  if (againstEnv) {
    const name = `ours, ${args['against-env']!.replace(/\S*\//g, '')}`.slice(0, 48)
    variants.push({ ...ours, name, env: againstEnv })
  }
  if (args['against-node']) {
    // The same bundle and flags on another Node.
    const node = nodeRelease(args['against-node'])
    variants.push({ ...ours, name: `Node ${args['against-node']}`, flags: againstFlags ?? ours.flags, node })
  } else if (args.against || againstFlags) {
    const app = args.against ? buildAgainst(args.against) : ours.app
    const commit = args.against ? sh('git', ['rev-parse', '--short', args.against]) : ours.commit
    const name = args.against ? `against ${args.against}` : 'against'
    variants.push({ name, app, flags: againstFlags ?? ours.flags, commit, node: process.execPath })
  }
  // The stack's floor (bench/floor.ts): the same SQL with nothing of ours around it, same Node and flags.
  if (args.floor) variants.push({ ...ours, name: 'floor', app: join(ROOT, 'bench', 'floor.ts') })
  if (args.replicate) variants.push(...replicated(variants, ours, args['sync-wait']))
  return variants
}

// The same server as `npm start` runs it with LITESTREAM_REPLICA_URL: under `litestream replicate`,
// whose CPU counts as the server's (one core holds both), replicating to a folder beside the copy.
// With --sync-wait, a second such server acknowledges each write once the replica holds it; with
// --s3, each replicates to s3rver instead of a folder.
function replicated(variants: Variant[], ours: Variant, syncWait: boolean): Variant[] {
  if (!LITESTREAM) {
    throw new Error('--replicate needs Litestream 0.5.17: set LITESTREAM_BIN, or put it at ../shared/tools/litestream')
  }
  const env = { LITESTREAM_REPLICA_URL: REPLICA_URL, LITESTREAM_BIN: LITESTREAM }
  const start = join(ROOT, 'dist', 'start.js')
  const more: Variant[] = [{ ...ours, name: 'litestream', app: start, env }]
  // With --against, that build under Litestream too: what a change costs a replicated server.
  const against = variants.find((v) => v.name.startsWith('against'))
  if (against) {
    more.push({ ...against, name: `litestream, ${against.name}`, app: join(dirname(against.app), 'start.js'), env })
  }
  if (syncWait) more.push({ ...ours, name: 'litestream wait', app: start, env: { ...env, LITESTREAM_SYNC: 'wait' } })
  return more
}

// A Node's version and its SQLite's.
const VERSIONS =
  "import { DatabaseSync } from 'node:sqlite'; const db = new DatabaseSync(':memory:'); " +
  "console.log(`Node ${process.version}, SQLite ${db.prepare('SELECT sqlite_version() AS v').get().v}`)"
const versions = (node: string) => sh(node, ['--input-type=module', '-e', VERSIONS])

type Cast = { ours: Variant; variants: Variant[]; usersVariants: Variant[]; floorFits: boolean; cgroupNote: string }

// What the run measures and how, before it starts; gives this Node's SQLite version.
function describe(plan: Plan, { ours, variants, usersVariants, floorFits, cgroupNote }: Cast): string {
  const { settings, users } = plan
  const sqlite = /SQLite (\S+)/.exec(versions(process.execPath))![1]
  const machine = `${cpus()[0].model} x${cpus().length}`
  console.log(
    `bench ${new Date().toISOString()}: commit ${ours.commit}, Node ${process.version}, SQLite ${sqlite}, ` + machine,
  )
  console.log(`server on core ${SERVER_CORE} (taskset), ${cgroupNote}; load on core ${LOAD_CORE}`)
  if (plan.runUsers) {
    console.log(
      `users holds: ${fmt(users.connections)} users arriving evenly over ${fmt(users.rampS)} s, ` +
        `each looping from its arrival, then ${fmt(users.holdS)} s measured; ` +
        `${users.rounds} round(s) of ${usersVariants.map((v) => v.name).join('; ')}`,
    )
    if (!floorFits) {
      console.log(
        yellow(
          'the floors are one process each, which holds about 19,900 connections here: ' +
            `left out of the users holds above ${fmt(PER_GENERATOR)} users`,
        ),
      )
    }
  }
  console.log(
    `saturation: wrk -t1 -c64, ${settings.warmupS} s warm-up, ${settings.measureS} s measured, ` +
      `${plan.rounds} round(s)`,
  )
  const named = new Map([...usersVariants, ...variants].map((v) => [v.name, v]))
  for (const v of named.values()) {
    if (v.name !== 'ours again') console.log(`${v.name}: ${commandOf(v, settings.workers)} (${versions(v.node)})`)
  }
  return sqlite
}

// How a variant's server is started, as a command line.
function commandOf(v: Variant, workers: string) {
  const replica = v.env?.LITESTREAM_REPLICA_URL ? ` under litestream replicate, to ${v.env.LITESTREAM_REPLICA_URL}` : ''
  const app = v.app.startsWith(ROOT) ? v.app.slice(ROOT.length + 1) : v.app
  const preload = { ...shippedEnv(), ...v.env }.LD_PRELOAD
  // The rest of its own environment (HTTP_SERVER=node-server, say); the replica's is said after.
  const env = Object.entries(v.env ?? {})
    .filter(([name]) => !['LD_PRELOAD', 'LITESTREAM_REPLICA_URL', 'LITESTREAM_BIN'].includes(name))
    .map(([name, value]) => `${name}=${value} `)
    .join('')
  const many = workers !== '0' ? `, WORKERS=${workers}` : ''
  return `${preload ? `LD_PRELOAD=${preload} ` : ''}${env}node ${[...v.flags, app].join(' ')}${many}${replica}`
}

// Every endpoint of --only in rounds, each variant alone (or all together, --together), alternating the
// variants and their order each round so that drift hits them alike.
async function saturationRounds(variants: Variant[], plan: Plan, seed: Seed, cgroup?: string): Promise<Saturation[]> {
  const runs: Saturation[] = []
  const run = { settings: plan.settings, seed, cgroup }
  for (let round = 0; round < plan.rounds; round++) {
    const order = round % 2 ? [...variants].reverse() : variants
    const said = `bench: round ${round + 1}/${plan.rounds}`
    for (const endpoint of plan.only) {
      if (plan.together && endpoint !== 'ceiling') {
        log(`${said} ${LABEL[endpoint]} (${order.map((v) => v.name).join(', ')}, together)`)
        runs.push(...(await saturateTogether(order, endpoint, run)))
        continue
      }
      for (const variant of endpoint === 'ceiling' ? ['ceiling' as const] : order) {
        log(`${said} ${LABEL[endpoint]}${variant === 'ceiling' ? '' : ` (${variant.name})`}`)
        runs.push(await saturate(variant, endpoint, run))
      }
    }
  }
  return runs
}

// Each variant's CPU a request and req/s over ours', endpoint by endpoint.
function printRatios(rows: Summary[], runs: Saturation[], variants: Variant[], only: Endpoint[]) {
  console.log('')
  for (const e of only.filter((x) => x !== 'ceiling')) {
    const [a, ...others] = variants.map((v) => rows.find((r) => r.endpoint === e && r.variant === v.name)!)
    for (const b of others) {
      const litestream = b.litestream_cpu_us
        ? `   (Litestream itself: ${fmt(b.litestream_cpu_us, 1)} of ${fmt(b.cpu_us, 1)} us/req; ` +
          `the replica ${fmt(b.replica_behind_ms / 1000, 1)} s behind at most)`
        : ''
      console.log(
        `${LABEL[e].padEnd(22)} CPU/req ${b.variant} / ours = ${fmt(b.cpu_us / a.cpu_us, 3)}   ` +
          `req/s ${fmt(b.rps / a.rps, 3)}` +
          `${roundByRound(runs, e, b.variant)}${litestream}`,
      )
    }
  }
}

// Honest results: errors, an unsaturated server or a saturated load tool are said plainly; true when
// the run failed (errors, or a users hold over the pass line).
function sayFailures(rows: Summary[], holds: Hold[]): boolean {
  let failed = false
  for (const r of rows) {
    const what = `${LABEL[r.endpoint]} (${r.variant})`
    if (r.errors) ((failed = true), console.log(red(`${what}: ${r.errors} bad responses, e.g. ${r.error_example}`)))
    const [load, server] = [fmt(r.load_cpu * 100), fmt(r.server_cpu * 100)]
    if (r.load_cpu > 0.95) {
      console.log(yellow(`${what}: wrk's core was at ${load}%: the load tool may have been the bottleneck`))
    } else if (r.server_cpu < 0.9) console.log(yellow(`${what}: the server's core was at ${server}%: not saturated`))
  }
  for (const h of holds) {
    const what = `users hold (${h.variant}, round ${h.round})`
    if (h.errors) ((failed = true), console.log(red(`${what}: ${h.errors} errors, e.g. ${h.error_example}`)))
    if (!h.pass) {
      failed = true
      console.log(
        red(
          `${what}: FAIL, p95 ${fmt(h.p95_ms, 1)} ms, p99 ${fmt(h.p99_ms, 1)} ms ` +
            '(the pass line: p95 < 500 ms, p99 < 1 s, < 1% errors)',
        ),
      )
    }
  }
  return failed
}
