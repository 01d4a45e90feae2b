// The requests of the differential fuzz test (test/differential.test.ts): valid requests of the API,
// mutated structurally (fields, framing, request line) and then byte by byte, all drawn from one seed,
// so that the same seed makes the same bytes, split the same way, on every run.
import { MAX_BODY_BYTES } from '../app.ts'
import { mulberry32 } from '../random.ts'
import { MAX_FRAMING_BYTES, MAX_HEAD_BYTES, MAX_HEADER_BYTES } from '../server/http1.ts'

export type Random = {
  next: () => number
  int: (n: number) => number
  pick: <T>(list: readonly T[]) => T
  chance: (p: number) => boolean
}

// Draws from the seed's generator (random.ts), for the fuzzed requests here and test/hostile.test.ts's.
export function randomFrom(seed: number): Random {
  const next = mulberry32(seed)
  const int = (n: number) => Math.floor(next() * n)
  return { next, int, pick: (list) => list[int(list.length)], chance: (p) => next() < p }
}

// Tokens the generated requests carry. None of them can write: the fuzzed cases run concurrently, and a
// write one server took and the other refused would make every later answer differ. `ghost` is signed
// for a user the database lacks (its writes fail on the foreign key), `user` is a real user whose posts
// here are empty and whose likes are of posts that do not exist.
export type Tokens = { ghost: string; user: string; expired: string }

// One request before it is written out, in the parts the mutations change. Strings are latin1: one
// character a byte.
type Chunk = { size: string; ext: string; data: string; end: string }
type Chunked = { chunks: Chunk[]; last: string; trailers: string[]; end: string }
type Draft = {
  method: string // what the template meant, to read a HEAD's answer without a body
  before: string // bytes before the request line (empty lines a server may skip)
  lines: string[] // the request line, then the field lines, without their ends
  ends: string[] // how each line ends: CRLF unless a mutation changed it
  blank: string // the empty line that ends the head
  body: string | Chunked
}

// A case: the bytes sent on one connection, how they are split into writes, and what is known of them.
export type Case = {
  index: number
  name: string // the template and each mutation, to read a failure by
  bytes: Buffer
  methods: string[] // each request's method as generated, in order
  requests: number // the answers a whole, well-formed case gets
  writes: number[] // where each write after the first begins
  delays: number[] // ms between writes
}

const CRLF = '\r\n'
const utf8 = (text: string) => Buffer.from(text, 'utf8').toString('latin1')
const HOSTS = ['test', 'localhost:3000', 'example.com', '127.0.0.1:8080', 'api.example.org']

function draft(
  method: string,
  target: string,
  fields: [string, string][],
  body: string | Chunked = '',
  version = 'HTTP/1.1',
): Draft {
  const lines = [`${method} ${target} ${version}`, ...fields.map(([name, value]) => `${name}: ${value}`)]
  return { method, before: '', lines, ends: lines.map(() => CRLF), blank: CRLF, body }
}

function encode(d: Draft): Buffer {
  const head = d.before + d.lines.map((line, i) => line + d.ends[i]).join('') + d.blank
  return Buffer.from(head + (typeof d.body === 'string' ? d.body : encodeChunked(d.body)), 'latin1')
}

function encodeChunked(body: Chunked): string {
  return (
    body.chunks.map((c) => `${c.size}${c.ext}${CRLF}${c.data}${c.end}`).join('') +
    body.last +
    CRLF +
    body.trailers.map((t) => t + CRLF).join('') +
    body.end
  )
}

function chunked(r: Random, data: string): Chunked {
  const pieces: string[] = []
  for (let rest = data; rest.length > 0;) {
    const take = r.chance(0.5) ? rest.length : 1 + r.int(rest.length)
    pieces.push(rest.slice(0, take))
    rest = rest.slice(take)
  }
  const ext = () => (r.chance(0.2) ? r.pick([';a=b', ';name="quoted value"', ';x', ';a=1;b=2']) : '')
  const chunks = pieces.map((piece) => ({ size: piece.length.toString(16), ext: ext(), data: piece, end: CRLF }))
  const trailers = r.chance(0.2) ? [r.pick(['X-Checksum: abc', 'X-Trailer: 1', 'Expires: 0'])] : []
  return { chunks, last: `0${ext()}`, trailers, end: CRLF }
}

// The fields every request of a template carries: a Host (from a few, all valid), and sometimes what
// clients add.
function baseFields(r: Random): [string, string][] {
  const fields: [string, string][] = [['Host', r.pick(HOSTS)]]
  if (r.chance(0.3)) fields.push(['User-Agent', r.pick(['curl/8.5.0', 'k6/0.50', 'Mozilla/5.0 (X11; Linux x86_64)'])])
  if (r.chance(0.3)) fields.push(['Accept', r.pick(['*/*', 'application/json', 'application/json, text/plain;q=0.9'])])
  return fields
}

// A body as Content-Length or chunked, with the fields that say so.
function withBody(r: Random, method: string, target: string, fields: [string, string][], body: string): Draft {
  if (r.chance(0.3)) return draft(method, target, [...fields, ['Transfer-Encoding', 'chunked']], chunked(r, body))
  return draft(method, target, [...fields, ['Content-Length', String(body.length)]], body)
}

const POST_BODIES = [
  '{"body":"hello"}',
  utf8('{"body":"héllo ✓ 😀"}'),
  '{"body":"x"}',
  '{"nobody":1}',
  'not json',
  '',
  `{"body":"${'y'.repeat(501)}"}`,
  '{"body":"a","body":"b"}',
]

