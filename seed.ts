// Builds the challenge's seed database exactly as the challenge's SEED.md draws it (docs/challenge.md, "The
// challenge's spec"): 50,000 users, 500,000 posts and 2,016,005 likes, every number from mulberry32 with
// seed 42 in the order below, with the spec's word lists. Proves it with the challenge's checksum of every
// row, and writes tokens.json beside it.
//
//   node dist/seed.js [path] [--force] [--if-missing]
//
// The path comes from the argument, else SQLITE_PATH, else data/feed.db.
import { createHash } from 'node:crypto'
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { parseArgs } from 'node:util'
import { sign } from 'hono/jwt'
import { mulberry32 } from './random.ts'
import schema from './schema.sql' with { type: 'text' }

const { values: flags, positionals } = parseArgs({
  allowPositionals: true,
  options: { force: { type: 'boolean' }, 'if-missing': { type: 'boolean' } },
})
const SQLITE_PATH = positionals[0] || process.env.SQLITE_PATH || 'data/feed.db'
const JWT_SECRET = process.env.JWT_SECRET || 'twelve-dollar-challenge'

// The challenge's proof that a seed is its own: the SHA-256 of every row (contentChecksum).
const CHECKSUM = '738d11ab3164c13177e347f75038d1e80b43c64e754544a42d1c32bd8d7bcf1d'

const ADJECTIVES =
  'quiet brave clever sunny rusty swift lazy mellow sharp wild cosmic tiny golden silver happy grumpy curious lucky salty zesty'.split(
    ' ',
  )
const NOUNS =
  'otter falcon badger comet river maple pixel walrus ember glacier lantern meadow nebula orchid pebble quartz raven sparrow thistle willow'.split(
    ' ',
  )
const WORDS =
  'the a an and but or so because while after before just really very kind of sort of maybe probably definitely server database request latency cache index query benchmark droplet cpu memory disk network throughput users coffee morning weekend project deploy release bug feature test rewrite refactor commit branch merge review thinking building shipping learning reading writing debugging measuring watching waiting running walking fast slow small big cheap simple boring clever weird surprising honest careful lucky tired ready done broken today tonight tomorrow yesterday again finally never always sometimes usually rarely once twice this that these those here there everywhere nowhere something nothing everything anything someone nginx node postgres typescript express linux ubuntu systemd load steal swap kernel socket keepalive pool'.split(
    ' ',
  )
const OPENERS = [
  'Hot take:',
  'TIL',
  'Unpopular opinion:',
  'Note to self:',
  'PSA:',
  'Okay so',
  'Update:',
  'Honestly,',
  'Reminder:',
  'Question:',
]
const ENDINGS = ['.', '.', '.', '!', '?', '...']

const USERS = 50_000
const POSTS = 500_000
const TOKEN_USERS = 20_000
const DAY = 86_400_000
const END = Date.UTC(2026, 0, 1)

// mulberry32, seed 42: every number of the data comes from it, in this order.
const next = mulberry32(42)
const randInt = (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1))
const pick = <T>(list: T[]) => list[Math.floor(next() * list.length)]
const expo = (mean: number) => -mean * Math.log(1 - next())

// The times as toISOString writes them, without a Date a row: the seed writes three million, and
// toISOString was a tenth of its time. A day's date is written once, the time of day by hand, from
// whole milliseconds as a Date keeps them.
const dates = new Map<number, string>()
const pad = (n: number, width = 2) => String(n).padStart(width, '0')
function iso(ms: number): string {
  const t = Math.floor(ms)
  const day = Math.floor(t / DAY)
  let date = dates.get(day)
  if (date === undefined) dates.set(day, (date = new Date(day * DAY).toISOString().slice(0, 11)))
  const s = Math.floor(t / 1000) - day * 86_400
  return `${date}${pad(Math.floor(s / 3600))}:${pad(Math.floor(s / 60) % 60)}:${pad(s % 60)}.${pad(t % 1000, 3)}Z`
}

