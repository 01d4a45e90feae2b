// The two parts of a write, alone, on whichever Node runs this: a token's HMAC verification through
// WebCrypto (as hono/jwt does it) and a group-committed transaction of likes through node:sqlite. And a
// sparse token check, as the mix's writes come (one in 13 requests): one at a time after the process
// sat idle for a millisecond, through WebCrypto and through node:crypto's HMAC (the floor's), with the
// context switches each costs, over an idle wake-up that checks nothing.
// To compare runtimes, run it with each, pinned to one core, alternating:
//
//   taskset -c 1 node bench/write-parts.ts
//   taskset -c 1 bench/.cache/node-24.22.3/node_modules/.bin/node bench/write-parts.ts
import { createHmac } from 'node:crypto'
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { CACHE, DEFAULT_SECRET, seededDatabase } from '../harness/seed.ts'

const cpuUs = () => {
  const { user, system } = process.cpuUsage()
  return user + system
}

// 64 verifications in flight at a time, as under load; the signature is wrong, which costs the same.
const key = await crypto.subtle.importKey(
  'raw',
  new TextEncoder().encode(DEFAULT_SECRET),
  { name: 'HMAC', hash: 'SHA-256' },
  false,
  ['verify'],
)
const signed = new TextEncoder().encode(
  'eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxIiwidXNlcm5hbWUiOiJ4IiwiZXhwIjo5OTk5OTk5OTk5fQ',
)
const signature = new Uint8Array(32)
const verifyMany = (n: number) =>
  Promise.all(
    Array.from({ length: 64 }, async () => {
      for (let i = 0; i < n / 64; i++) await crypto.subtle.verify('HMAC', key, signature, signed)
    }),
  )
await verifyMany(2_000)
let started = cpuUs()
await verifyMany(20_000)
const verifyUs = (cpuUs() - started) / 20_000

// Context switches of every thread of this process (the threadpool's too), from /proc.
const switches = () =>
  readdirSync('/proc/self/task').reduce((n, task) => {
    const status = readFileSync(`/proc/self/task/${task}/status`, 'utf8')
    return (
      n +
      [...status.matchAll(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)$/gm)].reduce(
        (sum, [, count]) => sum + Number(count),
        0,
      )
    )
  }, 0)
const idle = () => new Promise((resolve) => setTimeout(resolve, 1))
const checks = {
  'an idle wake-up alone': async () => {},
  'WebCrypto (hono/jwt)': () => crypto.subtle.verify('HMAC', key, signature, signed),
  "node:crypto's HMAC (the floor)": async () => createHmac('sha256', DEFAULT_SECRET).update(signed).digest(),
}
// In blocks of 100, one check's after another's, so that the machine's drift falls on all three alike.
const sparse = Object.fromEntries(Object.keys(checks).map((name) => [name, { us: 0, switches: 0 }]))
for (let block = -3; block < 30; block++) {
  // the first 3 rounds warm up
  for (const [name, check] of Object.entries(checks)) {
    const [cpu, switched] = [cpuUs(), switches()]
    for (let i = 0; i < 100; i++) {
      await idle()
      await check()
    }
    if (block < 0) continue
    sparse[name].us += (cpuUs() - cpu) / 3_000
    sparse[name].switches += (switches() - switched) / 3_000
  }
}

// Transactions of 8 likes of random posts, each its own BEGIN IMMEDIATE ... COMMIT, on a copy of the seed.
const dir = join(CACHE, `write-parts-${process.pid}`)
mkdirSync(dir, { recursive: true })
const path = join(dir, 'feed.db')
copyFileSync(seededDatabase().db, path)
const db = new DatabaseSync(path, { timeout: 0 })
db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL')
const begin = db.prepare('BEGIN IMMEDIATE')
const commit = db.prepare('COMMIT')
const like = db.prepare('INSERT OR IGNORE INTO likes (user_id, post_id) SELECT ?, id FROM posts WHERE id = ?')
const transactions = (from: number, n: number) => {
  for (let i = from; i < from + n; i++) {
    begin.run()
    for (let j = 0; j < 8; j++) like.run(1 + ((i * 8 + j) % 50_000), 1 + (((i * 8 + j) * 104_729) % 500_000))
    commit.run()
  }
}
transactions(0, 300)
started = cpuUs()
transactions(300, 3_000)
const transactionUs = (cpuUs() - started) / 3_000
db.close()
rmSync(dir, { recursive: true, force: true })

console.log(
  `Node ${process.version}: HMAC verify ${verifyUs.toFixed(2)} us CPU; transaction of 8 likes ${transactionUs.toFixed(1)} us CPU`,
)
const base = sparse['an idle wake-up alone']
console.log(
  `a sparse token check, after 1 ms idle (${base.us.toFixed(1)} us CPU and ${base.switches.toFixed(1)} context switches a wake-up alone):`,
)
for (const [name, { us, switches }] of Object.entries(sparse).slice(1)) {
  console.log(
    `  ${name}: +${(us - base.us).toFixed(1)} us CPU, +${(switches - base.switches).toFixed(1)} context switches`,
  )
}
