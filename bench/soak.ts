// npm run test:soak: the k6 loop at a steady rate for a long time (30 minutes by default), to show that
// memory and the latency tail stay flat. Not part of CI. Prints a row a minute and, at the end, the
// slope of RSS and of p99 over the run (least squares), with a verdict.
//
//   npm run test:soak [-- --minutes 30] [--users 10000]
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { treeMemoryKb } from '../harness/proc.ts'
import { seededDatabase } from '../harness/seed.ts'
import { shippedNodeFlags } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { benchServer, ensureTools, log, onLoadCore } from './lib.ts'

const { values: args } = parseArgs({
  options: { minutes: { type: 'string', default: '30' }, users: { type: 'string', default: '10000' } },
})
const MINUTES = Number(args.minutes)
const USERS = Number(args.users)
// What "flat" means here: over the run, less growth than this per hour.
const MAX_RSS_SLOPE_MB_PER_H = 20
const MAX_P99_SLOPE_MS_PER_H = 5

// Least-squares slope of y over x.
function slope(points: [number, number][]) {
  const n = points.length
  const mx = points.reduce((s, [x]) => s + x, 0) / n
  const my = points.reduce((s, [, y]) => s + y, 0) / n
  const sxy = points.reduce((s, [x, y]) => s + (x - mx) * (y - my), 0)
  const sxx = points.reduce((s, [x]) => s + (x - mx) ** 2, 0)
  return sxx ? sxy / sxx : 0
}

ensureTools()
execFileSync(process.execPath, ['build.mjs'], { cwd: ROOT, stdio: 'ignore' })
const seed = seededDatabase()
const server = await benchServer(join(ROOT, 'dist', 'app.js'), { flags: shippedNodeFlags(), seed })
log(
  `soak: ${USERS.toLocaleString('en')} users running the k6 loop for ${MINUTES} minutes (about ${Math.round(USERS * 0.106)} requests/s)`,
)
const generator = onLoadCore(
  [
    process.execPath,
    join(ROOT, 'bench', 'users.ts'),
    '--url',
    server.url,
    '--connections',
    String(USERS),
    '--ramp',
    String(USERS / 2_000),
    '--idle',
    '1',
    '--hold',
    String(MINUTES * 60),
    '--interval',
    '60',
    '--tokens',
    seed.tokens,
  ],
  { stdio: ['ignore', 'pipe', 'inherit'] },
)

const rows: { minute: number; rss: number; p99: number; answered: number; errors: number }[] = []
let buffered = ''
let failed = false
generator.stdout!.on('data', (chunk) => {
  buffered += chunk
  const lines = buffered.split('\n')
  buffered = lines.pop()!
  for (const line of lines) {
    const event = JSON.parse(line)
    if (event.event !== 'interval') continue
    const errors = event.errors.status + event.errors.body + event.errors.closed + event.errors.connect
    const row = {
      minute: Math.round(event.seconds / 60),
      rss: treeMemoryKb(server.pid, 'VmRSS') / 1024,
      p99: event.p99_ms,
      answered: event.answered,
      errors,
    }
    rows.push(row)
    console.log(
      `minute ${String(row.minute).padStart(3)}: ${row.answered.toLocaleString('en').padStart(7)} answered, p99 ${row.p99.toFixed(1).padStart(6)} ms, RSS ${row.rss.toFixed(0)} MB, errors so far ${errors}`,
    )
  }
})
await new Promise((resolve) => generator.once('exit', resolve))
await server.stop()

// The first minutes warm caches and heaps; the slope is read over the rest.
const steady = rows.slice(Math.min(2, rows.length - 2))
const rssSlope = slope(steady.map((r) => [r.minute / 60, r.rss])) // MB per hour
const p99Slope = slope(steady.map((r) => [r.minute / 60, r.p99])) // ms per hour
const errors = rows.at(-1)?.errors ?? 0
console.log(
  `\nsoak: RSS slope ${rssSlope.toFixed(1)} MB/h (limit ${MAX_RSS_SLOPE_MB_PER_H}), p99 slope ${p99Slope.toFixed(2)} ms/h (limit ${MAX_P99_SLOPE_MS_PER_H}), ${errors} errors`,
)
failed = errors > 0 || rssSlope > MAX_RSS_SLOPE_MB_PER_H || p99Slope > MAX_P99_SLOPE_MS_PER_H
console.log(failed ? 'soak: FAIL' : 'soak: PASS, flat')
process.exitCode = failed ? 1 : 0