// The valid requests of the API the cases start from: reads, writes that cannot write, wrong paths and
// methods.
function template(r: Random, tokens: Tokens): Draft {
  const fields = baseFields(r)
  const auth = (token: string): [string, string] => ['Authorization', `Bearer ${token}`]
  switch (r.int(12)) {
    case 0:
      return draft('GET', r.pick(['/feed', '/feed?limit=5', '/feed/']), fields)
    case 1:
      return draft('GET', r.pick(['/health', '/health?probe=1']), fields)
    case 2:
      return draft('GET', `/posts/${r.pick(['1', '7', '42', '100', '0', '101', '99999', 'abc', '1e3', '%31'])}`, fields)
    case 3:
      return draft(
        'GET',
        r.pick(['/', '/nope', '/posts', '/posts/1/like', '/posts/1/x', '/FEED', '/favicon.ico']),
        fields,
      )
    case 4:
      return draft(
        r.pick(['DELETE', 'PUT', 'PATCH', 'OPTIONS']),
        r.pick(['/posts/1', '/feed', '/health', '/posts']),
        fields,
      )
    case 5:
      return draft('HEAD', r.pick(['/feed', '/posts/3', '/health', '/nope', '/posts/abc']), fields)
    case 6:
      return withBody(
        r,
        'POST',
        '/posts',
        [...fields, auth(tokens.ghost), ['Content-Type', 'application/json']],
        r.pick(POST_BODIES),
      )
    case 7:
      return withBody(
        r,
        'POST',
        '/posts',
        [...fields, auth(tokens.user), ['Content-Type', 'application/json']],
        r.pick(['{"body":""}', '{"body":null}', '[]']),
      )
    case 8:
      return withBody(
        r,
        'POST',
        '/posts',
        [...fields, ...(r.chance(0.5) ? [auth(r.pick([tokens.expired, 'not.a.token']))] : [])],
        '{"body":"hi"}',
      )
    case 9:
      return like(r, fields, auth(tokens.ghost), String(1 + r.int(100)))
    case 10:
      return like(r, fields, auth(tokens.user), String(100_000 + r.int(900_000)))
    default:
      return withBody(r, 'POST', r.pick(['/feed', '/health', '/posts/1']), fields, '{"body":"misplaced"}')
  }
}

// A like, with each way of saying it has no body.
function like(r: Random, fields: [string, string][], auth: [string, string], id: string): Draft {
  const target = `/posts/${id}/like`
  const how = r.int(4)
  if (how === 0) return draft('POST', target, [...fields, auth])
  if (how === 1) return draft('POST', target, [...fields, auth, ['Content-Length', '0']])
  if (how === 2)
    return draft('POST', target, [...fields, auth, ['Transfer-Encoding', 'chunked']], {
      chunks: [],
      last: '0',
      trailers: [],
      end: CRLF,
    })
  return withBody(r, 'POST', target, [...fields, auth], '{}')
}

// HTTP/1.0 (with or without Host and keep-alive), Expect: 100-continue, Connection: close: what
// clients vary on any request.
function vary(r: Random, d: Draft): string[] {
  const said: string[] = []
  if (r.chance(0.15)) {
    d.lines[0] = d.lines[0].replace(/HTTP\/1\.1$/, 'HTTP/1.0')
    if (r.chance(0.5)) removeField(d, 'host')
    if (r.chance(0.5)) addField(d, 'Connection', r.pick(['keep-alive', 'Keep-Alive']))
    said.push('HTTP/1.0')
  }
  if (d.body !== '' && r.chance(0.15)) (addField(d, 'Expect', '100-continue'), said.push('expect 100-continue'))
  if (r.chance(0.08)) (addField(d, 'Connection', 'close'), said.push('connection close'))
  return said
}

const fieldIndex = (d: Draft, name: string) =>
  d.lines.findIndex((line, i) => i > 0 && line.slice(0, line.indexOf(':')).toLowerCase() === name)

function addField(d: Draft, name: string, value: string, at = d.lines.length) {
  d.lines.splice(at, 0, `${name}: ${value}`)
  d.ends.splice(at, 0, CRLF)
}

function removeField(d: Draft, name: string) {
  for (let i; (i = fieldIndex(d, name)) > 0;) (d.lines.splice(i, 1), d.ends.splice(i, 1))
}

function setField(d: Draft, name: string, value: string) {
  const i = fieldIndex(d, name.toLowerCase())
  if (i > 0) d.lines[i] = `${d.lines[i].slice(0, d.lines[i].indexOf(':'))}: ${value}`
  else addField(d, name, value)
}

const requestLine = (d: Draft) => d.lines[0].split(' ')
function setRequestLine(d: Draft, part: 0 | 1 | 2, value: string) {
  const parts = requestLine(d)
  parts[part] = value
  d.lines[0] = parts.join(' ')
}

// Inserts `text` at a random place of a random line (the request line included).
function insertSomewhere(r: Random, d: Draft, text: string, line = r.int(d.lines.length)) {
  const at = r.int(d.lines[line].length + 1)
  d.lines[line] = d.lines[line].slice(0, at) + text + d.lines[line].slice(at)
}

const fieldLine = (r: Random, d: Draft) => (d.lines.length > 1 ? 1 + r.int(d.lines.length - 1) : undefined)

// Each mutation changes a draft in place and says what it did, or returns undefined where it cannot apply.
type Mutation = (r: Random, d: Draft) => string | undefined

