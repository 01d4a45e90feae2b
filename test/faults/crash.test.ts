// Crash safety: a stream of concurrent creates and likes, and the server killed with SIGKILL at five
// points of it. After every kill, each write that was answered 201 (or 200) is in the file, the file
// passes quick_check (integrity_check after the last), and the server serves again on it.
import assert from 'node:assert/strict'
import { DatabaseSync } from 'node:sqlite'
import { after, describe, test } from 'node:test'
import { freshSeededCopy } from '../../harness/seed.ts'
import { startServer } from '../../harness/server.ts'
import { within } from '../../harness/time.ts'

const KILLS = 5
const LANES = 32

describe('SIGKILL in the middle of a stream of writes', () => {
  const db = freshSeededCopy()
  after(() => db.remove())

  test(`loses no acknowledged write, ${KILLS} kills in a row`, async (t) => {
    const created: { id: number; body: string }[] = []
    const liked: { userId: number; postId: number }[] = []
    let sent = 0
    for (let kill = 1; kill <= KILLS; kill++) {
      const server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
      // Kill at a different point of each stream: after 200 to 1,000 acknowledged writes.
      const killAfter = 200 + Math.floor(Math.random() * 800)
      let acknowledged = 0
      let killed = false
      const exited = new Promise((resolve) => server.child.once('exit', resolve))
      const lane = async (n: number) => {
        for (let i = 0; !killed; i++) {
          const user = db.tokens[(n * 97 + i) % db.tokens.length]
          const headers = { authorization: `Bearer ${user.token}`, 'content-type': 'application/json' }
          const isLike = i % 2 === 1
          const postId = 1 + Math.floor(Math.random() * 500_000)
          const body = `crash ${kill}, lane ${n}, write ${i}`
          sent++
          try {
            const res = isLike
              ? await fetch(`${server.url}/posts/${postId}/like`, { method: 'POST', headers })
              : await fetch(`${server.url}/posts`, { method: 'POST', headers, body: JSON.stringify({ body }) })
            if (res.status === 201 || res.status === 200) {
              const answer = await res.json()
              if (isLike) liked.push({ userId: user.id, postId })
              else created.push({ id: answer.post.id, body })
              if (++acknowledged === killAfter) {
                killed = true
                server.child.kill('SIGKILL')
              }
            }
          } catch {
            return // the server is gone
          }
        }
      }
      // A server that stops acknowledging is killed at the deadline, which ends the lanes too.
      await within(
        Promise.all(Array.from({ length: LANES }, (_, n) => lane(n))),
        60_000,
        `${killAfter} acknowledged writes, then the kill`,
      ).finally(() => server.child.kill('SIGKILL'))
      await within(exited, 10_000, 'the killed server to exit')

      // What the crash left: every acknowledged write, in a file that checks out. quick_check reads
      // every page (0.6 s on the seed); integrity_check also matches each index to its table (7 s), so
      // it runs once, after the last kill: what a kill breaks stays broken.
      const check = new DatabaseSync(db.path)
      const pragma = kill === KILLS ? 'integrity_check' : 'quick_check'
      assert.equal(Object.values(check.prepare(`PRAGMA ${pragma}`).get()!)[0], 'ok', pragma)
      const post = check.prepare('SELECT body FROM posts WHERE id = ?')
      const like = check.prepare('SELECT 1 AS found FROM likes WHERE user_id = ? AND post_id = ?')
      const missingPosts = created.filter(
        ({ id, body }) => (post.get(id) as { body?: string } | undefined)?.body !== body,
      )
      const missingLikes = liked.filter(({ userId, postId }) => !like.get(userId, postId))
      check.close()
      t.diagnostic(
        `kill ${kill} after ${killAfter} acknowledged: ${sent} writes sent so far, ${created.length + liked.length} acknowledged, ${created.length + liked.length - missingPosts.length - missingLikes.length} found`,
      )
      assert.deepEqual(missingPosts, [], 'acknowledged posts missing after the crash')
      assert.deepEqual(missingLikes, [], 'acknowledged likes missing after the crash')
    }

    // And it serves again on the same file.
    const server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
    try {
      assert.equal((await fetch(`${server.url}/health`)).status, 200)
      const last = created.at(-1)!
      assert.equal((await (await fetch(`${server.url}/posts/${last.id}`)).json()).post.body, last.body)
    } finally {
      assert.equal(await within(server.stop(), 15_000, 'the server to exit on SIGTERM'), 0)
    }
  })
})
