// server/reader.ts as server/wire.ts drives it, fed in small reads: what a client's bytes cost it. Its
// work is counted, not timed: `examined` is every byte any of its scans looked at. Each adversarial
// shape is sent at two sizes eight times apart; read once, a byte at a time or not, the work grows
// eightfold, and a byte looked at again on every read (as empty lines once were) makes it 64-fold.
import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { MAX_BODY_BYTES } from '../app.ts'
import { MAX_FRAMING_BYTES, MAX_HEAD_BYTES, type Head, type Refusal } from '../server/http1.ts'
import { RequestReader, type ReadRequest } from '../server/reader.ts'

const READ_BYTES = 64
// The most a reader may keep: a head, a body and the read that brought them (server/reader.ts).
const MAX_KEPT = MAX_HEAD_BYTES + MAX_BODY_BYTES + READ_BYTES

type Outcome = { request?: ReadRequest; refusal?: Refusal; examined: number; kept: number }

// Feeds the bytes READ_BYTES at a time, reading after each as wire.ts does, until a request is whole
// or refused; `kept` is the largest buffer the reader held at any point.
function feed(bytes: Buffer): Outcome {
  const reader = new RequestReader(MAX_BODY_BYTES)
  let kept = 0
  for (let at = 0; at < bytes.length; at += READ_BYTES) {
    reader.push(bytes.subarray(at, at + READ_BYTES))
    kept = Math.max(kept, reader.bytes?.length ?? 0)
    let head: Head | Refusal | undefined = reader.head
    if (head === undefined && (head = reader.readHead()) === undefined) continue
    if ('status' in head) return { refusal: head, examined: reader.examined, kept }
    const read = reader.readBody()
    kept = Math.max(kept, reader.bytes?.length ?? 0)
    if (read === undefined) continue
    if ('status' in read) return { refusal: read, examined: reader.examined, kept }
    return { request: read, examined: reader.examined, kept }
  }
  return { examined: reader.examined, kept }
}

const head = (lines: string) => `POST /posts HTTP/1.1\r\nHost: t\r\n${lines}`
const plain = (text: string) => Buffer.from(text, 'latin1')
// A chunked body: its chunks, then the last chunk, trailer fields and the blank line.
const chunked = (chunks: string, trailer = '') =>
  plain(head(`Transfer-Encoding: chunked\r\n\r\n${chunks}0\r\n${trailer}\r\n`))

// Each shape at a size n: the bytes, and what the request read from them must show.
type Shape = { bytes: (n: number) => Buffer; check: (request: ReadRequest, n: number) => void }
const SHAPES: Record<string, Shape> = {
  'empty lines before the request line': {
    bytes: (n) => plain(`${'\r\n'.repeat(n)}GET /health HTTP/1.1\r\nHost: t\r\n\r\n`),
    check: (r) => assert.equal(r.head.url, 'http://t/health'),
  },
  'many short header lines': {
    bytes: (n) => plain(`${head(`x-a: ${'b'.repeat(14)}\r\n`.repeat(n / 20))}\r\n`),
    check: (r, n) => assert.equal(r.head.fields.length, 2 * (1 + n / 20)),
  },
  'a long run of spaces and tabs in a value': {
    bytes: (n) => plain(`${head(`X: a${' \t'.repeat(n / 2)}b\r\n`)}\r\n`),
    check: (r, n) => assert.equal(r.head.fields[3].length, n + 2),
  },
  'a long target of %41': {
    bytes: (n) => plain(`GET /${'%41'.repeat(n / 3)} HTTP/1.1\r\nHost: t\r\n\r\n`),
    check: (r, n) => assert.equal(r.head.url.length, 'http://t/'.length + 3 * Math.floor(n / 3)),
  },
  'a long chunk extension': {
    bytes: (n) => chunked(`1;x=${'e'.repeat(n / 8)}\r\na\r\n`),
    check: (r) => assert.equal(r.body?.toString(), 'a'),
  },
  'many tiny chunks': {
    bytes: (n) => chunked('1\r\na\r\n'.repeat(n / 48)),
    check: (r, n) => assert.equal(r.body?.length, Math.floor(n / 48)),
  },
  'leading zeros in a chunk size': {
    bytes: (n) => chunked(`${'0'.repeat(n / 8)}1\r\na\r\n`),
    check: (r) => assert.equal(r.body?.toString(), 'a'),
  },
  'many trailer fields': {
    bytes: (n) => chunked('1\r\na\r\n', 't: v\r\n'.repeat(n / 48)),
    check: (r) => assert.equal(r.body?.toString(), 'a'),
  },
}