const BAD_LENGTHS = [
  '-1',
  '+5',
  '5 5',
  '0x10',
  '5,5',
  '5, 5',
  '',
  '1e3',
  '99999999999999999999',
  '18446744073709551616',
  '00000000000000000005',
  '٥',
  ' 0',
  '4\t',
  '3.0',
]
const ODD_CODINGS = [
  'chunked, chunked',
  'gzip, chunked',
  'chunked, gzip',
  'identity',
  'Chunked',
  'CHUNKED',
  ' chunked',
  'chunked;q=1',
  'x-chunked',
  'chunked\t',
  'chunked,',
  ',chunked',
  'gzip',
  'deflate, chunked',
  'chunked , identity',
]
const HOST_VALUES = [
  '',
  't:99999',
  't:70000',
  'T',
  'EXAMPLE.com',
  '[::1]',
  '[::1]:8080',
  'a b',
  'a@b',
  'a%41',
  'a%zz',
  'xn--e1a',
  utf8('é.example'),
  't:',
  't:0',
  't:080',
  ':80',
  't.',
  '..',
  '1.2.3.4',
  '[v1.x]',
  'a_b',
  'a,b',
  'a;b',
  't:8080:1',
]
const METHODS = [
  'get',
  'FOO',
  'GETT',
  'PRI',
  'CONNECT',
  'OPTIONS',
  'TRACE',
  'M-SEARCH',
  'PROPFIND',
  'LINK',
  'QUERY',
  'SOURCE',
  'PURGE',
  'G ET',
  'GET\t',
  '',
  'HEAD',
  'POST',
  'ACL',
  'MKCOL',
  'G-T',
  'GET-',
]
const VERSIONS = [
  'HTTP/1.2',
  'HTTP/2.0',
  'HTTP/0.9',
  'HTTP/1.',
  'HTTP/1',
  'HTTP/1.10',
  'http/1.1',
  'HTTP/11',
  'HTTP/1.1 ',
  'HTTP/ 1.1',
  'HTTP/1.0',
  'HTTP/1.1x',
  'HTTP/3.0',
  'HTTP/9.1',
  'HTTP\\1.1',
  'HTTP/01.1',
]
const TARGETS = [
  'http://test/feed',
  'http://test:80/posts/1',
  'https://x.example/health',
  'ftp://x/feed',
  'HTTP://test/feed',
  'http://[::1]/feed',
  'http://user@test/feed',
  'http://test',
  'http:/feed',
  '*',
  'test:80',
  '//feed',
  '//x.example/feed',
  '/posts/../health',
  '/posts/%2e%2e/health',
  '/./feed',
  '/feed/..',
  '/feed?x=%zz',
  '/posts/%31',
  '/posts/1%00',
  '/%',
  '/feed%',
  '/health%2',
  '/fe%65d',
  '/FEED',
  '/feed#frag',
  '/feed?a=b#c',
  '/feed"',
  '/feed<x>',
  '/feed{}',
  '/feed|x',
  '/feed^',
  '/feed`',
  '/feed\\x',
  '/feed?q=\\',
  utf8('/pöst'),
  '/p\xe9',
  '/\x7f',
  '/feed?x=1&y=[2]',
  '/posts/1?',
  `/feed?${'a'.repeat(2000)}`,
  '',
  '/ feed',
  '/feed\t',
]
const HEX_SIZES = (size: number) => [
  (size + 1).toString(16),
  Math.max(0, size - 1).toString(16),
  `00${size.toString(16)}`,
  size.toString(16).toUpperCase(),
  `0x${size.toString(16)}`,
  `${size.toString(16)} `,
  `+${size.toString(16)}`,
  '-1',
  'fffffffffffffffff',
  '',
  `${size.toString(16)}\t`,
  'g',
]
const EXTENSIONS = [
  ' ;a=b',
  '; a=b',
  ';a =b',
  ';a= b',
  ';a="unterminated',
  ';a="q\\"x"',
  ';=b',
  ';a=',
  ';',
  `;${'e'.repeat(100)}`,
  ';a=b;c',
  ';a="\x01"',
  ';a="é"',
]
const TRAILERS = [
  'X-T: v',
  'Content-Length: 5',
  'Transfer-Encoding: chunked',
  'bad trailer',
  ' folded',
  'X:\x00',
  'X : y',
  'Host: other',
]

const FIELD_MUTATIONS: Record<string, Mutation> = {
  'duplicate a field': (r, d) => {
    const i = fieldLine(r, d)
    if (i === undefined) return undefined
    ;(d.lines.splice(i, 0, d.lines[i]), d.ends.splice(i, 0, CRLF))
    return `duplicate ${d.lines[i].slice(0, 20)}`
  },
  'remove a field': (r, d) => {
    const i = fieldLine(r, d)
    if (i === undefined) return undefined
    const [gone] = d.lines.splice(i, 1)
    d.ends.splice(i, 1)
    return `remove ${gone.slice(0, 20)}`
  },
  'reorder fields': (r, d) => {
    const [i, j] = [fieldLine(r, d), fieldLine(r, d)]
    if (i === undefined || j === undefined || i === j) return undefined
    ;[d.lines[i], d.lines[j]] = [d.lines[j], d.lines[i]]
    return 'reorder fields'
  },
  'duplicate Host': (r, d) => (addField(d, 'Host', r.pick(['test', 'other.example', 'test'])), 'duplicate Host'),
  'odd Host': (r, d) => (setField(d, 'Host', r.pick(HOST_VALUES)), 'odd Host'),
  'no Host': (_r, d) => (removeField(d, 'host'), 'no Host'),
  'Content-Length and Transfer-Encoding': (r, d) => {
    addField(
      d,
      r.pick(['Content-Length', 'Transfer-Encoding']),
      fieldIndex(d, 'content-length') > 0 ? 'chunked' : String(r.int(20)),
    )
    return 'Content-Length and Transfer-Encoding'
  },
  'bad Content-Length': (r, d) => (setField(d, 'Content-Length', r.pick(BAD_LENGTHS)), 'bad Content-Length'),
  'two Content-Lengths': (r, d) => (addField(d, 'Content-Length', r.pick(['0', '5', '16'])), 'two Content-Lengths'),
  'odd Transfer-Encoding': (r, d) => (setField(d, 'Transfer-Encoding', r.pick(ODD_CODINGS)), 'odd Transfer-Encoding'),
  'second Transfer-Encoding': (r, d) => (
    addField(d, 'Transfer-Encoding', r.pick(['chunked', 'gzip', 'identity'])),
    'second Transfer-Encoding'
  ),
  'whitespace before a colon': (r, d) => {
    const i = fieldLine(r, d)
    if (i === undefined) return undefined
    d.lines[i] = d.lines[i].replace(':', `${r.pick([' ', '\t', '  '])}:`)
    return 'whitespace before a colon'
  },
  'obs-fold': (r, d) => {
    const i = fieldLine(r, d)
    if (i === undefined) return undefined
    ;(d.lines.splice(i + 1, 0, `${r.pick([' ', '\t', '  '])}${r.pick(['folded', 'chunked', 'x'])}`),
      d.ends.splice(i + 1, 0, CRLF))
    return 'obs-fold'
  },
  'case of a field name': (r, d) => {
    const i = fieldLine(r, d)
    if (i === undefined) return undefined
    const colon = d.lines[i].indexOf(':')
    const name = d.lines[i].slice(0, colon)
    d.lines[i] =
      (r.chance(0.5)
        ? name.toUpperCase()
        : [...name].map((c) => (r.chance(0.5) ? c.toUpperCase() : c.toLowerCase())).join('')) + d.lines[i].slice(colon)
    return 'case of a field name'
  },
  Expect: (r, d) => (
    setField(
      d,
      'Expect',
      r.pick(['100-continue', '100-Continue', '100-continue, foo', 'foo', '', '100-continue ', 'x-expect']),
    ),
    'Expect'
  ),
  Connection: (r, d) => (
    setField(
      d,
      'Connection',
      r.pick(['close', 'keep-alive', 'Close', 'upgrade', 'close, keep-alive', 'te', '', 'keep-alive, close', 'CLOSE']),
    ),
    'Connection'
  ),
  'empty field name or value': (r, d) => (
    addField(d, r.pick(['X-Empty', '']), r.pick(['', ' ', '\t']), 1 + r.int(d.lines.length)),
    'empty field name or value'
  ),
  'many fields': (r, d) => {
    const n = r.pick([100, 1999, 2001, 4000, 7000])
    for (let k = 0; k < n; k++) addField(d, `x${k}`, 'v', 1)
    return `${n} fields`
  },
}

