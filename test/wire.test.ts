// The HTTP servers with fetch handlers of the test's own, in this process: what the API itself never
// asks of them (streamed bodies, other statuses, other header values, the request's signal) and how they
// read and close connections, over raw TCP. The answers and requests run on both (test/servers.ts):
// ours, server/wire.ts (HTTP_SERVER=net), and server/node-server.ts on node:http; what only ours has (its
// 'data' events mode, the one read buffer) is tested of ours alone. The API over them: test/http.test.ts
// and the contract tests.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { connect, createServer, type AddressInfo, type Socket } from 'node:net'
import { after, before, describe } from 'node:test'
import { Hono } from 'hono'
import { exchange } from '../harness/client.ts'
import { sleep, until, within } from '../harness/time.ts'
import { readIntoOneBuffer } from '../server/read-buffer.ts'
import type { ApiServer } from '../server/api-server.ts'
import { createNodeServer } from '../server/node-server.ts'
import { createWireServer } from '../server/wire.ts'
import { forEachServer, type HttpServer, test } from './servers.ts'

let slowStarted = 0 // requests that reached /slow's handler
let aborted = 0
const app = new Hono()
app.get(
  '/stream',
  () =>
    new Response(
      new ReadableStream({
        start: (c) => (
          c.enqueue(new TextEncoder().encode('one,')),
          c.enqueue(new TextEncoder().encode('two')),
          c.close()
        ),
      }),
    ),
)
app.get('/empty/:status', (c) => new Response(null, { status: Number(c.req.param('status')) }))
app.get('/latin1', () => new Response('x', { headers: { 'x-name': 'Zo\xeb' } }))
app.get('/injected', () => new Response('x', { headers: { 'x-bad': 'a\r\nset-cookie: b' } }))
app.get('/bytes', () => new Response(new Uint8Array([104, 105])))
// Frozen records of fields are checked once and then reused (server/responses.ts): what each says must
// hold on every answer, the first and the next.
const FROZEN = Object.freeze({ 'x-one': '1', 'x-name': 'Zo\xeb', connection: 'close' })
const FROZEN_BAD = Object.freeze({ 'x-bad': 'a\r\nset-cookie: b' })
app.get('/frozen', () => new Response('x', { headers: FROZEN }))
app.get('/frozen-bad', () => new Response('x', { headers: FROZEN_BAD }))
app.post('/echo', async (c) => c.text(await c.req.text()))
// Reads its body only after other connections' reads have come in the one read buffer.
app.post('/late-echo', async (c) => (await sleep(200), c.text(await c.req.text())))
app.post('/form', async (c) => c.json(Object.fromEntries(await c.req.formData())))
app.get(
  '/slow',
  (c) =>
    new Promise<Response>((resolve) => {
      slowStarted++
      c.req.raw.signal.addEventListener('abort', () => aborted++)
      setTimeout(() => resolve(c.text('late')), 300)
    }),
)

// The port of the server the running describe listens on (describes run one after another).
let port = 0

// A server of this process, listening on a port of its own from the describe's before() to its after().
function listening(create: () => ApiServer) {
  let api: ApiServer
  before(async () => {
    api = create()
    await once(api.server.listen(0, '127.0.0.1'), 'listening')
    port = (api.server.address() as AddressInfo).port
  })
  after(() => api.server.close())
}

const get = (path: string, version = '1.1') =>
  exchange(port, `GET ${path} HTTP/${version}\r\nHost: t\r\n${version === '1.0' ? '' : 'Connection: close\r\n'}\r\n`)

// Everything a connection sends back until it closes (or timeoutMs), for bytes written in pieces.
function conversation(
  pieces: string[],
  { gapMs = 5, timeoutMs = 3_000 } = {},
): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket: Socket = connect(port, '127.0.0.1')
    let text = ''
    const done = (closed: boolean) => {
      clearTimeout(timer)
      socket.destroy()
      resolve({ text, closed })
    }
    const timer = setTimeout(() => done(false), timeoutMs)
    socket
      .setEncoding('latin1')
      .on('data', (chunk) => (text += chunk))
      .on('close', () => done(true))
      .on('error', () => {})
    // gapMs apart, so that each piece comes to the server as a read of its own: the gap is the test.
    socket.once('connect', async () => {
      for (const piece of pieces) {
        socket.write(piece, 'latin1')
        await sleep(gapMs)
      }
    })
  })
}

