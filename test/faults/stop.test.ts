// SIGTERM under steady load: the requests already in the server complete, new connections are
// refused, keep-alive connections close cleanly, the WAL is checkpointed, and the exit is 0 within 10 s.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { connect } from 'node:net'
import { after, describe, test } from 'node:test'
import { freshSeededCopy } from '../../harness/seed.ts'
import { startServer } from '../../harness/server.ts'
import { sleep, within } from '../../harness/time.ts'

describe('SIGTERM under load', () => {
  const db = freshSeededCopy()
  after(() => db.remove())

  test('finishes what it accepted, refuses what comes after, checkpoints and exits 0', async (t) => {
    const server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
    const port = Number(new URL(server.url).port)
    type Outcome = { sentAt: number; doneAt: number; status?: number; error?: string }
    const outcomes: Outcome[] = []
    let stopAt = Infinity
    let running = true

    // 32 keep-alive clients, reading and writing, a few milliseconds apart.
    const client = async (n: number) => {
      for (let i = 0; running; i++) {
        const token = db.tokens[(n * 31 + i) % db.tokens.length].token
        const write = i % 4 === 3
        const outcome: Outcome = { sentAt: performance.now(), doneAt: 0 }
        try {
          const res = write
            ? await fetch(`${server.url}/posts`, {
                method: 'POST',
                headers: { authorization: `Bearer ${token}` },
                body: JSON.stringify({ body: `stop ${n}.${i}` }),
              })
            : await fetch(`${server.url}/posts/${1 + ((n * 7919 + i) % 500_000)}`)
          outcome.status = res.status
          await res.arrayBuffer()
        } catch (err) {
          outcome.error = String((err as { cause?: { code?: string } }).cause?.code ?? err)
        }
        outcome.doneAt = performance.now()
        outcomes.push(outcome)
        if (outcome.error && outcome.sentAt > stopAt) return
        await sleep(5)
      }
    }
    const clients = Array.from({ length: 32 }, (_, n) => client(n))
    // The load runs 2 s before the stop: what is measured is a stop under steady load, not an order.
    await sleep(2_000)

    // Ten uploads that are inside the server when SIGTERM comes: half their body before it, half after.
    const uploads = await Promise.all(
      Array.from({ length: 10 }, async (_, n) => {
        const socket = connect(port, '127.0.0.1')
        await within(once(socket, 'connect'), 5_000, "an upload's connection")
        const body = JSON.stringify({ body: `sent across SIGTERM, ${n}` })
        socket.write(
          `POST /posts HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ${db.tokens[n].token}\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 10)}`,
        )
        let answer = ''
        socket.on('data', (chunk) => (answer += chunk))
        const closed = once(socket, 'close').then(() => answer)
        return { socket, rest: body.slice(10), closed }
      }),
    )
    // A fixed wait, not a look at /proc/net/tcp: reading that file blocks this process, whose event loop
    // also runs the 32 clients, so their requests would reach the server late and look accepted.
    await sleep(100)

    stopAt = performance.now()
    const exitCode = server.stop('SIGTERM')
    await sleep(100)
    for (const upload of uploads) upload.socket.write(upload.rest)
    const uploadAnswers = await within(
      Promise.all(uploads.map((u) => u.closed)),
      15_000,
      'the uploads answered and their connections closed',
    )
    await sleep(300) // for the listener to close, as above without /proc
    const refused = await within(
      new Promise<string>((resolve) => {
        const socket = connect(port, '127.0.0.1')
        socket.once('connect', () => (socket.destroy(), resolve('accepted')))
        socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? 'error'))
      }),
      5_000,
      'a new connection accepted or refused',
    )
    const code = await within(exitCode, 15_000, 'the server to exit after SIGTERM')
    const stopSeconds = (performance.now() - stopAt) / 1000
    running = false
    await within(Promise.all(clients), 15_000, 'the clients to end')

    // In the server at SIGTERM: sent well before it (50 ms, so the server has read them), answered after.
    const inFlight = outcomes.filter((o) => o.sentAt < stopAt - 50 && o.doneAt > stopAt)
    const before = outcomes.filter((o) => o.sentAt < stopAt - 50)
    const afterStop = outcomes.filter((o) => o.sentAt >= stopAt - 50)
    t.diagnostic(
      `${before.length} requests before SIGTERM (${inFlight.length + uploads.length} in flight at it), ${afterStop.length} around or after it; exit ${code} after ${stopSeconds.toFixed(2)} s`,
    )
    for (const answer of uploadAnswers) {
      assert.match(answer, /^HTTP\/1\.1 201 Created\r\n/, 'an upload in flight at SIGTERM was answered')
      assert.match(answer, /\r\nconnection: close\r\n/i, 'and its connection was closed after the answer')
    }
    assert.deepEqual(
      before.filter((o) => o.error || (o.status !== 200 && o.status !== 201)),
      [],
      'requests the server had accepted failed',
    )
    assert.deepEqual(
      outcomes.filter((o) => (o.status ?? 0) >= 500),
      [],
      'no 5xx, ever',
    )
    assert.equal(refused, 'ECONNREFUSED', 'new connections are refused once stopping')
    assert.equal(code, 0)
    assert.ok(stopSeconds < 10, `stopped in ${stopSeconds.toFixed(2)} s`)
    assert.equal(existsSync(`${db.path}-wal`), false, 'the WAL was checkpointed')
  })
})