const LINE_MUTATIONS: Record<string, Mutation> = {
  'bare line end': (r, d) => {
    const i = r.int(d.lines.length + 1)
    const end = r.pick(['\n', '\r', '\r\r\n', '\n\r', '\r\n\r'])
    if (i === d.lines.length) d.blank = end
    else d.ends[i] = end
    return `line ${i} ends ${JSON.stringify(end)}`
  },
  NUL: (r, d) => (insertSomewhere(r, d, '\0'), 'NUL'),
  'control character': (r, d) => (
    insertSomewhere(r, d, r.pick(['\x01', '\x0b', '\x0c', '\x1b', '\x7f'])),
    'control character'
  ),
  'tab or space': (r, d) => (insertSomewhere(r, d, r.pick([' ', '\t', '  ', ' \t'])), 'tab or space'),
  'non-ASCII byte': (r, d) => (insertSomewhere(r, d, String.fromCharCode(0x80 + r.int(128))), 'non-ASCII byte'),
  'odd separators in the request line': (r, d) => {
    const [method, target, version] = requestLine(d)
    const sep = () => r.pick([' ', '  ', '\t', ' \t'])
    d.lines[0] =
      r.pick(['', ' ', '\t']) +
      [method, target, version].join(sep()).replace(/ (?=HTTP)/, sep()) +
      r.pick(['', '', ' ', '\t'])
    return 'odd separators in the request line'
  },
  'odd method': (r, d) => {
    const method = r.pick(METHODS)
    setRequestLine(d, 0, method)
    d.method = method
    return `method ${JSON.stringify(method)}`
  },
  'odd version': (r, d) => (setRequestLine(d, 2, r.pick(VERSIONS)), 'odd version'),
  'odd target': (r, d) => (setRequestLine(d, 1, r.pick(TARGETS)), 'odd target'),
  'percent-encoding': (r, d) => {
    const target = requestLine(d)[1] ?? ''
    const at = 1 + r.int(Math.max(1, target.length - 1))
    const code = target.charCodeAt(at) || 0x2f
    const encoded = r.pick([
      `%${code.toString(16).padStart(2, '0')}`,
      `%${code.toString(16).toUpperCase().padStart(2, '0')}`,
      '%',
      '%2',
      '%g0',
      '%00',
      '%2F',
      '%25',
      '%E9',
      '%C3%A9',
    ])
    setRequestLine(d, 1, target.slice(0, at) + encoded + target.slice(at + 1))
    return 'percent-encoding'
  },
  'empty lines before': (r, d) => ((d.before = r.pick([CRLF, CRLF + CRLF, '\n', '\r', ' \r\n'])), 'empty lines before'),
}

// A head whose counted bytes (target, names and values, as Node counts toward its 16 KB) land a few
// bytes either side of the limit.
function headNearLimit(r: Random, d: Draft): string {
  const counted =
    (requestLine(d)[1] ?? '').length +
    d.lines.slice(1).reduce((sum, line) => sum + line.replace(/:\s*/, '').trimEnd().length, 0)
  const delta = r.int(7) - 3
  addField(d, 'X-Pad', 'p'.repeat(Math.max(1, MAX_HEADER_BYTES + delta - counted - 'X-Pad'.length)))
  return `head ${delta >= 0 ? '+' : ''}${delta} bytes from 16 KB`
}

// A body (declared or chunked) a byte or so either side of 16 KB, on whatever route the draft has. Its
// post is empty, so that it writes nothing even with a real user's token.
function bodyNearLimit(r: Random, d: Draft): string {
  const size = 16 * 1024 + r.int(5) - 2
  const data = '{"body":""}'.padEnd(size, ' ')
  removeField(d, 'content-length')
  removeField(d, 'transfer-encoding')
  if (r.chance(0.5)) {
    addField(d, 'Content-Length', String(size))
    d.body = data
  } else {
    addField(d, 'Transfer-Encoding', 'chunked')
    d.body = chunked(r, data)
  }
  return `body of ${size} bytes`
}

const asChunked = (d: Draft) => (typeof d.body === 'string' ? undefined : d.body)

const BODY_MUTATIONS: Record<string, Mutation> = {
  'wrong chunk size': (r, d) => {
    const body = asChunked(d)
    if (!body?.chunks.length) return undefined
    const chunk = r.pick(body.chunks)
    chunk.size = r.pick(HEX_SIZES(chunk.data.length))
    return `chunk size ${JSON.stringify(chunk.size)} for ${chunk.data.length} bytes`
  },
  'odd last chunk': (r, d) => {
    const body = asChunked(d)
    if (!body) return undefined
    body.last = r.pick(['00', '0000000000000000000', '0 ', '0;', 'x', '', '0\r', '00;ext=1'])
    return `last chunk ${JSON.stringify(body.last)}`
  },
  'odd chunk extension': (r, d) => {
    const body = asChunked(d)
    if (!body) return undefined
    const chunk = body.chunks.length > 0 && r.chance(0.7) ? r.pick(body.chunks) : undefined
    if (chunk) chunk.ext = r.pick(EXTENSIONS)
    else body.last += r.pick(EXTENSIONS)
    return 'odd chunk extension'
  },
  'chunk data end': (r, d) => {
    const chunk = asChunked(d)?.chunks[0]
    if (!chunk) return undefined
    chunk.end = r.pick(['\n', '\r', '', 'x\r\n', '\r\n\r\n'])
    return `chunk data ends ${JSON.stringify(chunk.end)}`
  },
  'odd trailer': (r, d) => {
    const body = asChunked(d)
    if (!body) return undefined
    body.trailers.push(r.pick(TRAILERS))
    return 'odd trailer'
  },
  'odd chunked end': (r, d) => {
    const body = asChunked(d)
    if (!body) return undefined
    body.end = r.pick(['', '\n', '\r', 'X', '\r\n\r\n'])
    return `chunked body ends ${JSON.stringify(body.end)}`
  },
  'head near 16 KB': headNearLimit,
  'body near 16 KB': bodyNearLimit,
}

