// More connections than a fixed number of processes may hold open files (WORKERS=1; unset, the server
// starts more: test/processes.test.ts): the ones past the limit are closed at once (no hang, no crash),
// the connections already held keep working, and once they go, all is normal.
import assert from 'node:assert/strict'
import { connect } from 'node:net'
import { after, describe, test } from 'node:test'
import { type Server, startServer } from '../../harness/server.ts'
import { sleep, until, within } from '../../harness/time.ts'
import { smallDatabase } from '../helpers.ts'
import { heldOn } from '../sockets.ts'

const LIMIT = 256

describe('more connections than the open-file limit of WORKERS=1', () => {
  const db = smallDatabase()
  let server: Server | undefined
  after(() => {
    server?.child.kill('SIGKILL') // if a failure left it running
    db.remove()
  })

  test('sheds the connections past it, keeps serving the rest, and recovers when they close', async (t) => {
    server = await startServer('bash', ['-c', `ulimit -n ${LIMIT} && exec "${process.execPath}" dist/app.js`], {
      env: { SQLITE_PATH: db.path, WORKERS: '1' },
    })
    const port = Number(new URL(server.url).port)

    // Twice the limit, each sending a whole request and waiting for its answer.
    const outcomes = await Promise.all(
      Array.from({ length: 2 * LIMIT }, async () => {
        const socket = connect(port, '127.0.0.1')
        let answer = ''
        socket.setEncoding('latin1').on('data', (chunk) => (answer += chunk))
        // A shed connection may close with a reset: that is an outcome here, not an error.
        socket.on('error', () => {})
        socket.write('GET /posts/1 HTTP/1.1\r\nHost: test\r\n\r\n')
        const outcome = await new Promise<string>((resolve) => {
          socket.on('data', () => answer.includes('"post"') && resolve('answered'))
          socket.on('close', () => resolve('closed'))
          setTimeout(resolve, 5_000, 'no answer').unref()
        })
        return { socket, outcome }
      }),
    )
    const count = (outcome: string) => outcomes.filter((o) => o.outcome === outcome).length
    t.diagnostic(
      `${2 * LIMIT} connections with ${LIMIT} files: ${count('answered')} answered, ${count('closed')} closed, ${count('no answer')} no answer`,
    )

    // Those it holds leave it no file to open: through two of the memory guard's looks (every 250 ms),
    // which once opened /proc/meminfo at each look, and the EMFILE ended the process.
    await sleep(600)
    assert.equal(server.child.exitCode, null, `the server is still running:\n${server.output()}`)
    assert.equal(count('no answer'), 0, 'every connection is answered or closed, none left hanging')
    assert.ok(count('answered') > LIMIT / 2, 'most of what fits is served')
    assert.ok(count('closed') > 0, 'the ones past the limit are closed')

    // The connections it holds still work.
    const held = outcomes.find((o) => o.outcome === 'answered')!.socket
    let again = ''
    held.on('data', (chunk) => (again += chunk))
    held.write('GET /health HTTP/1.1\r\nHost: test\r\n\r\n')
    await until(() => again.includes('"status"') || held.destroyed, 5_000, 'the answer on a connection it holds')
    assert.match(again, /^HTTP\/1.1 200/)

    for (const { socket } of outcomes) socket.destroy()
    await until(() => heldOn(port) === 0, 5_000, 'the server to close the connections the client closed')
    const health = await fetch(`${server.url}/health`)
    assert.equal(health.status, 200)
    assert.equal((await fetch(`${server.url}/feed`)).status, 200)
    assert.ok(server.output().length < 10_000, `the log stays short:\n${server.output().slice(0, 2_000)}`)
    assert.equal(await within(server.stop(), 15_000, 'the server to exit on SIGTERM'), 0)
  })
})