// Asserts that a conversation ended in a close, its answers of these statuses in order, its text of this shape.
function assertClosedAfter(heard: { text: string; closed: boolean }, statuses: string[], text: RegExp) {
  assert.deepEqual(
    [...heard.text.matchAll(/HTTP\/1.1 (\d+) /g)].map((m) => m[1]),
    statuses,
  )
  assert.match(heard.text, text)
  assert.ok(heard.closed, 'the connection closed')
}

function answers() {
  test('a streamed body goes chunked to HTTP/1.1 and ends with the close for HTTP/1.0', async () => {
    const chunked = await get('/stream')
    assert.equal(chunked.headers['transfer-encoding'], 'chunked')
    assert.equal(chunked.body, '4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n')
    const old = await get('/stream', '1.0')
    assert.equal(old.headers.connection, 'close')
    assert.equal(old.headers['content-length'], undefined)
    assert.equal(old.body, 'one,two')
  })

  test('204 and 304 have no body and no Content-Length; 200 with none says Content-Length: 0', async () => {
    for (const status of [204, 304]) {
      const answer = await get(`/empty/${status}`)
      assert.equal(answer.status, status)
      assert.equal(answer.headers['content-length'], undefined)
      assert.equal(answer.bodyBytes, 0)
    }
    assert.equal((await get('/empty/200')).headers['content-length'], '0')
  })

  test("HEAD has the GET's fields and no body", async () => {
    const answer = await exchange(port, 'HEAD /bytes HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n')
    assert.equal(answer.status, 200)
    assert.equal(answer.bodyBytes, 0)
  })

  test('bytes are sent as given, with their length; a value past ASCII goes as latin1', async () => {
    const bytes = await get('/bytes')
    assert.equal(bytes.body, 'hi')
    assert.equal(bytes.headers['content-length'], '2')
    const text = await conversation(['GET /latin1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n'])
    assert.match(text.text, /\r\nx-name: Zo\xeb\r\n/)
  })

  test('a field value that would break the head is a 500, never written', async () => {
    const answer = await get('/injected')
    assert.equal(answer.status, 500)
    assert.doesNotMatch(answer.raw, /set-cookie/)
  })

  test('a frozen record of fields says the same on every answer, and a bad one is refused every time', async () => {
    for (let i = 0; i < 3; i++) {
      const answer = await conversation(['GET /frozen HTTP/1.1\r\nHost: t\r\n\r\n'])
      assert.match(answer.text, /\r\nx-one: 1\r\nx-name: Zo\xeb\r\n/)
      assert.match(answer.text, /\r\nConnection: close\r\n/, 'its connection: close closes, every time')
      const bad = await get('/frozen-bad')
      assert.equal(bad.status, 500)
      assert.doesNotMatch(bad.raw, /set-cookie/)
    }
  })

  test('every answer has Date', async () => {
    assert.match((await get('/bytes')).headers.date, /^\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT$/)
  })
}