// Absolute-form targets (RFC 9112, 3.2.2): http:// or https://, an authority (ones a Host field may be,
// and ones it may not), and a path: the template's, or one with backslashes and dot segments, plain or
// percent-encoded.
const AUTHORITIES = [
  'test',
  'X',
  'x.',
  '-x',
  'x_y',
  'x;y',
  'EXAMPLE.com',
  'xn--e1a',
  '127.0.0.1',
  '0x7f.1',
  '[::1]',
  '[::1]:8080',
  'x:80',
  'x:0',
  'x:080',
  'x:65535',
]
const ODD_AUTHORITIES = [
  '',
  'x{',
  'x}',
  'x`',
  'x\\',
  'x|y',
  'x^',
  'a%41',
  '%',
  'user@x',
  'u:p@x',
  '@x',
  '[::1',
  '::1',
  '[v1.x]',
  'x:99999',
  'x:65536',
  'x:',
  ':80',
  'x:8080:1',
  '1270.0.1',
  '1.2.3.256',
  'x..y',
  '..',
  'x?',
  'x"',
  utf8('é'),
]
const ABSOLUTE_PATHS = [
  '',
  '/',
  '?x',
  '/a/../health',
  '/a\\..\\health',
  '\\health',
  '/health\\',
  '/.%2e/health',
  '/%2e%2e/health',
  '/%2E./health',
  '/a%5C..%5Chealth',
  '/health%5C',
  '/%5Chealth',
  '/health?\\',
  '/health\\?x',
  '/health?a=..\\b',
  '//health',
  '/./health',
  '/health/.',
  '/health/..',
  '/../health',
  '/feed/../health',
  '/posts/1/..',
  '/a/b/../../feed',
  '/health%2F',
  '/health;x',
]
const SCHEMES = ['http://', 'https://', 'http://', 'https://', 'http://', 'https://', 'HTTP://', 'Https://']

// The template's path, or that path with a backslash for a slash, or a dot segment put in (plain,
// backslashed or percent-encoded), or another path.
function oddPath(r: Random, path: string): string {
  const at = r.int(path.length + 1)
  switch (r.int(4)) {
    case 0: {
      const slash = path.lastIndexOf('/', at)
      return slash < 0 ? `\\${path}` : `${path.slice(0, slash)}\\${path.slice(slash + 1)}`
    }
    case 1:
      return (
        path.slice(0, at) +
        r.pick(['/..', '/.', '/a/..', '\\..', '/a\\..', '/.%2e', '/%2e%2e', '%5C', '%5c..', '\\']) +
        path.slice(at)
      )
    case 2:
      return r.pick(['/a/..', '/a\\..', '/.%2e', '/x/%2E%2E', '/.', '/..']) + path
    default:
      return r.pick(ABSOLUTE_PATHS)
  }
}

// The draft's target made absolute-form: an odd authority and the template's path, or mostly a valid
// authority and an odd path.
function absoluteForm(r: Random, d: Draft, odd: 'authority' | 'path'): string {
  const target = requestLine(d)[1] ?? ''
  const path = target.startsWith('/') ? target : '/health'
  const authority = r.pick(r.chance(odd === 'authority' ? 0.7 : 0.2) ? ODD_AUTHORITIES : AUTHORITIES)
  const absolute = r.pick(SCHEMES) + authority + (odd === 'path' ? oddPath(r, path) : path)
  setRequestLine(d, 1, absolute)
  // RFC 9112, 3.2.2: Host is ignored then; but for what it is worth, sometimes an odd one, or none.
  if (r.chance(0.2)) setField(d, 'Host', r.pick(HOST_VALUES))
  else if (r.chance(0.1)) removeField(d, 'host')
  return `target ${JSON.stringify(absolute.slice(0, 60))}`
}

const ABSOLUTE_MUTATIONS: Record<string, Mutation> = {
  'absolute-form target, odd authority': (r, d) => absoluteForm(r, d, 'authority'),
  'absolute-form target, odd path': (r, d) => absoluteForm(r, d, 'path'),
}

// Byte classes at scale: a run of one byte or one short token, where the reader counts it toward a
// limit (16 KB of what Node counts of a head, 32 KB of a head in all, 8 KB of chunked framing, a body's
// 16 KB, llhttp's 16 KB of a chunk's extensions), as long as to bring what is counted a few tokens either
// side of the limit, or a few, or well past it.
const LLHTTP_EXTENSION_BYTES = 16 * 1024 // a chunk's extensions, as Node runs llhttp

// What Node counts of a head toward its 16 KB: the target, each field's name and value (whitespace
// after the value included).
const countedBytes = (d: Draft) =>
  (requestLine(d)[1] ?? '').length + d.lines.slice(1).reduce((sum, line) => sum + line.replace(/:[\t ]*/, '').length, 0)
// A head's bytes in all, with the empty lines before it.
const headBytes = (d: Draft) =>
  d.before.length + d.lines.reduce((sum, line, i) => sum + line.length + d.ends[i].length, 0) + d.blank.length
// A chunked body's framing: size lines and extensions, the CRLF after each chunk's data, the trailer.
const framingBytes = (body: Chunked) =>
  body.chunks.reduce((sum, c) => sum + c.size.length + c.ext.length + 2 + c.end.length, 0) +
  body.last.length +
  2 +
  body.trailers.reduce((sum, t) => sum + t.length + 2, 0) +
  body.end.length

