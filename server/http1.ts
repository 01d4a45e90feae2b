// Reads HTTP/1.x requests out of the bytes a connection sends: the request line and the header section
// by RFC 9112, never more loosely than llhttp (node:http's parser), then the body by its framing. No I/O
// here: server/wire.ts hands it what a connection has sent so far. Each refusal says why in `reason`;
// where it refuses what llhttp takes, docs/http.md gives the reason.
import { METHODS } from 'node:http'

// Node's --max-http-header-size, counted as Node counts it: the target, the field names and the values.
export const MAX_HEADER_BYTES = 16 * 1024
// What a head may take in all, separators included, before it is refused unread.
const MAX_HEAD_BYTES = 2 * MAX_HEADER_BYTES
// Node refuses more field lines than this, however short.
const MAX_FIELDS = 1000

export type Head = {
  method: string
  url: string // the absolute URL a fetch handler reads
  minor: 0 | 1 // HTTP/1.0 or HTTP/1.1
  fields: string[] // name (lower case), value, name, value... as they came, each value trimmed
  bodyLength: number // CHUNKED, or the bytes of a Content-Length body (0: none)
  keepAlive: boolean
  expectContinue: boolean
  end: number // where the head ends in the bytes read: after the blank line
}
// The status to answer with, and why: 400, 413 (a chunked body too large), 417, 431 or 501.
export type Refusal = { status: number; reason: string }
// A head that has not all come yet: how far it has been read, so that no byte is looked at twice.
export type Progress = { line: number; scanned: number; counted: number; lines: number }
export const CHUNKED = -1

const refuse = (status: number, reason: string): Refusal => ({ status, reason })
const TOO_LARGE = refuse(431, 'a head over 16 KB')

