// Commits on shared ticks (app.ts, scheduleCommit), through app.request(): a server whose other
// processes write the same file gives a tick, and each write then waits for the clock's next multiple of
// it, sharing that commit with the writes before it; with no tick each event-loop turn commits its own.
// A file of its own: configure() is once a process.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe, test } from 'node:test'
import { sleep, until, within } from '../harness/time.ts'
import { claims, makeToken } from './helpers.ts'

const dir = mkdtempSync(join(tmpdir(), 'feed-ticks-'))
process.env.SQLITE_PATH = join(dir, 'ticks.db')
process.env.JWT_SECRET = 'a secret only these tests know'
const { app, configure, openDatabase } = await import('../app.ts')

// The tick the server gives, read by the API at each batch; and when each batch that writes committed.
let tick = 0
const commits: number[] = []
configure({ commitTick: () => tick, beforeCommit: () => void commits.push(Date.now()) })
openDatabase()

const token = await makeToken(claims('1', 'alice'), { secret: process.env.JWT_SECRET })
const like = (postId: number) =>
  app.request(`/posts/${postId}/like`, { method: 'POST', headers: { authorization: `Bearer ${token}` } })

before(() => {
  const db = new DatabaseSync(process.env.SQLITE_PATH!)
  db.exec("INSERT INTO users (id, username) VALUES (1, 'alice')")
  for (let id = 1; id <= 4; id++) db.prepare("INSERT INTO posts (id, user_id, body) VALUES (?, 1, 'a post')").run(id)
  db.close()
})
after(() => rmSync(dir, { recursive: true, force: true }))

describe('commits', () => {
  test('with a tick: writes of different turns wait for its next multiple and share one commit', async () => {
    tick = 1000
    commits.length = 0
    // Just past a multiple of the tick, so that both writes come before the next one.
    await until(() => Date.now() % tick < 200, 2_000, 'a tick just begun')
    const boundary = Math.ceil(Date.now() / tick) * tick
    const first = like(1)
    await sleep(50) // another turn of the event loop, and more
    const second = like(2)
    const answers = await within(Promise.all([first, second]), 5_000, 'both likes answered')
    assert.deepEqual(
      answers.map((res) => res.status),
      [201, 201],
    )
    assert.equal(commits.length, 1, 'one commit for both')
    // Timers count from the event loop's clock, which may lag Date.now() by a few milliseconds.
    assert.ok(commits[0] >= boundary - 25, `committed at ${commits[0]}, before the tick at ${boundary}`)
  })

  test('with none: each turn commits its own writes, at its end', async () => {
    tick = 0
    commits.length = 0
    const first = like(3)
    await sleep(50)
    const second = like(4)
    const answers = await within(Promise.all([first, second]), 5_000, 'both likes answered')
    assert.deepEqual(
      answers.map((res) => res.status),
      [201, 201],
    )
    assert.equal(commits.length, 2)
  })
})