// How many tokens of `unit` bytes: a few; enough to bring what is counted (`used` so far) a few tokens
// either side of `limit`; or well past it.
function runLength(r: Random, unit: number, used: number, limit: number): number {
  const upTo = (bytes: number) => Math.max(1, Math.round((bytes - used) / unit))
  const how = r.int(5)
  if (how === 0) return 1 + r.int(16)
  if (how === 4) return upTo(limit * r.pick([1.5, 2, 4]))
  return Math.max(1, upTo(limit) + r.int(7) - 3)
}

// The draft's body, chunked: a Content-Length body is made one (its fields changed to say so), so that
// the chunked runs apply to every template.
function chunkedBody(r: Random, d: Draft): Chunked {
  if (typeof d.body !== 'string') return d.body
  removeField(d, 'content-length')
  removeField(d, 'transfer-encoding')
  addField(d, 'Transfer-Encoding', 'chunked')
  return (d.body = chunked(r, d.body))
}

// `count` copies of a line among the field lines, from `at`: in one go, as there may be tens of thousands.
function addLines(d: Draft, at: number, line: string, count: number) {
  d.lines = [...d.lines.slice(0, at), ...Array<string>(count).fill(line), ...d.lines.slice(at)]
  d.ends = [...d.ends.slice(0, at), ...Array<string>(count).fill(CRLF), ...d.ends.slice(at)]
}

const RUN_MUTATIONS: Record<string, Mutation> = {
  'run of spaces or tabs': (r, d) => {
    const run = r.pick([' ', '\t', ' \t'])
    const i = r.chance(0.15) ? 0 : fieldLine(r, d)
    if (i === undefined) return undefined
    const counted = r.chance(0.5)
    const n = runLength(
      r,
      run.length,
      counted ? countedBytes(d) : headBytes(d),
      counted ? MAX_HEADER_BYTES : MAX_HEAD_BYTES,
    )
    const line = d.lines[i]
    const colon = Math.max(0, line.indexOf(':'))
    // In the request line between its parts, or at its end; in a field line before the value (which Node
    // does not count), within it or after it (which it does).
    const at =
      i === 0
        ? r.pick([Math.max(0, line.indexOf(' ')), Math.max(0, line.lastIndexOf(' ')), line.length])
        : r.pick([colon + 1, colon + 1 + r.int(line.length - colon), line.length])
    d.lines[i] = line.slice(0, at) + run.repeat(n) + line.slice(at)
    return `${n} × ${JSON.stringify(run)} in line ${i}`
  },
  'many empty lines before': (r, d) => {
    const n = runLength(r, 2, headBytes(d) - d.before.length, MAX_HEAD_BYTES)
    d.before = CRLF.repeat(n) + (r.chance(0.1) ? r.pick(['\n', '\r', ' \r\n']) : '')
    return `${n} empty lines before`
  },
  'many short field lines': (r, d) => {
    const line = r.pick(['a: b', 'a:', 'a:b', 'X-Y: zz', 'a: b\t', `x: ${'v'.repeat(24)}`])
    const counted = r.chance(0.5)
    const n = r.chance(0.3)
      ? Math.max(1, 1000 - (d.lines.length - 1) + r.int(5) - 2) // about Node's 1,000 field lines
      : counted
        ? runLength(r, line.replace(/:[\t ]*/, '').length, countedBytes(d), MAX_HEADER_BYTES)
        : runLength(r, line.length + 2, headBytes(d), MAX_HEAD_BYTES)
    addLines(d, 1 + r.int(d.lines.length), line, n)
    return `${n} × ${JSON.stringify(line)}`
  },
  'run in the target': (r, d) => {
    const token = r.pick(['%41', '%41', '%41', 'a', '/', '/..', '/a/..', '%2e%2e/', '\\', '?'])
    const target = requestLine(d)[1] ?? '/'
    const n = runLength(r, token.length, countedBytes(d), r.chance(0.8) ? MAX_HEADER_BYTES : MAX_HEAD_BYTES)
    const at = target.startsWith('/') ? 1 + r.int(target.length) : target.length
    setRequestLine(d, 1, target.slice(0, at) + token.repeat(n) + target.slice(at))
    return `${n} × ${JSON.stringify(token)} in the target`
  },
  'leading zeros in a chunk size': (r, d) => {
    const body = chunkedBody(r, d)
    const n = runLength(r, 1, framingBytes(body), MAX_FRAMING_BYTES)
    const chunk = body.chunks.length > 0 && r.chance(0.6) ? r.pick(body.chunks) : undefined
    if (chunk) chunk.size = '0'.repeat(n) + chunk.size
    else body.last = '0'.repeat(n) + body.last
    return `${n} leading zeros in a ${chunk ? 'chunk' : 'last chunk'}'s size`
  },
  'long chunk extension': (r, d) => {
    const body = chunkedBody(r, d)
    const [open, token, close] = r.pick([
      ['', ';x', ''],
      ['', ';a=b', ''],
      [';e', 'e', ''],
      [';a=', 'v', ''],
      [';a="', 'q', '"'],
      [';a="', ' ', '"'],
    ])
    const limit = r.pick([MAX_FRAMING_BYTES, MAX_FRAMING_BYTES, LLHTTP_EXTENSION_BYTES])
    const n = runLength(r, token.length, framingBytes(body) + open.length + close.length, limit)
    const ext = open + token.repeat(n) + close
    const chunk = body.chunks.length > 0 && r.chance(0.6) ? r.pick(body.chunks) : undefined
    if (chunk) chunk.ext = ext
    else body.last += ext
    return `${n} × ${JSON.stringify(token)} in a ${chunk ? 'chunk' : 'last chunk'}'s extension`
  },
  'many tiny chunks': (r, d) => {
    const body = chunkedBody(r, d)
    // Each chunk of one byte is 5 bytes of framing: its size line and the CRLF after its data. What the
    // data lacks is made up in spaces, which a JSON body may end with.
    const n = runLength(r, 5, framingBytes({ ...body, chunks: [] }), MAX_FRAMING_BYTES)
    const data = body.chunks
      .map((c) => c.data)
      .join('')
      .padEnd(n, ' ')
    body.chunks = Array.from(data, (byte) => ({ size: '1', ext: '', data: byte, end: CRLF }))
    return `${data.length} chunks of a byte`
  },
  'long trailers': (r, d) => {
    const body = chunkedBody(r, d)
    const limit = r.pick([MAX_FRAMING_BYTES, MAX_FRAMING_BYTES, MAX_HEADER_BYTES])
    if (r.chance(0.5)) {
      const n = runLength(r, 1, framingBytes(body) + 7, limit)
      body.trailers.push(`X-T: ${'v'.repeat(n)}`)
      return `a trailer of ${n} bytes`
    }
    const line = r.pick(['a: b', 'X-Trailer: 1', 'a:'])
    const n = runLength(r, line.length + 2, framingBytes(body), limit)
    body.trailers = body.trailers.concat(Array<string>(n).fill(line))
    return `${n} trailers ${JSON.stringify(line)}`
  },
  'chunked body near 16 KB': (r, d) => {
    const body = chunkedBody(r, d)
    const data = body.chunks.map((c) => c.data).join('')
    const size = MAX_BODY_BYTES + r.int(5) - 2
    body.chunks = chunked(r, data.padEnd(size, ' ')).chunks
    return `chunked body of ${size} bytes`
  },
}

