// The read statements alone, in one process, on a copy of the seed: microseconds per call (user and
// kernel CPU), per statement shape and per page-cache setting, with SQLite's query plan for each.
// With --after-commit, each call comes after a like committed by a second connection, as another
// process's would be: in WAL mode the reader then drops its whole page cache (and its mapping, with
// mmap) and reads again every page the statement needs; the write's own time is not counted.
//
//   node bench/statements.ts [--calls 200000] [--only post] [--after-commit]
import { copyFileSync, mkdirSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { parseArgs } from 'node:util'
import { CACHE, seededDatabase } from '../harness/seed.ts'

const { values: args } = parseArgs({
  options: {
    calls: { type: 'string', default: '200000' },
    only: { type: 'string' },
    'after-commit': { type: 'boolean', default: false },
  },
})
const CALLS = Number(args.calls)

const POST_FIELDS = `'id', p.id, 'body', p.body, 'created_at', p.created_at`
const LIKES = `(SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)`
const SHAPES: Record<string, { sql: string; param: () => number[] }> = {
  'post, JOIN users': {
    sql: `SELECT json_object('post', json_object(${POST_FIELDS}, 'author', u.username, 'like_count', ${LIKES})) AS json
          FROM posts AS p JOIN users AS u ON u.id = p.user_id WHERE p.id = ?`,
    param: () => [1 + Math.floor(Math.random() * 500_000)],
  },
  'post, author as a scalar subquery': {
    sql: `SELECT json_object('post', json_object(${POST_FIELDS}, 'author', (SELECT username FROM users WHERE id = p.user_id), 'like_count', ${LIKES})) AS json
          FROM posts AS p WHERE p.id = ?`,
    param: () => [1 + Math.floor(Math.random() * 500_000)],
  },
  'feed, JOIN users': {
    sql: `SELECT json_object('posts', json_group_array(json_object(${POST_FIELDS}, 'author', u.username, 'like_count', ${LIKES})
            ORDER BY p.created_at DESC, p.id DESC)) AS json
          FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p
          JOIN users AS u ON u.id = p.user_id`,
    param: () => [],
  },
  'feed, author as a scalar subquery': {
    sql: `SELECT json_object('posts', json_group_array(json_object(${POST_FIELDS}, 'author', (SELECT username FROM users WHERE id = p.user_id), 'like_count', ${LIKES})
            ORDER BY p.created_at DESC, p.id DESC)) AS json
          FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p`,
    param: () => [],
  },
}

const SETTINGS: Record<string, string> = {
  'default cache (2 MB)': '',
  'cache_size 64 MB': 'PRAGMA cache_size = -65536',
  'cache_size 256 MB': 'PRAGMA cache_size = -262144',
  'mmap_size 1 GB': 'PRAGMA mmap_size = 1073741824',
}

const seed = seededDatabase()
const dir = join(CACHE, `statements-${process.pid}`)
mkdirSync(dir, { recursive: true })
const path = join(dir, 'feed.db')
copyFileSync(seed.db, path)

// Another connection's write, committed: a like by one of the first 1,000 users of a random post.
const writer = new DatabaseSync(path)
writer.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL')
const like = writer.prepare('INSERT OR IGNORE INTO likes (user_id, post_id) VALUES (?, ?)')
let likes = 0
const commitALike = () => like.run(1 + (likes++ % 1_000), 1 + Math.floor(Math.random() * 500_000))

for (const [shape, { sql, param }] of Object.entries(SHAPES)) {
  if (args.only && !shape.startsWith(args.only)) continue
  const plan = new DatabaseSync(path).prepare(`EXPLAIN QUERY PLAN ${sql}`).all(...param()) as { detail: string }[]
  console.log(`\n${shape}\n  plan: ${plan.map((r) => r.detail).join('; ')}`)
  for (const [setting, pragma] of Object.entries(SETTINGS)) {
    const db = new DatabaseSync(path)
    db.exec(`PRAGMA journal_mode = WAL; ${pragma}`)
    const statement = db.prepare(sql)
    const calls = (shape.startsWith('feed') ? CALLS / 10 : CALLS) / (args['after-commit'] ? 10 : 1)
    for (let i = 0; i < calls / 4; i++) statement.get(...param()) // warm the cache
    const timed = args['after-commit']
      ? afterCommits(() => statement.get(...param()), calls)
      : alone(() => statement.get(...param()), calls)
    console.log(`  ${setting.padEnd(22)} ${timed}`)
    db.close()
  }
}

// Each call's CPU, user and kernel apart, over `calls` calls one after another.
function alone(call: () => unknown, calls: number): string {
  const cpu = process.cpuUsage()
  const started = performance.now()
  for (let i = 0; i < calls; i++) call()
  const wall = ((performance.now() - started) * 1000) / calls
  const { user, system } = process.cpuUsage(cpu)
  const perCall = (us: number) => (us / calls).toFixed(2)
  return `${wall.toFixed(2).padStart(7)} us/call   (user ${perCall(user)}, kernel ${perCall(system)})`
}

// Each call's time after another connection's commit, the commit not counted: wall time, which on an
// otherwise idle process is the call's CPU.
function afterCommits(call: () => unknown, calls: number): string {
  let ms = 0
  for (let i = 0; i < calls; i++) {
    commitALike()
    const started = performance.now()
    call()
    ms += performance.now() - started
  }
  return `${((ms * 1000) / calls).toFixed(2).padStart(7)} us/call after another connection's commit`
}

writer.close()
rmSync(dir, { recursive: true, force: true })