// The same requests on each server, and read by ours in the one read buffer and as 'data' events.
function requests(server: HttpServer) {
  test("a body read late, after other connections' reads have come in, is the one sent", async () => {
    const late = conversation([
      'POST /late-echo HTTP/1.1\r\nHost: t\r\nContent-Length: 14\r\nConnection: close\r\n\r\nfirst-body-abc',
    ])
    await sleep(50)
    const others = await Promise.all(
      Array.from({ length: 5 }, () =>
        exchange(
          port,
          'POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 14\r\nConnection: close\r\n\r\nZZZZZZZZZZZZZZ',
        ),
      ),
    )
    for (const other of others) assert.equal(other.body, 'ZZZZZZZZZZZZZZ')
    assert.match((await late).text, /\r\n\r\nfirst-body-abc$/)
  })

  test('a request written a byte at a time is read', async () => {
    const request = 'POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello'
    const { text } = await conversation([...request], { gapMs: 1 })
    assert.match(text, /^HTTP\/1.1 200 [^]*\r\n\r\nhello$/)
  })

  test('a chunked body reaches the handler decoded, with its length', async () => {
    const { text } = await conversation([
      'POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n',
      '3;x=y\r\nabc\r\n',
      '2\r\nde\r\n0\r\nTrailer-A: 1\r\n\r\n',
    ])
    assert.match(text, /\r\n\r\nabcde$/)
  })

  test('a form body is read through a real Request, built when asked for', async () => {
    const body = 'a=1&b=two'
    const answer = await exchange(
      port,
      `POST /form HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
    )
    assert.deepEqual(JSON.parse(answer.body), { a: '1', b: 'two' })
  })

  test('Expect: 100-continue is answered 100 first, then the answer', async () => {
    const { text } = await conversation(
      [
        'POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n',
        'ok',
      ],
      { gapMs: 50 },
    )
    assert.match(text, /^HTTP\/1.1 100 Continue\r\n\r\nHTTP\/1.1 200 [^]*\r\n\r\nok$/)
  })

  test('pipelined requests are answered in order; Connection: close is answered, then the connection closes whatever follows', async () => {
    assertClosedAfter(
      await conversation([
        'GET /bytes HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcGET /bytes HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\nGARBAGE\r\n\r\n',
      ]),
      ['200', '200', '200'],
      /\r\n\r\nhi[^]*\r\n\r\nabc[^]*\r\n\r\nhi$/,
    )
  })

  // node:http wrote its 400 ahead of the answers still on their way, and lost them: a post committed, and
  // its client told 400 (server/node-server.ts, afterAnswers).
  test('requests read whole before bytes that are not HTTP are answered, in order, then a 400 closes', async () => {
    assertClosedAfter(
      await conversation([
        'GET /bytes HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcGARBAGE\r\n\r\n',
      ]),
      ['200', '200', '400'],
      /\r\n\r\nhi[^]*\r\n\r\nabc[^]*\r\n\r\n\{"error":"malformed request"\}$/,
    )
  })

  // A request refused once its handler has begun is refused in its turn: written at once, node-server's
  // refusal went ahead of the slow answer before it, which was lost (server/node-server.ts, refuseInTurn).
  test('a chunked body found malformed once its handler has begun, behind a slow answer: that answer, then a 400 closes', async () => {
    assertClosedAfter(
      await conversation([
        'GET /slow HTTP/1.1\r\nHost: t\r\n\r\nPOST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n',
        'zz\r\nx\r\n0\r\n\r\n',
      ]),
      ['200', '400'],
      /\r\n\r\nlate[^]*\r\n\r\n\{"error":"malformed request"\}$/,
    )
  })

  test("a client that resets its connection before its answer aborts the request's signal", async () => {
    const socket = connect(port, '127.0.0.1')
    await within(once(socket, 'connect'), 2_000, 'the connection')
    const startedBefore = slowStarted
    socket.write('GET /slow HTTP/1.1\r\nHost: t\r\n\r\n')
    await until(() => slowStarted === startedBefore + 1, 2_000, 'the request to reach its handler')
    const abortedBefore = aborted
    socket.resetAndDestroy()
    await until(() => aborted === abortedBefore + 1, 2_000, 'the signal to abort')
  })

  test('a client that sends its FIN while its request is answered still gets the answer, then the close', async () => {
    const abortedBefore = aborted
    const answer = await exchange(port, 'GET /slow HTTP/1.1\r\nHost: t\r\n\r\n', { halfClose: true })
    assert.equal(answer.status, 200)
    assert.equal(answer.body, 'late')
    assert.equal(answer.headers.connection, 'close')
    assert.equal(aborted, abortedBefore, 'a FIN is no reset: the signal stays')
  })

  // As llhttp does: such a head can never become a request, so it is refused as the byte comes, not
  // after the timeout for a head.
  for (const [fault, bytes] of [
    ['a bare CR', 'GET /echo HTTP/1.1\r\nHost: t\r\n\r '],
    ['a bare LF', 'GET /echo HTTP/1.1\nHo'],
    ['a NUL', 'GET /echo HTTP/1.1\r\nX: \0'],
  ]) {
    test(`a head not yet whole with ${fault} is refused at once: 400, closed`, async () => {
      const { text, closed } = await conversation([bytes], { timeoutMs: 1_000 })
      assert.match(text, /^HTTP\/1\.1 400 /)
      assert.ok(closed)
    })
  }

  // A request that follows the body: answered only if the server read every byte of the body before it.
  const following = 'GET /bytes HTTP/1.1\r\nHost: t\r\n\r\n'
  test('a body over 16 KB that no handler reads is refused by its length: 413, closed', async () => {
    const head = 'GET /bytes HTTP/1.1\r\nHost: t\r\nContent-Length: 16385\r\n\r\n'
    assertClosedAfter(await conversation([`${head}${'x'.repeat(16_385)}${following}`]), ['413'], /16 KB"\}$/)
  })

  test('a refusal of a HEAD has its fields and no body', async () => {
    const head = 'HEAD /bytes HTTP/1.1\r\nHost: t\r\nContent-Length: 16385\r\n\r\n'
    assertClosedAfter(await conversation([head]), ['413'], /\r\ncontent-length: 46\r\n[^]*\r\n\r\n$/i)
  })

  // node:http dumps a body its handler leaves unread, and counted none of it: 4 MB of one-byte chunks to
  // a 404 cost the core a second (server/node-server.ts, dropCounted). It answers as the head comes (a
  // 200 here), ours once the body has (413); either way the request after is never read. The one-byte
  // chunks are more than 16 KB too: node-server counts chunks in one read, and the kernel may split them.
  const overLimit = {
    'body over 16 KB': `4000\r\n${'x'.repeat(16_384)}\r\n1\r\nx\r\n0\r\n\r\n`,
    'framing over 8 KB': `${'1\r\nx\r\n'.repeat(20_000)}0\r\n\r\n`,
  }
  for (const [what, body] of Object.entries(overLimit)) {
    test(`a chunked body that no handler reads counts all the same: past its ${what}, the connection closes`, async () => {
      const head = 'GET /bytes HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n'
      const heard = await conversation([head, `${body}${following}`])
      assertClosedAfter(heard, [server === 'net' ? '413' : '200'], server === 'net' ? /16 KB"\}$/ : /\r\n\r\nhi$/)
    })
  }

  test('a client that sends its FIN in the middle of a request gets a 400', async () => {
    const answer = await exchange(port, 'POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc', {
      halfClose: true,
    })
    assert.equal(answer.status, 400)
  })
}

forEachServer(
  "a handler of the test's own",
  (server) => {
    listening(() =>
      server === 'net'
        ? createWireServer(app.fetch, 16 * 1024)
        : createNodeServer(app.fetch as Parameters<typeof createNodeServer>[0], 16 * 1024),
    )
    describe('answers', answers)
    describe('requests', () => requests(server))
  },
  {
    differences: [
      {
        server: 'node-server',
        test: 'a streamed body goes chunked to HTTP/1.1 and ends with the close for HTTP/1.0',
        reason:
          "@hono/node-server writes what the stream has ready as one chunk ('7\\r\\none,two'); ours writes each chunk as it comes. The HTTP/1.0 close-delimited body is the same on both",
      },
      {
        server: 'node-server',
        test: '204 and 304 have no body and no Content-Length; 200 with none says Content-Length: 0',
        reason:
          '@hono/node-server sends a 200 with a null body as an empty chunked body (Transfer-Encoding: chunked, then 0), valid HTTP/1.1',
      },
      {
        server: 'node-server',
        test: 'bytes are sent as given, with their length; a value past ASCII goes as latin1',
        reason:
          "known: node:http writes a field value past ASCII as UTF-8 ('Zo\\xeb' goes as Zo\\xc3\\xab), not the byte the Response holds; no value the API sends is past ASCII",
      },
      {
        server: 'node-server',
        test: 'a frozen record of fields says the same on every answer, and a bad one is refused every time',
        reason: 'known: the one above: a value past ASCII goes as UTF-8',
      },
    ],
  },
)

describe("ours (server/wire.ts) alone: requests read as 'data' events (a Node without the one read buffer)", () => {
  listening(() => createWireServer(app.fetch, 16 * 1024, { oneReadBuffer: false }))
  requests('net')
})

describe('ours (server/wire.ts) alone: the one read buffer', () => {
  test("this Node's accepted sockets read into the one buffer", async () => {
    const reads: string[] = []
    const server = createServer((socket) => {
      assert.equal(
        readIntoOneBuffer(socket, (length, read) => void reads.push(read.toString('latin1', 0, length))),
        true,
      )
      socket.on('end', () => socket.end())
    })
    await once(server.listen(0, '127.0.0.1'), 'listening')
    const client = connect((server.address() as AddressInfo).port, '127.0.0.1')
    await once(client, 'connect')
    client.end('hello')
    await within(once(client, 'close'), 3_000, 'the server to close')
    server.close()
    assert.deepEqual(reads, ['hello'])
  })
})