const MUTATIONS: [string, Mutation][] = [
  ...Object.entries(FIELD_MUTATIONS),
  ...Object.entries(LINE_MUTATIONS),
  ...Object.entries(BODY_MUTATIONS),
  ...Object.entries(ABSOLUTE_MUTATIONS),
  ...Object.entries(RUN_MUTATIONS),
]
const INTERESTING_BYTES = [0x00, 0x09, 0x0a, 0x0d, 0x20, 0x22, 0x25, 0x2c, 0x2f, 0x3a, 0x3b, 0x7f, 0x80, 0xff]

// Byte-level changes to the whole case: a byte replaced, inserted or removed.
function mutateBytes(r: Random, bytes: Buffer): { bytes: Buffer; said: string } {
  const at = r.int(bytes.length)
  const byte = r.chance(0.7) ? r.pick(INTERESTING_BYTES) : r.int(256)
  const how = r.int(3)
  if (how === 0)
    return {
      bytes: Buffer.concat([bytes.subarray(0, at), Buffer.from([byte]), bytes.subarray(at)]),
      said: `insert 0x${byte.toString(16)} at ${at}`,
    }
  if (how === 1)
    return { bytes: Buffer.concat([bytes.subarray(0, at), bytes.subarray(at + 1)]), said: `delete byte ${at}` }
  const copy = Buffer.from(bytes)
  copy[at] = byte
  return { bytes: copy, said: `byte ${at} = 0x${byte.toString(16)}` }
}

// Mutations per case: none for a sixth of them (the valid requests themselves), up to three.
const MUTATION_COUNTS = [0, 1, 1, 1, 2, 2, 3]
const GARBAGE = ['XYZ\r\n\r\n', 'GET /feed HTTP/1.1\r\nHost: test\r\n\r\n', '\r\n', 'G', '\0\0\0']

// The cases of one seed: each alone, a pipelined pair, or a request that asks to close followed by more.
export function generateCases(seed: number, count: number, tokens: Tokens): Case[] {
  const r = randomFrom(seed)
  return Array.from({ length: count }, (_, index) => generateCase(r, index, tokens))
}

function generateCase(r: Random, index: number, tokens: Tokens): Case {
  const drafts = [template(r, tokens)]
  const said = [drafts[0].lines[0].slice(0, 48), ...vary(r, drafts[0])]
  const shape = r.next()
  let tail = ''
  if (shape < 0.15) {
    drafts.push(template(r, tokens))
    said.push(`then ${drafts[1].lines[0].slice(0, 32)}`)
  } else if (shape < 0.25) {
    setField(drafts[0], 'Connection', 'close')
    tail = r.pick(GARBAGE)
    said.push(`Connection: close, then ${JSON.stringify(tail.slice(0, 12))}`)
  }
  for (let n = r.pick(MUTATION_COUNTS); n > 0; n--) {
    const [, mutate] = r.pick(MUTATIONS)
    const done = mutate(r, r.pick(drafts))
    if (done) said.push(done)
  }
  let bytes: Buffer = Buffer.concat([...drafts.map(encode), Buffer.from(tail, 'latin1')])
  for (let n = r.chance(0.25) ? 1 + r.int(3) : 0; n > 0; n--) {
    const mutated = mutateBytes(r, bytes)
    bytes = mutated.bytes
    said.push(mutated.said)
  }
  if (r.chance(0.07)) {
    bytes = bytes.subarray(0, 1 + r.int(bytes.length - 1))
    said.push(`cut to ${bytes.length} bytes`)
  }
  return {
    index,
    name: `#${index} ${said.join('; ')}`,
    bytes,
    methods: drafts.map((d) => d.method),
    requests: drafts.length,
    ...splits(r, bytes.length),
  }
}

// Where the bytes are split into writes, and how long to wait between them: one to four writes.
function splits(r: Random, length: number): { writes: number[]; delays: number[] } {
  const writes = [...new Set(Array.from({ length: r.int(4) }, () => 1 + r.int(Math.max(1, length - 1))))]
    .filter((at) => at < length)
    .sort((a, b) => a - b)
  return { writes, delays: writes.map(() => 1 + r.int(4)) }
}

// A case made by hand: for the few requests that write, and for the regression cases.
export function fixedCase(index: number, name: string, text: string, methods: string[], writes: number[] = []): Case {
  return {
    index,
    name,
    bytes: Buffer.from(text, 'latin1'),
    methods,
    requests: methods.length,
    writes,
    delays: writes.map(() => 2),
  }
}