function sentence(): string {
  const n = randInt(4, 14)
  const words: string[] = []
  for (let i = 0; i < n; i++) words.push(pick(WORDS))
  const text = words.join(' ')
  return text[0].toUpperCase() + text.slice(1) + pick(ENDINGS)
}

function postBody(): string {
  const parts: string[] = []
  if (next() < 0.25) parts.push(pick(OPENERS))
  const k = randInt(1, 3)
  for (let i = 0; i < k; i++) parts.push(sentence())
  const body = parts.join(' ')
  return body.length > 500 ? body.slice(0, 497) + '...' : body
}

// One line per tenth on a log, one rewritten line on a terminal.
function progress(label: string, done: number, total: number) {
  const step = Math.ceil(total / 10)
  if (done % step !== 0 && done !== total) return
  const line = `seed: ${label} ${Math.round((100 * done) / total)}% (${done.toLocaleString('en')} of ${total.toLocaleString('en')})`
  if (process.stderr.isTTY) process.stderr.write(`\r${line}${done === total ? '\n' : ''}`)
  else console.error(line)
}

function insertRows(db: DatabaseSync) {
  const insertUser = db.prepare('INSERT INTO users (id, username, created_at) VALUES (?, ?, ?)')
  const insertPost = db.prepare('INSERT INTO posts (id, user_id, body, created_at) VALUES (?, ?, ?, ?)')
  const insertLike = db.prepare('INSERT INTO likes (user_id, post_id, created_at) VALUES (?, ?, ?)')
  const inTransaction = (work: () => void) => {
    db.exec('BEGIN')
    work()
    db.exec('COMMIT')
  }

  inTransaction(() => {
    for (let id = 1; id <= USERS; id++) {
      const username = `${pick(ADJECTIVES)}_${pick(NOUNS)}_${id}`
      insertUser.run(id, username, iso(END - 730 * DAY + next() * 365 * DAY))
      progress('users', id, USERS)
    }
  })

  // The likes start from each post's exact (unrounded) time, so keep it.
  const postTimes = new Float64Array(POSTS)
  const start = END - 365 * DAY
  const step = (365 * DAY) / POSTS
  inTransaction(() => {
    for (let i = 0; i < POSTS; i++) {
      const userId = 1 + Math.floor(USERS * next() * next())
      postTimes[i] = start + i * step + next() * step * 0.9
      insertPost.run(i + 1, userId, postBody(), iso(postTimes[i]))
      progress('posts', i + 1, POSTS)
    }
  })

  const counts = new Int32Array(POSTS)
  const normal = (4 - 0.8 + 0.5) / 0.99
  let total = 0
  for (let i = 0; i < POSTS; i++) {
    const mean = next() < 0.01 ? 80 : normal
    counts[i] = Math.min(800, Math.floor(expo(mean)))
    total += counts[i]
  }

  let written = 0
  inTransaction(() => {
    const likers = new Set<number>()
    for (let i = 0; i < POSTS; i++) {
      likers.clear()
      for (let j = 0; j < counts[i]; j++) {
        let userId = randInt(1, USERS)
        while (likers.has(userId)) userId = randInt(1, USERS)
        likers.add(userId)
        insertLike.run(userId, i + 1, iso(postTimes[i] + next() * 7 * DAY))
        progress('likes', ++written, total)
      }
    }
  })
}

// The checksum as the challenge defines it: SHA-256 over the users by id, the posts by id and the likes
// by post and user, each row its columns joined by '|' and a newline, as the sqlite3 shell prints them.
// SQLite writes the lines, 5,000 ids at a time: a call into JS for every row took twice as long.
function contentChecksum(db: DatabaseSync): string {
  const hash = createHash('sha256')
  const tables = [
    { table: 'users', key: 'id', line: "id || '|' || username || '|' || created_at", order: 'id' },
    { table: 'posts', key: 'id', line: "id || '|' || user_id || '|' || body || '|' || created_at", order: 'id' },
    {
      table: 'likes',
      key: 'post_id',
      line: "user_id || '|' || post_id || '|' || created_at",
      order: 'post_id, user_id',
    },
  ]
  for (const { table, key, line, order } of tables) {
    const lines = db.prepare(
      `SELECT group_concat(${line} || char(10), '' ORDER BY ${order}) AS text FROM ${table} WHERE ${key} > ? AND ${key} <= ?`,
    )
    const { last } = db.prepare(`SELECT max(${key}) AS last FROM ${table}`).get() as { last: number }
    for (let from = 0; from < last; from += 5_000) hash.update((lines.get(from, from + 5_000)?.text as string) ?? '')
  }
  return hash.digest('hex')
}