describe('the work a request costs the reader grows with its size, never faster', () => {
  // Within every limit: the head's 16 KB counted and 32 KB in all, 8 KB of chunked framing.
  const SMALL = 2_000
  const LARGE = 8 * SMALL
  for (const [name, shape] of Object.entries(SHAPES)) {
    test(`${name}: read in ${READ_BYTES}-byte pieces, eight times the bytes is at most ten times the work`, () => {
      const [small, large] = [SMALL, LARGE].map((n) => {
        const bytes = shape.bytes(n)
        const outcome = feed(bytes)
        assert.ok(outcome.request, `${n}: ${outcome.refusal?.reason ?? 'not read whole'}`)
        shape.check(outcome.request, n)
        return { ...outcome, sent: bytes.length }
      })
      const growth = large.examined / small.examined
      assert.ok(growth <= 10, `${small.examined} bytes examined for ${small.sent}, ${large.examined} for ${large.sent}`)
      // Each byte is looked at a few times in all (searched for the blank line and for its line's end,
      // checked, parsed), never once a read.
      assert.ok(large.examined <= 5 * large.sent, `${large.examined} bytes examined for ${large.sent}`)
    })
  }
})

describe("the URL a head gives a fetch handler: as it came where plain, resolved as WHATWG URL's otherwise", () => {
  const urlOf = (target: string, host: string) => {
    const outcome = feed(plain(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\n\r\n`))
    return outcome.request?.head.url ?? outcome.refusal?.status
  }
  const CASES: [string, string, string | number][] = [
    ['/posts/1', 'api.example', 'http://api.example/posts/1'],
    ['/a/./b/../feed', 't', 'http://t/a/feed'],
    ['/a/.', 't', 'http://t/a/'],
    ['/a/..', 't', 'http://t/'],
    ['/a/..?q', 't', 'http://t/?q'],
    ['/.x/..y/...', 't', 'http://t/.x/..y/...'],
    ['/a?b=/../c', 't', 'http://t/a?b=/../c'],
    ['/feed', 'T:8080', 'http://t:8080/feed'],
    ['/feed', 't:65535', 'http://t:65535/feed'],
    ['/feed', 't:65536', 400],
    ['/feed', '127.0.0.1:80', 'http://127.0.0.1/feed'],
    ['/feed', '10.0.0.2:3000', 'http://10.0.0.2:3000/feed'],
    ['/feed', '127.1', 'http://127.0.0.1/feed'],
    ['/feed', '10.0.0.02', 'http://10.0.0.2/feed'],
    ['/feed', 't:80', 'http://t/feed'],
    ['/feed', 't:0808', 'http://t:808/feed'],
  ]
  for (const [target, host, url] of CASES) {
    test(`${target} on Host ${host}: ${url}`, () => {
      assert.equal(urlOf(target, host), url)
      if (typeof url === 'string') assert.equal(url, new URL(target, `http://${host}`).href)
    })
  }
})

// llhttp reads 00000000000000000005 as 5; past 15 significant digits a double no longer holds a length
// exactly, and any such length is over every limit.
describe('a Content-Length is the number its digits say, leading zeros and all', () => {
  const CASES: [string, number][] = [
    ['5', 5],
    ['00000000000000000005', 5],
    ['0000000000000000000000', 0],
    ['000000000000000000016385', 16_385],
    ['999999999999999', 999_999_999_999_999],
    ['9999999999999999', Number.MAX_SAFE_INTEGER],
    ['0009999999999999999', Number.MAX_SAFE_INTEGER],
  ]
  for (const [value, length] of CASES) {
    test(`Content-Length: ${value} is ${length}`, () => {
      const reader = new RequestReader(MAX_BODY_BYTES)
      reader.push(plain(head(`Content-Length: ${value}\r\n\r\n`)))
      const read = reader.readHead()
      assert.ok(read !== undefined && !('status' in read), 'a head')
      assert.equal(read.bodyLength, length)
    })
  }
})

