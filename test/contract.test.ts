// The challenge's CONTRACT.md (docs/challenge.md, "The challenge's spec") end to end: the built dist/app.js
// as a real process, on a fresh copy of the seed, on each of its HTTP servers (test/servers.ts).
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { existsSync, readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe } from 'node:test'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { sleep, until, within } from '../harness/time.ts'
import { contractTests } from './contract.ts'
import { forEachServer, test } from './servers.ts'
import { listensOn, readToEnd, serverHasRead } from './sockets.ts'

forEachServer('CONTRACT.md on dist/app.js', (HTTP_SERVER) => {
  let db: ReturnType<typeof freshSeededCopy>
  let server: Server

  before(async () => {
    db = freshSeededCopy()
    server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path, HTTP_SERVER } })
  })

  after(async () => {
    await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
  })

  contractTests(() => ({ url: server.url, tokens: db.tokens }))

  describe('start-up', () => {
    test('warns that JWT_SECRET is not set, since the default secret is public', () => {
      assert.match(
        server.output(),
        /JWT_SECRET is not set: tokens are checked with the challenge's public default secret/,
      )
    })
  })

  describe('with WORKERS=2: two processes on one port, each with its own database connection', () => {
    let copy: ReturnType<typeof freshSeededCopy>
    let workers: Server

    before(async () => {
      copy = freshSeededCopy()
      workers = await startServer(process.execPath, ['dist/app.js'], {
        env: { SQLITE_PATH: copy.path, WORKERS: '2', HTTP_SERVER },
      })
      await until(() => listening(workers) >= 2, 30_000, 'both workers listening') // before the contract runs
    })
    after(() => copy.remove())

    contractTests(() => ({ url: workers.url, tokens: copy.tokens }))

    test('replaces a worker that dies, and keeps serving', async () => {
      const children = () =>
        readFileSync(`/proc/${workers.child.pid}/task/${workers.child.pid}/children`, 'utf8')
          .trim()
          .split(/\s+/)
          .map(Number)
      const [victim] = children()
      process.kill(victim, 'SIGKILL')
      await until(
        () => /worker \d+ exited \(SIGKILL\); starting another/.test(workers.output()),
        30_000,
        'the primary seeing its worker die',
      )
      await until(() => listening(workers) >= 3, 30_000, 'the new worker listening')
      assert.equal(children().length, 2)
      assert.ok(!children().includes(victim))
      for (let i = 0; i < 20; i++) assert.equal((await fetch(`${workers.url}/posts/1`)).status, 200)
    })

    test('SIGTERM lets an in-flight request finish, stops every worker and exits 0, with the WAL checkpointed; more signals change nothing', async () => {
      await stopAcrossARequest(workers, copy.path, copy.tokens[5].token, 'across the stop of the workers')
    })
  })

  describe('stopping', () => {
    test('SIGTERM lets an in-flight request finish, checkpoints the WAL and exits 0; more signals change nothing', async () => {
      const copy = freshSeededCopy()
      try {
        await stopAcrossARequest(
          await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: copy.path, HTTP_SERVER } }),
          copy.path,
          copy.tokens[5].token,
          'sent across the stop',
        )
      } finally {
        copy.remove()
      }
    })
  })
})

// How many processes of the server have said they listen.
const listening = (target: Server) => target.output().match(/listening on/g)?.length ?? 0

// Sends half a request, SIGTERM, then an impatient operator's Ctrl-C and SIGTERM again, then the rest
// of the request: it must still be served and committed, and the server exit 0 with the WAL merged.
async function stopAcrossARequest(target: Server, path: string, token: string, text: string) {
  const body = JSON.stringify({ body: text })
  const port = Number(new URL(target.url).port)
  const socket = connect(port, '127.0.0.1')
  await within(once(socket, 'connect'), 5_000, 'the connection to the server')
  socket.write(
    `POST /posts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 10)}`,
  )
  await until(() => serverHasRead(socket), 5_000, 'the server to read the first part of the request')
  const exited = target.stop('SIGTERM')
  await until(() => !listensOn(port), 5_000, 'the server to close its listener on SIGTERM')
  target.child.kill('SIGINT')
  target.child.kill('SIGTERM')
  // Signals that change nothing leave nothing to wait for: 100 ms lets them reach the server first.
  await sleep(100)
  socket.end(body.slice(10))
  const response = await within(readToEnd(socket), 15_000, 'the answer to the request sent across the stop')
  assert.match(response, /^HTTP\/1.1 201 Created\r\n/)
  assert.equal(await within(exited, 15_000, 'the server to exit after SIGTERM'), 0)
  assert.equal(existsSync(`${path}-wal`), false, 'the WAL was checkpointed into the database')
  const check = new DatabaseSync(path, { readOnly: true })
  const row = check.prepare('SELECT count(*) AS n FROM posts WHERE body = ?').get(text)
  check.close()
  assert.equal(row?.n, 1)
}