async function writeTokens(db: DatabaseSync, path: string) {
  const key = await crypto.subtle.importKey(
    'raw',
    new TextEncoder().encode(JWT_SECRET),
    { name: 'HMAC', hash: 'SHA-256' },
    false,
    ['sign'],
  )
  const iat = Math.floor(Date.now() / 1000)
  const exp = iat + 3650 * 86_400
  const users = db.prepare('SELECT id, username FROM users WHERE id <= ? ORDER BY id').all(TOKEN_USERS)
  // Signed all at once: one at a time, each waited for its trip through WebCrypto's thread pool.
  const tokens = await Promise.all(
    (users as { id: number; username: string }[]).map(async ({ id, username }) => ({
      id,
      username,
      token: await sign({ sub: String(id), username, iat, exp }, key, 'HS256'),
    })),
  )
  writeFileSync(path, JSON.stringify(tokens))
}

async function main() {
  if (existsSync(SQLITE_PATH)) {
    if (flags['if-missing']) {
      console.error(`seed: ${SQLITE_PATH} exists, serving it as it is`)
      return
    }
    if (!flags.force) {
      console.error(`seed: ${SQLITE_PATH} exists; pass --force to replace it`)
      process.exitCode = 1
      return
    }
  }
  const started = performance.now()
  const elapsed = () => `${((performance.now() - started) / 1000).toFixed(1)} s`

  // Build beside the target and rename at the end, so no half-built file is ever served.
  mkdirSync(dirname(SQLITE_PATH) || '.', { recursive: true })
  const partial = `${SQLITE_PATH}.partial`
  for (const suffix of ['', '-wal', '-shm', '-journal']) rmSync(partial + suffix, { force: true })
  const db = new DatabaseSync(partial)

  // Loading speed only: the file is renamed into place after it is complete.
  db.exec('PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; PRAGMA cache_size = -262144')
  // The tables first, the secondary indexes once the rows are in: built from sorted keys, not grown
  // row by row. The file comes out the same: VACUUM below builds every index after the rows anyway.
  const statements = schema.split(';').filter((sql) => sql.trim())
  const isIndex = (sql: string) => /^\s*CREATE INDEX/m.test(sql.replace(/^\s*--.*$/gm, ''))
  db.exec(statements.filter((sql) => !isIndex(sql)).join(';'))
  insertRows(db)
  db.exec(statements.filter(isIndex).join(';'))
  console.error(`seed: rows written (${elapsed()}); ANALYZE, VACUUM`)
  db.exec('ANALYZE')
  db.exec('VACUUM')
  db.exec('PRAGMA journal_mode = WAL')

  const checksum = contentChecksum(db)
  if (checksum !== CHECKSUM) {
    db.close()
    rmSync(partial, { force: true })
    throw new Error(`seed: checksum ${checksum} is not the challenge's ${CHECKSUM}; nothing was written`)
  }
  const tokensPath = join(dirname(SQLITE_PATH), 'tokens.json')
  await writeTokens(db, tokensPath)
  db.close()

  for (const suffix of ['-wal', '-shm']) rmSync(SQLITE_PATH + suffix, { force: true })
  renameSync(partial, SQLITE_PATH)
  console.error(
    `seed: ${SQLITE_PATH} ready in ${elapsed()}, checksum ${checksum.slice(0, 8)}…${checksum.slice(-4)} ok; tokens in ${tokensPath}`,
  )
}

await main()
