// Database trouble: while it lasts /health is a 503 "degraded", writes get a clean 503 JSON error,
// reads keep working; when it clears, the server recovers by itself.
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { chmodSync, closeSync, copyFileSync, mkdirSync, openSync, renameSync, rmSync, writeSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { after, describe, test } from 'node:test'
import { DEFAULT_SECRET } from '../../harness/seed.ts'
import { type Server, startServer } from '../../harness/server.ts'
import { sleep, within } from '../../harness/time.ts'
import { asUser, giveTo, runnableByUser, smallDatabase } from '../helpers.ts'

type Small = ReturnType<typeof smallDatabase>

async function serve(db: Small): Promise<Server> {
  giveTo(asUser, db.dir)
  const { node, app } = runnableByUser()
  return startServer(node, [app], {
    env: { SQLITE_PATH: db.path, BUSY_TIMEOUT_MS: '500', JWT_SECRET: DEFAULT_SECRET },
    ...asUser,
  })
}

// A small database and, once start() is called, a server on it; both go away after the describe.
function scenario() {
  const db = smallDatabase()
  let server: Server | undefined
  after(async () => {
    if (server) await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
  })
  return { db, start: async () => (server = await serve(db)) }
}

const like = async (server: Server, db: Small, postId: number, userId = 1 + Math.floor(Math.random() * 50)) =>
  fetch(`${server.url}/posts/${postId}/like`, {
    method: 'POST',
    headers: { authorization: `Bearer ${await db.tokenFor(userId)}` },
  })
const create = async (server: Server, db: Small, body: string) =>
  fetch(`${server.url}/posts`, {
    method: 'POST',
    headers: { authorization: `Bearer ${await db.tokenFor(1)}` },
    body: JSON.stringify({ body }),
  })

async function expectDegraded(server: Server, error: string) {
  const res = await fetch(`${server.url}/health`)
  assert.equal(res.status, 503)
  assert.deepEqual(await res.json(), { status: 'degraded', db: 'unreachable', error })
}

async function expect503(res: Response, error: string) {
  assert.equal(res.status, 503)
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
  assert.deepEqual(await res.json(), { error })
}

// Recovers by itself: /health turns 200 while it is polled (as a load balancer does), and writes work.
async function expectHealthy(server: Server, db: Small) {
  const until = performance.now() + 5_000
  let status = 0
  while (status !== 200 && performance.now() < until) {
    status = (await fetch(`${server.url}/health`)).status
    if (status !== 200) await sleep(100)
  }
  assert.equal(status, 200, '/health did not recover within 5 s')
  assert.equal((await create(server, db, 'after the fault')).status, 201)
}

describe('another connection holds the write lock past the busy timeout', () => {
  const { db, start } = scenario()

  test('writes wait without blocking reads, then get a 503; everything recovers when the lock is released', async () => {
    const server = await start()
    // A first read and a first write, so that what follows times the lock, not a cold start.
    assert.equal((await fetch(`${server.url}/feed`)).status, 200)
    assert.equal((await like(server, db, 6)).status, 201)
    const holder = new DatabaseSync(db.path, { timeout: 0 })
    holder.exec('BEGIN IMMEDIATE')
    try {
      const started = performance.now()
      const write = like(server, db, 5)
      // While the write waits for the lock, reads are answered: a loop asleep in SQLite's busy handler
      // would hold each of them for the whole 500 ms busy timeout; half of it allows a busy machine.
      for (let i = 0; i < 10; i++) {
        const readStarted = performance.now()
        assert.equal((await fetch(`${server.url}/feed`)).status, 200)
        assert.ok(performance.now() - readStarted < 250, 'a read waited for the write lock')
      }
      await expect503(await write, 'database is busy')
      assert.ok(performance.now() - started >= 450, 'the write waited for the busy timeout')
      await expectDegraded(server, 'database is busy')
    } finally {
      holder.exec('ROLLBACK')
      holder.close()
    }
    await expectHealthy(server, db)
  })
})

describe('the disk is full', () => {
  const mount = join(tmpdir(), `feed-full-disk-${process.pid}`)
  let mounted = false
  let server: Server | undefined
  const db = smallDatabase()

  after(async () => {
    if (server) await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    if (mounted) spawnSync('umount', [mount])
    rmSync(mount, { recursive: true, force: true })
    db.remove()
  })

  test('writes get a 503 and /health says so; freeing space brings writes back', async (t) => {
    mkdirSync(mount, { recursive: true })
    const mounting = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', mount], { encoding: 'utf8' })
    if (mounting.status !== 0) {
      t.skip(
        `cannot mount a 4 MB tmpfs here (${mounting.stderr.trim() || 'not permitted'}), so a full disk cannot be made`,
      )
      return
    }
    mounted = true
    const path = join(mount, 'feed.db')
    copyFileSync(db.path, path)
    const onDisk = { ...db, dir: mount, path }
    server = await serve(onDisk)
    assert.equal((await create(server, onDisk, 'before the disk fills')).status, 201)

    // Fill what is left of the disk.
    const filler = join(mount, 'filler')
    const fd = openSync(filler, 'w')
    const block = Buffer.alloc(64 * 1024)
    try {
      for (;;) writeSync(fd, block)
    } catch {
      // ENOSPC: full. Finish the last bytes one at a time.
      try {
        for (;;) writeSync(fd, Buffer.alloc(512))
      } catch {}
    } finally {
      closeSync(fd)
    }
    let failed: Response | undefined
    for (let i = 0; i < 50 && !failed; i++) {
      const res = await create(server, onDisk, `a post that does not fit ${'x'.repeat(400)}`)
      if (res.status !== 201) failed = res
    }
    assert.ok(failed, 'a write failed once the disk was full')
    await expect503(failed, 'database or disk is full')
    await expectDegraded(server, 'disk is full')
    assert.equal((await fetch(`${server.url}/feed`)).status, 200, 'reads still work')

    rmSync(filler)
    await expectHealthy(server, onDisk)
  })
})

describe('the database file is read-only', () => {
  const { db, start } = scenario()

  test('reads work, writes get a 503; once writable again, writes work without a restart', async (t) => {
    if (process.getuid?.() === 0 && asUser.uid === undefined)
      return t.skip('running as root without another user: root ignores file modes')
    chmodSync(db.path, 0o444)
    const server = await start()
    chmodSync(db.path, 0o444) // giveTo changed the owner; the mode is what matters
    assert.equal((await fetch(`${server.url}/posts/1`)).status, 200)
    await expect503(await like(server, db, 7), 'database is read-only')
    await expectDegraded(server, 'database is read-only')

    chmodSync(db.path, 0o644)
    await expectHealthy(server, db)
  })
})

describe('the database file goes missing', () => {
  const { db, start } = scenario()

  test('/health says so and writes get a 503 (nothing is written to a file about to vanish); it recovers when the file is back', async () => {
    const server = await start()
    const away = join(db.dir, 'moved-away.db')
    renameSync(db.path, away)
    try {
      await expectDegraded(server, 'database file is missing')
      await expect503(await create(server, db, 'into a deleted file'), 'database file is missing')
      assert.equal((await fetch(`${server.url}/feed`)).status, 200, 'reads go on from the open file')
    } finally {
      renameSync(away, db.path)
    }
    await expectHealthy(server, db)
    const check = new DatabaseSync(db.path, { readOnly: true })
    const lost = check.prepare("SELECT count(*) AS n FROM posts WHERE body = 'into a deleted file'").get()
    check.close()
    assert.equal(lost?.n, 0, 'the refused write is not in the file')
  })
})

// At start, not while serving: another process holds every lock on the file (an exclusive locking
// mode, as a long write elsewhere might). The start waits, says so, and never
// crashes; past START_WAIT_MS it serves, with /health and reads saying the database is busy.
describe('another process holds every lock on the file when the server starts', () => {
  const db = smallDatabase()
  after(() => db.remove())
  const holdEverything = () => {
    const holder = new DatabaseSync(db.path, { timeout: 0 })
    holder.exec('PRAGMA locking_mode = EXCLUSIVE; BEGIN EXCLUSIVE')
    return () => holder.close()
  }

  test('a lock released within START_WAIT_MS: the start waits for it, then serves', async () => {
    const release = holdEverything()
    giveTo(asUser, db.dir)
    const { node, app } = runnableByUser()
    const starting = startServer(node, [app], { env: { SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET }, ...asUser })
    // The start's "is locked" line comes on stdout, which startServer hands over only once the server
    // listens: nothing to wait for before the release, so the start is given 1.5 s to meet the lock.
    await sleep(1_500)
    release()
    const server = await starting
    try {
      assert.match(server.output(), /is locked by another process .* waiting up to 30 s/)
      assert.match(server.output(), /is free after \d+\.\d s/)
      await expectHealthy(server, db)
    } finally {
      await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    }
  })

  test('a lock held past START_WAIT_MS: the server serves anyway, says busy, and recovers when it is released', async () => {
    const release = holdEverything()
    let server: Server | undefined
    try {
      giveTo(asUser, db.dir)
      const { node, app } = runnableByUser()
      server = await startServer(node, [app], {
        env: { SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET, START_WAIT_MS: '1000' },
        ...asUser,
      })
      assert.match(server.output(), /is still locked after 1 s; serving/)
      await expectDegraded(server, 'database is busy')
      await expect503(await fetch(`${server.url}/feed`), 'database is busy')
      await expect503(await create(server, db, 'while it is locked'), 'database is busy')
    } finally {
      release()
    }
    await expectHealthy(server, db)
    await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
  })
})