// llhttp knows these methods and refuses any other; so does this.
const KNOWN_METHODS = new Set(METHODS)
const REQUEST_LINE = /^([A-Z-]+) ([^\0- \x7f-\xff]+) HTTP\/(\d)\.(\d)\r\n/
// A field line: a token, a colon right after it (RFC 9112, 5.1), optional whitespace, and a value of
// visible characters, spaces and tabs (or obs-text), trimmed at both ends. No CR, LF, NUL or other
// control character anywhere, and no line folded onto the next (obs-fold). The value starts with a
// visible character, so that a line that fails is found to fail in linear time.
const FIELD_LINE = /([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[\t ]*((?:[^\0-\x20\x7f][^\0-\x08\x0a-\x1f\x7f]*)?)\r\n/y

// The request target: origin-form or absolute-form, of what RFC 3986 allows in a path and a query,
// and the characters WHATWG-conformant clients leave unescaped there ([ ] { } | ^ \ `). Never a space,
// a control character, a byte past ASCII, '#', '"', '<', '>', or '%' without two hex digits.
const TARGET = /^(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?[\]{}|^\\`]|%[0-9A-Fa-f]{2})+$/
// What needs no URL parsing to be a URL as it is: a lower-case host and a plain path (as
// @hono/node-server's own fast path), with no dot segment to resolve.
// (A host whose last label is a number is an IPv4 address to WHATWG URL, and may not be one: parsed.)
const PLAIN_HOST = /^(?:[a-z0-9-]+\.)*[a-z][a-z0-9-]*(?::\d{1,5})?$/
const PLAIN_PATH = /^\/[!#$&-;=?-[\]_a-z~]*$/
const DOT_SEGMENT = /\/\.\.?(?:[/?#]|$)/
// A Host value: a registered name or an IPv4 address (RFC 3986's reg-name, without percent-encoding,
// which @hono/node-server refuses too) or an IP literal, and a port of 0 to 65535.
const HOST =
  /^(?:[A-Za-z0-9\-._~!$&'()*+,;=]+|\[[0-9A-Fa-f:.]+\])(?::(?:6553[0-5]|655[0-2]\d|65[0-4]\d\d|6[0-4]\d{3}|[1-5]\d{4}|\d{1,4}))?$/
const FRAMING_FIELDS = new Set(['content-length', 'transfer-encoding'])

// The head of the request at `start` of `bytes` (after any empty lines, which RFC 9112, 2.2 lets a
// server skip): a Head, a Refusal, or undefined while some of it is still to come. `progress` keeps
// what the calls for one request have read, so that a head that comes in pieces is read once: its
// caller sets it to { line: start, scanned: start, counted: 0, lines: 0 } for each new request.
export function readHead(bytes: Buffer, start: number, progress: Progress): Head | Refusal | undefined {
  while (bytes[start] === 13 && bytes[start + 1] === 10) start += 2
  if (progress.line < start) Object.assign(progress, { line: start, scanned: start, counted: 0, lines: 0 })
  const blank = bytes.indexOf('\r\n\r\n', Math.max(start, progress.scanned - 3), 'latin1')
  if (blank < 0) return incomplete(bytes, start, progress)
  if (blank + 4 - start > MAX_HEAD_BYTES) return TOO_LARGE
  const text = bytes.toString('latin1', start, blank + 2)
  const line = REQUEST_LINE.exec(text)
  if (!line) return refuse(400, requestLineFault(text))
  const [, method, target, major, minor] = line
  if (!KNOWN_METHODS.has(method)) return refuse(400, 'an unknown method')
  if (major !== '1' || (minor !== '0' && minor !== '1')) return refuse(400, 'not HTTP/1.0 or HTTP/1.1')
  if (!TARGET.test(target)) return refuse(400, 'a request target of characters RFC 3986 does not allow')
  const fields: string[] = []
  const counted = readFields(text, line[0].length, fields)
  if (typeof counted !== 'number') return counted
  if (target.length + counted >= MAX_HEADER_BYTES) return TOO_LARGE
  if (fields.length > 2 * MAX_FIELDS) return refuse(431, 'more than 1,000 field lines')
  // CONNECT asks for a tunnel: what follows its head is not HTTP, and no route here opens one.
  if (method === 'CONNECT') return refuse(400, 'CONNECT')
  const framing = framingOf(minor === '1' ? 1 : 0, fields)
  if ('status' in framing) return framing
  // RFC 9112, 3.2.3 and 3.2.4: the authority-form is CONNECT's, the asterisk-form a server-wide OPTIONS;
  // neither is a resource a route here could answer.
  if (target.charCodeAt(0) !== 47 && !/^https?:\/\//.test(target))
    return refuse(400, 'a request target in authority-form or asterisk-form')
  // RFC 9110, 4.2.4: userinfo in an http(s) URI is an error.
  if (/^https?:\/\/[^/?]*@/.test(target)) return refuse(400, 'userinfo in an absolute-form target')
  const url = requestUrl(target, framing.host)
  if (url === undefined) return refuse(400, 'a request target or Host that makes no URL')
  return { method, url, fields, ...framing, end: blank + 4 }
}

// Not all of the head has come. What has is refused now if it is too large already, or wrong already:
// each line once it is whole, and NUL or a bare CR or LF as soon as it comes.
function incomplete(bytes: Buffer, start: number, read: Progress): Refusal | undefined {
  if (bytes.length - start > MAX_HEAD_BYTES) return TOO_LARGE
  for (
    let eol;
    (eol = bytes.indexOf('\r\n', Math.max(read.line, read.scanned - 1), 'latin1')) >= 0;
    read.line = eol + 2
  ) {
    const text = bytes.toString('latin1', read.line, eol + 2)
    if (read.line === start) {
      const line = REQUEST_LINE.exec(text)
      if (!line) return refuse(400, requestLineFault(text))
      if (!KNOWN_METHODS.has(line[1])) return refuse(400, 'an unknown method')
      read.counted += line[2].length
    } else {
      const counted = readFields(text, 0, [])
      if (typeof counted !== 'number') return counted
      read.counted += counted
      if (++read.lines > MAX_FIELDS) return refuse(431, 'more than 1,000 field lines')
    }
  }
  for (let at = Math.max(read.scanned, read.line); at < bytes.length; at++) {
    const byte = bytes[at]
    if (byte === 0 || (byte === 10) !== (bytes[at - 1] === 13))
      return refuse(400, 'a NUL or a bare CR or LF in the head')
  }
  read.scanned = bytes.length
  return read.counted + bytes.length - read.line >= MAX_HEADER_BYTES ? TOO_LARGE : undefined
}

function requestLineFault(text: string): string {
  const line = text.slice(0, text.indexOf('\r\n') >>> 0)
  if (!/^[A-Z-]+ /.test(line)) return 'an unknown method'
  if (/^[A-Z-]+ \S+ HTTP\/\d\.\d$/.test(line)) return 'a request target of characters RFC 3986 does not allow'
  return 'a request line that is not method SP target SP HTTP/1.x'
}

// Reads the field lines of `text` from `from` into `fields` as name, value pairs: the bytes Node
// counts of them (names and values, whitespace at a value's end included), or the fault.
function readFields(text: string, from: number, fields: string[]): number | Refusal {
  let counted = 0
  FIELD_LINE.lastIndex = from
  while (FIELD_LINE.lastIndex < text.length) {
    const at = FIELD_LINE.lastIndex
    const field = FIELD_LINE.exec(text)
    if (!field) return refuse(400, fieldFault(text.slice(at)))
    const [, name, raw] = field
    const lower = name.toLowerCase()
    const value = trimEnd(raw)
    // llhttp refuses a tab after the codings, where it would trim it from another value.
    if (lower === 'transfer-encoding' && raw.slice(value.length).includes('\t'))
      return refuse(400, "a tab after Transfer-Encoding's codings")
    counted += name.length + raw.length
    fields.push(lower, value)
  }
  return counted
}

function fieldFault(line: string): string {
  if (line[0] === ' ' || line[0] === '\t') return 'a folded field line (obs-fold)'
  if (/^[^:\r\n]*[\t ]:/.test(line)) return "whitespace before a field name's colon"
  return 'a field line that is not name: value'
}

// Spaces and tabs at the end of a value are not part of it (RFC 9112, 5.1).
function trimEnd(value: string): string {
  let end = value.length
  while (end > 0 && (value.charCodeAt(end - 1) === 32 || value.charCodeAt(end - 1) === 9)) end--
  return end === value.length ? value : value.slice(0, end)
}

type Framing = Pick<Head, 'minor' | 'bodyLength' | 'keepAlive' | 'expectContinue'> & { host: string | undefined }

// What the fields say of the message: its Host, its body's length, whether the connection stays open,
// and whether the client waits for a 100 (Continue). Ambiguous framing is refused, and the connection
// closed, so that no request can be smuggled inside another (RFC 9112, 6.1 and 6.3).
function framingOf(minor: 0 | 1, fields: string[]): Framing | Refusal {
  let host: string | undefined
  let hosts = 0
  let contentLength: string | undefined
  let codings: string | undefined
  let connection = ''
  let expect: string | undefined
  for (let i = 0; i < fields.length; i += 2) {
    const value = fields[i + 1]
    switch (fields[i]) {
      case 'host':
        hosts++
        host = value
        break
      case 'content-length':
        if (contentLength !== undefined) return refuse(400, 'more than one Content-Length')
        contentLength = value
        break
      case 'transfer-encoding':
        codings = codings === undefined ? value : `${codings},${value}`
        break
      case 'connection':
        connection += `,${value}`
        break
      case 'expect':
        expect = expect === undefined ? value : `${expect},${value}`
    }
  }
  if (hosts > 1) return refuse(400, 'more than one Host')
  if (minor === 1 && hosts === 0) return refuse(400, 'an HTTP/1.1 request without Host')
  if (host !== undefined && !HOST.test(host)) return refuse(400, 'a Host that is not host[:port]')
  const bodyLength = bodyLengthOf(minor, contentLength, codings)
  if (typeof bodyLength !== 'number') return bodyLength
  const tokens =
    connection === ''
      ? []
      : connection
          .toLowerCase()
          .split(',')
          .map((token) => token.trim())
  const keepAlive = !tokens.includes('close') && (minor === 1 || tokens.includes('keep-alive'))
  // RFC 9110, 10.1.1: an HTTP/1.0 client's expectation is ignored.
  if (minor === 1 && expect !== undefined && expect.toLowerCase() !== '100-continue')
    return refuse(417, 'an expectation other than 100-continue')
  return {
    minor,
    host: minor === 0 ? (host ?? 'localhost') : host,
    bodyLength,
    keepAlive,
    expectContinue: minor === 1 && expect !== undefined,
  }
}

// The body's length: none, a Content-Length, or chunked, which must be the one transfer coding.
function bodyLengthOf(minor: 0 | 1, contentLength: string | undefined, codings: string | undefined): number | Refusal {
  if (codings !== undefined) {
    if (minor === 0) return refuse(400, 'Transfer-Encoding in an HTTP/1.0 request')
    if (contentLength !== undefined) return refuse(400, 'Content-Length with Transfer-Encoding')
    // RFC 9110, 5.6.1 asks a recipient to ignore empty list elements; llhttp refuses one at the end.
    const listed = codings.split(',').map((name) => name.trim().toLowerCase())
    if (listed.at(-1) === '') return refuse(400, 'an empty element at the end of Transfer-Encoding')
    const names = listed.filter(Boolean)
    if (names.at(-1) !== 'chunked' || names.indexOf('chunked') !== names.length - 1) {
      return refuse(400, 'a Transfer-Encoding whose last coding is not chunked, once')
    }
    return names.length > 1 ? refuse(501, 'a transfer coding other than chunked') : CHUNKED
  }
  if (contentLength === undefined) return 0
  if (!/^\d+$/.test(contentLength)) return refuse(400, 'a Content-Length that is not digits')
  return contentLength.length > 15 ? Number.MAX_SAFE_INTEGER : Number(contentLength)
}

// The absolute URL of the request: the target's own (absolute-form: RFC 9112, 3.2.2 says to ignore
// Host then), or Host's with the target's path and query (origin-form), resolved as WHATWG URL does,
// dot segments and all, unless it needs no resolving. Undefined where there is no URL to be had.
function requestUrl(target: string, host: string | undefined): string | undefined {
  if (target.charCodeAt(0) !== 47) return /^https?:\/\/[^/?]/.test(target) ? parsedUrl(target) : undefined
  if (host === undefined || host === '') return undefined
  if (PLAIN_HOST.test(host) && PLAIN_PATH.test(target) && !DOT_SEGMENT.test(target)) return `http://${host}${target}`
  const query = target.indexOf('?')
  if (target.lastIndexOf('\\', query < 0 ? Infinity : query) >= 0) return undefined // as @hono/node-server
  return parsedUrl(`http://${host}${target}`)
}

function parsedUrl(text: string): string | undefined {
  try {
    return new URL(text).href
  } catch {
    return undefined
  }
}

// A chunked body, decoded as its bytes come (RFC 9112, 7.1): each chunk's size line with any
// extensions (checked, then ignored), its data and CRLF; then the last chunk, any trailer fields
// (checked, then ignored, as 7.1.2 allows) and the blank line. More data than maxBytes is a 413.
export class ChunkedBody {
  parts: Buffer[] = []
  size = 0
  #remaining = -1 // of the current chunk's data, then 0 until its CRLF; -1 before a size line; -2 in the trailer
  #trailerBytes = 0
  #scanned = 0 // how far a line not yet whole has been looked at

  readonly maxBytes: number

  constructor(maxBytes: number) {
    this.maxBytes = maxBytes
  }

  // Reads on from `at`: where it stopped and whether the body is whole, or a Refusal.
  read(bytes: Buffer, at: number): { at: number; done: boolean } | Refusal {
    while (at < bytes.length) {
      if (this.#remaining > 0) {
        const take = Math.min(this.#remaining, bytes.length - at)
        this.parts.push(bytes.subarray(at, at + take))
        this.#remaining -= take
        at += take
        continue
      }
      const eol = bytes.indexOf('\r\n', at, 'latin1')
      if (eol < 0) return this.#partialLine(bytes, at)
      const step = this.#line(bytes.toString('latin1', at, eol))
      at = eol + 2
      if (step !== undefined) return step === true ? { at, done: true } : step
    }
    return { at, done: false }
  }

  // One line: the CRLF after a chunk's data, a size line, or a trailer line; true at the end.
  #line(line: string): Refusal | true | undefined {
    if (this.#remaining === 0) {
      this.#remaining = -1
      return line === '' ? undefined : refuse(400, 'chunk data longer than its size')
    }
    if (this.#remaining === -2) {
      if (line === '') return true
      this.#trailerBytes += line.length
      if (this.#trailerBytes >= MAX_HEADER_BYTES) return TOO_LARGE
      const field: string[] = []
      const counted = readFields(`${line}\r\n`, 0, field)
      if (typeof counted !== 'number') return counted
      // RFC 9110, 6.5.1: a trailer never frames the message.
      return FRAMING_FIELDS.has(field[0]) ? refuse(400, 'a trailer field that frames the message') : undefined
    }
    const size = CHUNK_LINE.exec(line)
    if (!size) return refuse(400, 'a chunk size line that is not hex digits and extensions')
    const digits = size[1].replace(/^0+(?=.)/, '')
    const bytes = digits.length > 8 ? Infinity : parseInt(digits, 16)
    if (this.size + bytes > this.maxBytes) return refuse(413, 'a chunked body over the limit')
    this.size += bytes
    this.#remaining = bytes === 0 ? -2 : bytes
    return undefined
  }

  // A line not yet whole: refused at once if it cannot become one.
  #partialLine(bytes: Buffer, at: number): { at: number; done: boolean } | Refusal {
    if (bytes.length - at > MAX_HEADER_BYTES) return refuse(413, 'chunk extensions over 16 KB')
    if (bytes.indexOf(10, Math.max(at, this.#scanned)) >= 0) return refuse(400, 'a bare LF in a chunked body')
    this.#scanned = bytes.length
    return { at, done: false }
  }
}

// chunk-size [ chunk-ext ]: hex digits, then any number of ;name or ;name=value (a token or a quoted
// string). The whitespace RFC 9112, 7.1.1 tolerates around ; and = (BWS) is refused, as llhttp does.
const CHUNK_LINE =
  /^([0-9A-Fa-f]+)(?:;[!#$%&'*+\-.^_`|~0-9A-Za-z]+(?:=(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+|"(?:[\t !#-[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"))?)*$/