// Requests that write, each valid, sent one at a time before the fuzzing so that both servers' databases
// take the same writes in the same order: posts and likes, in each framing. `tokens[i]` is user 5 + i's.
// No read is pipelined behind a write: node:http starts it before the write commits, and answers it
// with the data of before.
export function writingCases(tokens: string[]): Case[] {
  const auth = (i: number) => `Authorization: Bearer ${tokens[i]}\r\n`
  const post = (i: number, text: string) => `{"body":"${text} (user ${5 + i})"}`
  const json = 'Content-Type: application/json\r\n'
  const sized = (body: string) => `Content-Length: ${body.length}\r\n\r\n${body}`
  const cases: [string, string, string[], number[]?][] = [
    [
      'a post with Content-Length',
      `POST /posts HTTP/1.1\r\nHost: test\r\n${auth(0)}${json}${sized(post(0, 'first'))}`,
      ['POST'],
    ],
    [
      'a post chunked, with extensions and a trailer',
      `POST /posts HTTP/1.1\r\nHost: test\r\n${auth(1)}Transfer-Encoding: chunked\r\n\r\n5;a=b\r\n{"bod\r\n${(post(1, 'chunked').length - 5).toString(16)}\r\n${post(1, 'chunked').slice(5)}\r\n0\r\nX-Sum: 1\r\n\r\n`,
      ['POST'],
      [60, 200],
    ],
    ['a post in HTTP/1.0', `POST /posts HTTP/1.0\r\n${auth(2)}${sized(post(2, 'old'))}`, ['POST']],
    [
      'a post that expects 100-continue',
      `POST /posts HTTP/1.1\r\nHost: test\r\nExpect: 100-continue\r\n${auth(3)}${sized(post(3, 'expecting'))}`,
      ['POST'],
      [300],
    ],
    [
      'two posts pipelined',
      `POST /posts HTTP/1.1\r\nHost: test\r\n${auth(4)}${sized(post(4, 'one'))}POST /posts HTTP/1.1\r\nHost: test\r\n${auth(4)}${sized(post(4, 'two'))}`,
      ['POST', 'POST'],
    ],
    ['a like', `POST /posts/5/like HTTP/1.1\r\nHost: test\r\n${auth(0)}\r\n`, ['POST']],
    [
      'the same like again',
      `POST /posts/5/like HTTP/1.1\r\nHost: test\r\n${auth(0)}Content-Length: 0\r\n\r\n`,
      ['POST'],
    ],
    [
      'a like of a new post, chunked and empty',
      `POST /posts/101/like HTTP/1.1\r\nHost: test\r\n${auth(1)}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
      ['POST'],
    ],
    [
      'two likes in HTTP/1.0, the first kept alive',
      `POST /posts/102/like HTTP/1.0\r\nConnection: keep-alive\r\n${auth(2)}\r\nPOST /posts/102/like HTTP/1.0\r\n${auth(3)}\r\n`,
      ['POST', 'POST'],
    ],
    [
      'a post that asks to close',
      `POST /posts HTTP/1.1\r\nHost: test\r\nConnection: close\r\n${auth(3)}${sized(post(3, 'closing'))}`,
      ['POST'],
    ],
    ['the feed after the writes', 'GET /feed HTTP/1.1\r\nHost: test\r\n\r\n', ['GET']],
    ['a liked new post read back', 'GET /posts/102 HTTP/1.1\r\nHost: test\r\n\r\n', ['GET']],
  ]
  return cases.map(([name, text, methods, writes], index) =>
    fixedCase(index, `write ${index}: ${name}`, text, methods, writes),
  )
}

// Resource exhaustion (test/differential.test.ts): a token repeated 10, 1,000 and 100,000 times in each
// part of a request, the bytes written 1 KiB at a time with no pause but a turn of the event loop
// between writes. The chunked ones are posts with `ghost`'s token, whose bodies both servers read, and
// which never write.
const EXHAUSTION_TOKENS = ['a', ' ', '\t', '\r\n', '%41', 'a: b\r\n', ';x', '0', '1\r\na\r\n']
const EXHAUSTION_COUNTS = [10, 1_000, 100_000]
const EXHAUSTION_WRITE_BYTES = 1024

export function exhaustionCases(ghost: string): Case[] {
  const get = (line: string, fields = '') => `${line}\r\nHost: test\r\n${fields}\r\n`
  const post = (body: string) =>
    `POST /posts HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer ${ghost}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${body}`
  const places: [string, string, (run: string, token: string, count: number) => string][] = [
    ['before the request line', 'GET', (run) => run + get('GET /health HTTP/1.1')],
    ['in the method', 'GET', (run) => get(`GE${run}T /health HTTP/1.1`)],
    ['in the target', 'GET', (run) => get(`GET /hea${run}lth HTTP/1.1`)],
    ['in the version', 'GET', (run) => get(`GET /health HTTP/1${run}.1`)],
    ['in a field name', 'GET', (run) => get('GET /health HTTP/1.1', `X-${run}: v\r\n`)],
    ['in a field value', 'GET', (run) => get('GET /health HTTP/1.1', `X: a${run}b\r\n`)],
    ['a field line each', 'GET', (_run, token, n) => get('GET /health HTTP/1.1', `X: ${token}\r\n`.repeat(n))],
    ['before a chunk size', 'POST', (run) => post(`${run}1\r\n{\r\n1\r\n}\r\n0\r\n\r\n`)],
    ['in a chunk extension', 'POST', (run) => post(`1;e${run}\r\n{\r\n1\r\n}\r\n0\r\n\r\n`)],
    ['as chunk data', 'POST', (run) => post(`${run.length.toString(16)}\r\n${run}\r\n0\r\n\r\n`)],
    ['as the chunks', 'POST', (run) => post(`${run}0\r\n\r\n`)],
    ['in a trailer', 'POST', (run) => post(`2\r\n{}\r\n0\r\nX-T: a${run}\r\n\r\n`)],
  ]
  const cases: Case[] = []
  for (const [where, method, make] of places)
    for (const token of EXHAUSTION_TOKENS)
      for (const count of EXHAUSTION_COUNTS) {
        const bytes = Buffer.from(make(token.repeat(count), token, count), 'latin1')
        const writes = Array.from(
          { length: Math.ceil(bytes.length / EXHAUSTION_WRITE_BYTES) - 1 },
          (_, i) => (i + 1) * EXHAUSTION_WRITE_BYTES,
        )
        cases.push({
          index: cases.length,
          name: `${count} × ${JSON.stringify(token)} ${where}`,
          bytes,
          methods: [method],
          requests: 1,
          writes,
          delays: writes.map(() => 0),
        })
      }
  return cases
}
