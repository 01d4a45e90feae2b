// What the built server puts on the wire, byte for byte over TCP: the limits exactly at their line,
// Host as each HTTP version asks for it, the feed's order, and the same headers on every kind of answer,
// the raw ones written before a request exists included. On each of its HTTP servers (test/servers.ts).
import assert from 'node:assert/strict'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe } from 'node:test'
import { type Answer, exchange, sendStreaming } from '../harness/client.ts'
import { DEFAULT_SECRET } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { smallDatabase } from './helpers.ts'
import { forEachServer, test } from './servers.ts'

forEachServer('what dist/app.js puts on the wire', (HTTP_SERVER) => {
  const db = smallDatabase()
  // Three posts of one instant, newer than the rest of the fixture, written out of id order.
  const TIED = [102, 101, 103]
  let server: Server
  let port: number
  let stalled: Promise<Answer>

  before(async () => {
    const fixture = new DatabaseSync(db.path)
    const insert = fixture.prepare(
      "INSERT INTO posts (id, user_id, body, created_at) VALUES (?, 1, 'tied', '2025-06-01T00:00:00.000Z')",
    )
    for (const id of TIED) insert.run(id)
    fixture.close()
    server = await startServer(process.execPath, ['dist/app.js'], {
      env: { SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET, BUSY_TIMEOUT_MS: '200', HTTP_SERVER },
    })
    port = Number(new URL(server.url).port)
    // Headers that never end are a 408 after the 10 s header timeout, checked every 2 s: start the wait
    // now, so the rest of the file runs meanwhile.
    stalled = exchange(port, 'GET /feed HTTP/1.1\r\nHost: test\r\n', { timeoutMs: 20_000 })
  })

  after(async () => {
    await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
  })

  const send = (bytes: string) => exchange(port, bytes)
  const request = (head: string, headers: string[] = [], body = '') =>
    `${head}\r\n${headers.map((h) => `${h}\r\n`).join('')}\r\n${body}`
  const auth = async (userId = 1) => `Authorization: Bearer ${await db.tokenFor(userId)}`
  const status = async (bytes: string) => (await send(bytes)).status

  describe('POST /posts', () => {
    const LIMIT = 16 * 1024
    // Valid JSON of exactly n bytes: a post padded with spaces, so a body that is read is a 201.
    const bodyOf = (n: number) => '{"body":"at the line"}'.padEnd(n, ' ')
    const declared = async (body: string) =>
      request('POST /posts HTTP/1.1', ['Host: test', await auth(), `Content-Length: ${body.length}`], body)
    const chunked = async (body: string) => {
      const chunks = [body.slice(0, 10_000), body.slice(10_000)]
        .map((c) => `${c.length.toString(16)}\r\n${c}\r\n`)
        .join('')
      return request(
        'POST /posts HTTP/1.1',
        ['Host: test', await auth(), 'Transfer-Encoding: chunked'],
        `${chunks}0\r\n\r\n`,
      )
    }

    test('reads a body of exactly 16,384 bytes, declared or chunked', async () => {
      assert.equal(await status(await declared(bodyOf(LIMIT))), 201)
      assert.equal(await status(await chunked(bodyOf(LIMIT))), 201)
    })

    test('refuses a body of 16,385 bytes, declared or chunked, with a 413 that closes the connection', async () => {
      for (const bytes of [await declared(bodyOf(LIMIT + 1)), await chunked(bodyOf(LIMIT + 1))]) {
        const answer = await send(bytes)
        assert.equal(answer.status, 413)
        assert.equal(answer.body, '{"error":"request body must be at most 16 KB"}')
        assert.equal(answer.headers.connection, 'close')
      }
    })
  })

  // A client sends all of a request before it reads, as curl and k6 do: it is still sending when the
  // refusal comes, and a close with its bytes unread would be a reset, which a client meets as a failed
  // write, the answer lost (now and then: so 30 times each).
  test('a client still sending a megabyte, of body or of head, gets its refusal and no reset', async () => {
    const tooLarge = {
      'HTTP/1.1 413 Payload Too Large': request('POST /posts HTTP/1.1', [
        'Host: test',
        await auth(),
        'Content-Length: 1000000',
      ]),
      'HTTP/1.1 431 Request Header Fields Too Large': 'GET /feed HTTP/1.1\r\nHost: test\r\nX: ',
    }
    for (const [refusal, head] of Object.entries(tooLarge)) {
      const outcomes = []
      for (let i = 0; i < 30; i++) {
        const { statusLine, error } = await sendStreaming(port, head, 1_000_000)
        outcomes.push(`${statusLine} ${error ?? ''}`.trim())
      }
      assert.deepEqual(outcomes, Array(30).fill(refusal))
    }
  })

  describe('POST /posts/:id/like', () => {
    test('takes a like with no body, whether it says Content-Length: 0 or has neither header (curl -X POST)', async () => {
      for (const [userId, headers] of [
        [44, ['Content-Length: 0']],
        [45, []],
      ] as const) {
        const answer = await send(
          request('POST /posts/77/like HTTP/1.1', ['Host: test', await auth(userId), ...headers]),
        )
        assert.equal(answer.status, 201)
        assert.equal(answer.body, '{"liked":true,"already_liked":false,"post_id":77}')
      }
    })

    test('refuses a chunked body of 16,385 bytes with a 413', async () => {
      const body = 'x'.repeat(16 * 1024 + 1)
      const answer = await send(
        request(
          'POST /posts/77/like HTTP/1.1',
          ['Host: test', await auth(46), 'Transfer-Encoding: chunked'],
          `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`,
        ),
      )
      assert.equal(answer.status, 413)
      assert.equal(answer.body, '{"error":"request body must be at most 16 KB"}')
    })
  })

  describe('GET /feed', () => {
    test('lists posts of the same instant by id, highest first', async () => {
      const { posts } = JSON.parse((await send(request('GET /feed HTTP/1.1', ['Host: test']))).body)
      const tied = posts.filter((p: { id: number }) => TIED.includes(p.id))
      assert.deepEqual(
        tied.map((p: { id: number }) => p.id),
        [103, 102, 101],
      )
      assert.equal(posts.indexOf(tied[2]) - posts.indexOf(tied[0]), 2, 'next to each other')
    })
  })

  describe('request headers', () => {
    // Node counts the request target, the header names and their values (not the method, the version,
    // the colons or the line ends) and refuses from 16,384 bytes on (--max-http-header-size). Here:
    // "/feed" (5) + "Host" "test" (8) + "X" (1) + the value.
    const withHeaderBytes = (counted: number) =>
      request('GET /feed HTTP/1.1', ['Host: test', `X: ${'v'.repeat(counted - 14)}`])

    test('up to 16,383 bytes of target, names and values are read; from 16,384 on the answer is a raw 431', async () => {
      assert.equal(await status(withHeaderBytes(16_383)), 200)
      const over = await send(withHeaderBytes(16_384))
      assert.equal(over.status, 431)
      assert.equal(over.body, '{"error":"request headers too large"}')
    })

    test('HTTP/1.0 needs no Host: a request without one is answered', async () => {
      const answer = await send('GET /posts/1 HTTP/1.0\r\n\r\n')
      assert.equal(answer.status, 200)
      assert.equal(JSON.parse(answer.body).post.id, 1)
    })

    test('HTTP/1.1 needs Host: a request without one is a 400 in the JSON shape', async () => {
      const answer = await send('GET /posts/1 HTTP/1.1\r\n\r\n')
      assert.equal(answer.status, 400)
      assert.equal(answer.body, '{"error":"malformed request"}')
    })
  })

  describe('every kind of answer', () => {
    // JSON, never sniffed as anything else, never cached, and a Content-Length that is the body's length
    // in bytes (the new post's emoji take four each).
    function expectHeaders(answer: Answer, status: number, more: Record<string, string> = {}) {
      assert.equal(answer.status, status, answer.raw.slice(0, 300))
      const expected = {
        'content-type': 'application/json',
        'x-content-type-options': 'nosniff',
        'cache-control': 'no-store',
        'content-length': String(answer.bodyBytes),
        ...more,
      }
      for (const [name, value] of Object.entries(expected))
        assert.equal(answer.headers[name], value, `${name} of the ${status}`)
      assert.doesNotThrow(() => JSON.parse(answer.body), `the ${status} body is JSON`)
    }
    const get = (path: string) => send(request(`GET ${path} HTTP/1.1`, ['Host: test']))
    const postTo = async (path: string, headers: string[], body = '') =>
      send(
        request(
          `POST ${path} HTTP/1.1`,
          ['Host: test', ...headers, `Content-Length: ${Buffer.byteLength(body)}`],
          body,
        ),
      )

    test('200', async () => expectHeaders(await get('/posts/1'), 200))
    test('201', async () => expectHeaders(await postTo('/posts', [await auth()], '{"body":"héllo 🐈🐈"}'), 201))
    test('400', async () => expectHeaders(await get('/posts/abc'), 400))
    test('401', async () => expectHeaders(await postTo('/posts', [], '{"body":"x"}'), 401))
    test('404', async () => expectHeaders(await get('/nope'), 404))
    test('405, with Allow', async () =>
      expectHeaders(await send(request('DELETE /feed HTTP/1.1', ['Host: test'])), 405, { allow: 'GET' }))
    test('413, with Connection: close', async () => {
      // Refused by its declared length, before a byte of the body is read: none is sent.
      const answer = await send(request('POST /posts HTTP/1.1', ['Host: test', await auth(), 'Content-Length: 20000']))
      expectHeaders(answer, 413, { connection: 'close' })
    })
    test('503', async () => {
      const holder = new DatabaseSync(db.path, { timeout: 0 })
      holder.exec('BEGIN IMMEDIATE')
      try {
        expectHeaders(await postTo('/posts/1/like', [await auth(2)]), 503)
      } finally {
        holder.exec('ROLLBACK')
        holder.close()
      }
    })

    // Written whole to the socket by the clientError handler: HTTP that cannot be parsed, headers too
    // large, headers too slow. Each closes the connection.
    test('the raw 400', async () => expectHeaders(await send('GARBAGE\r\n\r\n'), 400, { connection: 'close' }))
    test('the raw 431', async () =>
      expectHeaders(await send(request('GET /feed HTTP/1.1', ['Host: test', `X: ${'v'.repeat(20_000)}`])), 431, {
        connection: 'close',
      }))
    test('the raw 408', async () => expectHeaders(await stalled, 408, { connection: 'close' }))
  })
})