describe('what a reader keeps is bounded, and past a limit it refuses', () => {
  const cases: [string, Buffer, number][] = [
    ['2 MiB of empty lines', plain('\r\n'.repeat(1 << 20)), 431],
    ['a head of 40 KB', plain(`${head(`X: ${'v'.repeat(40_000)}\r\n`)}\r\n`), 431],
    [
      '28 KB of empty lines and a head of 8 KB',
      plain(`${'\r\n'.repeat(14_000)}${head(`X: ${'v'.repeat(8_000)}`)}`),
      431,
    ],
    [
      '3,000 one-byte chunks with 16,000-byte extensions',
      chunked(`1;x=${'e'.repeat(16_000)}\r\na\r\n`.repeat(3_000)),
      413,
    ],
    ['a chunk size of 10,000 zeros', chunked(`${'0'.repeat(10_000)}1\r\na\r\n`), 413],
    ['4,000 one-byte chunks', chunked('1\r\na\r\n'.repeat(4_000)), 413],
    ['a trailer of 10 KB', chunked('1\r\na\r\n', `X: ${'t'.repeat(10_000)}\r\n`), 413],
    ['a body of 16 KB and 1 byte', chunked(`4001\r\n${'b'.repeat(16_385)}\r\n`), 413],
    ['1,001 trailer field lines', chunked('1\r\na\r\n', 'a:\r\n'.repeat(1_001)), 431],
  ]
  for (const [name, bytes, status] of cases) {
    test(`${name}: ${status}, with no more kept than a head, a body and a read`, () => {
      const outcome = feed(bytes)
      assert.equal(outcome.refusal?.status, status, outcome.refusal?.reason ?? 'not refused')
      assert.ok(outcome.kept <= MAX_KEPT, `kept ${outcome.kept} bytes`)
      assert.ok(outcome.examined <= 5 * Math.min(bytes.length, MAX_KEPT), `${outcome.examined} bytes examined`)
    })
  }

  test(`a chunked body's framing may take ${MAX_FRAMING_BYTES} bytes, and its data ${MAX_BODY_BYTES}`, () => {
    // 1,638 chunks of ten bytes: "a\r\n" and the CRLF after the data are five bytes of framing each.
    const chunks = Math.floor((MAX_FRAMING_BYTES - 5) / 5)
    const outcome = feed(chunked('a\r\n0123456789\r\n'.repeat(chunks)))
    assert.equal(outcome.request?.body?.length, 10 * chunks)
    assert.equal(feed(chunked('a\r\n0123456789\r\n'.repeat(chunks + 1))).refusal?.status, 413)
  })

  // Node counts neither the whitespace before a value nor that between a request line's parts: 20 KB
  // of it is read, and so a head is judged by what it holds once its lines have ended, whatever its reads.
  test('a head with 20 KB of whitespace before a value is read the same whole and in pieces', () => {
    const bytes = plain(`GET /health HTTP/1.1\r\nHost:${' '.repeat(20_000)}t\r\n\r\n`)
    const whole = new RequestReader(MAX_BODY_BYTES)
    whole.push(bytes)
    const read = whole.readHead()
    assert.ok(read && !('status' in read), JSON.stringify(read))
    assert.equal(feed(bytes).request?.head.url, read.url)
  })

  test('a chunked body read whole keeps none of the bytes it came in', () => {
    const reader = new RequestReader(MAX_BODY_BYTES)
    reader.push(plain(head('Transfer-Encoding: chunked\r\n\r\n')))
    assert.ok(reader.readHead() && reader.readBody() === undefined)
    for (let i = 0; i < 100; i++) {
      reader.push(plain(`5;x=${'e'.repeat(20)}\r\nabcde\r\n`))
      assert.equal(reader.readBody(), undefined)
      assert.equal(reader.bytes, undefined, 'the framing and data read are dropped')
    }
    reader.push(plain('0\r\n\r\n'))
    const request = reader.readBody()
    assert.ok(request && !('status' in request))
    assert.equal(request.body?.toString(), 'abcde'.repeat(100))
    assert.ok(reader.idle)
  })
})

// Every request in the bytes, fed `size` bytes a read, as wire.ts does: each read lent in one buffer
// (server/read-buffer.ts), released, and the buffer overwritten before the next read; or each read a
// buffer of its own. What was read must be the same either way.
function readAll(bytes: Buffer, size: number, lent: boolean): string[] {
  const reader = new RequestReader(MAX_BODY_BYTES)
  const shared = Buffer.alloc(size)
  const requests: ReadRequest[] = []
  for (let at = 0; at < bytes.length; at += size) {
    const read = lent ? shared.subarray(0, bytes.copy(shared, 0, at, at + size)) : bytes.subarray(at, at + size)
    reader.push(read, lent)
    for (;;) {
      if (reader.bytes === undefined || (reader.head === undefined && reader.readHead() === undefined)) break
      const request = reader.readBody()
      if (request === undefined) break
      assert.ok(!('status' in request), JSON.stringify(request))
      requests.push(request)
    }
    reader.release()
    shared.fill('X')
    assert.ok(reader.bytes === undefined || reader.bytes.buffer !== shared.buffer, 'nothing of the lent read is kept')
  }
  assert.ok(reader.idle, 'every request was read')
  return requests.map(({ head, body }) => `${head.method} ${head.url} ${head.fields.join('|')} ${body?.toString()}`)
}

describe('a lent read (one buffer for every read): nothing read from it changes when it is reused', () => {
  const body = (n: number) => `{"body":"${'b'.repeat(n)}"}`
  const post = (text: string) => `${head(`Content-Length: ${text.length}\r\n\r\n`)}${text}`
  const get = (path: string) => `GET ${path} HTTP/1.1\r\nHost: t\r\n\r\n`
  const pipelined = plain(`${get('/feed')}${post(body(30))}${get('/posts/7')}${post(body(700))}${get('/health')}`)
  for (const size of [1, 7, 64, 1000, pipelined.length]) {
    test(`five pipelined requests, two with bodies, read ${size} bytes at a time`, () => {
      const read = readAll(pipelined, size, true)
      assert.equal(read.length, 5)
      assert.deepEqual(read, readAll(pipelined, size, false))
      assert.match(read[3], new RegExp(`${body(700)}$`))
    })
  }
  test('a chunked body across lent reads', () => {
    const bytes = chunked(`5\r\nabcde\r\n${'a'.repeat(16).length.toString(16)}\r\n${'a'.repeat(16)}\r\n`)
    assert.deepEqual(readAll(bytes, 9, true), readAll(bytes, 9, false))
    assert.match(readAll(bytes, 9, true)[0], /abcdea{16}$/)
  })
})
