// Reads HTTP/1.x requests out of the bytes a connection sends: the request line and the header section
// by RFC 9112, never more loosely than llhttp (node:http's parser), then the body by its framing. No I/O
// here: server/reader.ts hands it what a connection has sent so far. Each refusal says why in `reason`;
// where it refuses what llhttp takes, docs/http.md gives the reason.
import { METHODS } from 'node:http'

// Node's --max-http-header-size, counted as Node counts it: the target, the field names and the values.
export const MAX_HEADER_BYTES = 16 * 1024
// What a head may take in all, separators included, before it is refused unread.
export const MAX_HEAD_BYTES = 2 * MAX_HEADER_BYTES
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
// How far the head of one request has been read, kept across the reads it comes in, so that no byte is
// looked at twice (server/reader.ts keeps it, and resets it for each request).
export interface HeadProgress {
  start: number // where the request begins, past the empty lines before it
  skipped: number // the bytes of those empty lines, charged to the head
  line: number // where its first line not yet read begins
  scanned: number // how far its bytes have been checked for a NUL or a bare CR or LF
  counted: number // what Node counts of the lines read: the target, names and values
  requestLine: RegExpExecArray | undefined // once read
  fields: string[] | undefined // of the field lines read
  examined: number // every byte looked at, by every scan: the reader's work, which tests bound
}
export const CHUNKED = -1

const refuse = (status: number, reason: string): Refusal => ({ status, reason })
const TOO_LARGE = refuse(431, 'a head over 16 KB')
const EMPTY_LINES = refuse(431, 'empty lines before a request line, with its head over 32 KB')
const TOO_MANY_FIELDS = refuse(431, 'more than 1,000 field lines')

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
// An absolute-form target: the scheme, the authority, and the path and query (RFC 9112, 3.2.2).
const ABSOLUTE = /^(https?:\/\/)([^/?]*)(.*)$/
// A port: 0 to 65535.
const PORT = '(?::(?:6553[0-5]|655[0-2]\\d|65[0-4]\\d\\d|6[0-4]\\d{3}|[1-5]\\d{4}|\\d{1,4}))?'
// What needs no URL parsing to be a URL as it is: a host and a path that WHATWG URL writes as they
// came, with no dot segment to resolve: no segment is . or .. (after each slash, the lookahead).
// The host is a lower-case name, or an IPv4 address in its canonical dotted form (as a client that was
// given an address sends it: k6 in the challenge), with a port in its canonical form too, not http's 80.
// (A name whose last label is a number is an IPv4 address to WHATWG URL, in some other form: parsed.)
// A plain host is a Host value too (HOST below), so a request's is tested once.
const OCTET = '(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)'
const PLAIN_PORT = '(?::(?!80$)(?:6553[0-5]|655[0-2]\\d|65[0-4]\\d\\d|6[0-4]\\d{3}|[1-5]\\d{4}|[1-9]\\d{0,3}|0))?'
export const PLAIN_HOST = new RegExp(`^(?:(?:[a-z0-9-]+\\.)*[a-z][a-z0-9-]*|(?:${OCTET}\\.){3}${OCTET})${PLAIN_PORT}$`)
const PLAIN_PATH = /^(?:\/(?!\.\.?(?:[/?#]|$))[!#$&-.0-;=?-[\]_a-z~]*)+$/
// A Host value, or the authority of an absolute-form target: a registered name or an IPv4 address (RFC
// 3986's reg-name, without percent-encoding, which @hono/node-server refuses too) or an IP literal, and
// a port.
const HOST = new RegExp(`^(?:[A-Za-z0-9\\-._~!$&'()*+,;=]+|\\[[0-9A-Fa-f:.]+\\])${PORT}$`)
const FRAMING_FIELDS = new Set(['content-length', 'transfer-encoding'])

// The head of the request at `read.start` of `bytes`: a Head, a Refusal, or undefined while some of it
// is still to come. Empty lines before it, which RFC 9112, 2.2 lets a server skip, are skipped and
// charged to it. A head that comes whole is read in one pass; one that comes in pieces is read a line
// at a time as each line ends (incomplete), and the rest once the blank line has come.
export function readHead(bytes: Buffer, read: HeadProgress): Head | Refusal | undefined {
  if (bytes[read.start] === 13) skipEmptyLines(bytes, read)
  const from = Math.max(read.start, read.scanned - 3)
  const blank = bytes.indexOf('\r\n\r\n', from, 'latin1')
  read.examined += (blank < 0 ? bytes.length : blank + 4) - from
  if (blank < 0) return incomplete(bytes, read)
  const tooLarge = headTooLarge(read, blank + 4 - read.start)
  if (tooLarge) return tooLarge
  const text = bytes.toString('latin1', read.line, blank + 2)
  read.examined += text.length
  let line = read.requestLine
  let counted = read.counted
  if (line === undefined) {
    const parsed = REQUEST_LINE.exec(text)
    if (!parsed) return refuse(400, requestLineFault(text))
    if (!KNOWN_METHODS.has(parsed[1])) return refuse(400, 'an unknown method')
    line = parsed
    counted += line[2].length
  }
  const [whole, method, target, major, minor] = line
  if (major !== '1' || (minor !== '0' && minor !== '1')) return refuse(400, 'not HTTP/1.0 or HTTP/1.1')
  if (!TARGET.test(target)) return refuse(400, 'a request target of characters RFC 3986 does not allow')
  const fields = read.fields ?? []
  const fieldBytes = readFields(text, read.requestLine ? 0 : whole.length, fields)
  if (typeof fieldBytes !== 'number') return fieldBytes
  if (counted + fieldBytes >= MAX_HEADER_BYTES) return TOO_LARGE
  if (fields.length > 2 * MAX_FIELDS) return TOO_MANY_FIELDS
  return requestOf(method, target, minor === '1' ? 1 : 0, fields, blank + 4)
}

// What the request line and the fields of a whole head say: the request, or why it is refused.
function requestOf(method: string, target: string, minor: 0 | 1, fields: string[], end: number): Head | Refusal {
  // CONNECT asks for a tunnel: what follows its head is not HTTP, and no route here opens one.
  if (method === 'CONNECT') return refuse(400, 'CONNECT')
  const framing = framingOf(minor, fields)
  if ('status' in framing) return framing
  if (target.charCodeAt(0) !== 47) {
    // RFC 9112, 3.2.3 and 3.2.4: the authority-form is CONNECT's, the asterisk-form a server-wide
    // OPTIONS; neither is a resource a route here could answer.
    if (!/^https?:\/\//.test(target)) return refuse(400, 'a request target in authority-form or asterisk-form')
    // RFC 9110, 4.2.4: userinfo in an http(s) URI is an error.
    if (/^https?:\/\/[^/?]*@/.test(target)) return refuse(400, 'userinfo in an absolute-form target')
  }
  const url = requestUrl(target, framing.host, framing.plainHost)
  if (url === undefined) return refuse(400, 'a request target or Host that makes no URL')
  // Written out, not spread: a spread copies the framing's fields at run time, 1.6% of a request's
  // instructions (BENCHMARKS.md, "Counted: a request's head written out, not spread").
  const { bodyLength, keepAlive, expectContinue } = framing
  return { method, url, minor, fields, bodyLength, keepAlive, expectContinue, end }
}

// Empty lines (CRLF) before a request line: passed over once, and charged to the head after them.
function skipEmptyLines(bytes: Buffer, read: HeadProgress) {
  let start = read.start
  while (bytes[start] === 13 && bytes[start + 1] === 10) start += 2
  if (start === read.start) return
  read.examined += start - read.start
  read.skipped += start - read.start
  read.start = read.line = read.scanned = start
}

// A head of `size` bytes, with the empty lines before it: refused past 32 KB in all.
function headTooLarge(read: HeadProgress, size: number): Refusal | undefined {
  if (read.skipped + size <= MAX_HEAD_BYTES) return undefined
  return size > MAX_HEAD_BYTES ? TOO_LARGE : EMPTY_LINES
}

// Not all of the head has come. What has is refused now if it is too large already, or wrong already:
// each line once it is whole (and kept, read), and NUL or a bare CR or LF as soon as it comes. A line
// still to end is charged to the head's 32 KB in all; what Node counts of it toward 16 KB (its name and
// value, not the whitespace before the value) is counted once it has ended, so that a head is judged
// the same however it was split.
function incomplete(bytes: Buffer, read: HeadProgress): Refusal | undefined {
  const tooLarge = headTooLarge(read, bytes.length - read.start)
  if (tooLarge) return tooLarge
  for (let eol; (eol = endOfLine(bytes, read)) >= 0; read.line = eol + 2) {
    const text = bytes.toString('latin1', read.line, eol + 2)
    read.examined += text.length
    if (read.requestLine === undefined) {
      const line = REQUEST_LINE.exec(text)
      if (!line) return refuse(400, requestLineFault(text))
      if (!KNOWN_METHODS.has(line[1])) return refuse(400, 'an unknown method')
      read.requestLine = line
      read.counted += line[2].length
    } else {
      const counted = readFields(text, 0, (read.fields ??= []))
      if (typeof counted !== 'number') return counted
      read.counted += counted
      if (read.fields.length > 2 * MAX_FIELDS) return TOO_MANY_FIELDS
    }
  }
  const from = Math.max(read.scanned, read.line)
  read.examined += bytes.length - from
  for (let at = from; at < bytes.length; at++) {
    const byte = bytes[at]
    if (byte === 0 || (byte === 10) !== (bytes[at - 1] === 13))
      return refuse(400, 'a NUL or a bare CR or LF in the head')
  }
  read.scanned = bytes.length
  return undefined
}

// The end of the head's next line, if it has come: searched for from where the last search ended.
function endOfLine(bytes: Buffer, read: HeadProgress): number {
  const from = Math.max(read.line, read.scanned - 1)
  const eol = bytes.indexOf('\r\n', from, 'latin1')
  read.examined += (eol < 0 ? bytes.length : eol + 2) - from
  return eol
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

type Framing = Pick<Head, 'bodyLength' | 'keepAlive' | 'expectContinue'> & {
  host: string | undefined
  plainHost: boolean // the Host field is a PLAIN_HOST
}

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
  const plainHost = host === undefined || PLAIN_HOST.test(host) // none: HTTP/1.0's localhost, below
  if (host !== undefined && !plainHost && !HOST.test(host)) return refuse(400, 'a Host that is not host[:port]')
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
    host: minor === 0 ? (host ?? 'localhost') : host,
    plainHost,
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
  if (contentLength.length <= 15) return Number(contentLength)
  // Past what a double holds exactly, any length is over every limit; leading zeros are no part of it.
  const digits = contentLength.replace(/^0+/, '')
  return digits.length > 15 ? Number.MAX_SAFE_INTEGER : Number(digits)
}

// The absolute URL of the request: the target's own (absolute-form: RFC 9112, 3.2.2 says to ignore
// Host then), or Host's with the target's path and query (origin-form). Either way the authority is
// read as a Host field is, and the path by the same rules, resolved as WHATWG URL does, dot segments
// and all, unless it needs no resolving. Undefined where there is no URL to be had.
function requestUrl(target: string, host: string | undefined, plainHost: boolean): string | undefined {
  if (target.charCodeAt(0) === 47) {
    if (!host) return undefined
    if (plainHost && PLAIN_PATH.test(target)) return `http://${host}${target}`
    return parsedUrl('http://', host, target)
  }
  const absolute = ABSOLUTE.exec(target)
  if (!absolute || !HOST.test(absolute[2])) return undefined
  return parsedUrl(absolute[1], absolute[2], absolute[3])
}

function parsedUrl(scheme: string, authority: string, path: string): string | undefined {
  // WHATWG URL reads a backslash in a path as a slash: a path nobody sent. As @hono/node-server, refused.
  const query = path.indexOf('?')
  if (path.lastIndexOf('\\', query < 0 ? Infinity : query) >= 0) return undefined
  try {
    return new URL(`${scheme}${authority}${path}`).href
  } catch {
    return undefined
  }
}

// Chunked framing: each chunk's size line with any extensions, the CRLF after its data, and the
// trailer fields. Counted apart from the data, so that what a client may make the server read and keep
// for one body stays bounded however it splits it (llhttp bounds a chunk's extensions at 16 KB).
export const MAX_FRAMING_BYTES = 8 * 1024
const FRAMING_TOO_LARGE = refuse(413, 'chunked framing over 8 KB')

// A chunked body, decoded as its bytes come (RFC 9112, 7.1): each chunk's size line with any
// extensions (checked, then ignored), its data and CRLF; then the last chunk, any trailer fields
// (checked, then ignored, as 7.1.2 allows) and the blank line. The data is copied out as it comes, so
// that the bytes it came in need not be kept. More data than maxBytes is a 413; so is more framing than
// MAX_FRAMING_BYTES.
export class ChunkedBody {
  size = 0 // the data the size lines have declared so far
  #framing = 0 // bytes of size lines, extensions, the CRLFs after data and trailer lines
  #data: Buffer | undefined
  #stored = 0
  #remaining = -1 // of the current chunk's data, then 0 until its CRLF; -1 before a size line; -2 in the trailer
  #looked = 0 // how far past its start a line not yet whole has been looked at
  #trailers = 0 // trailer field lines

  readonly maxBytes: number
  readonly meter: { examined: number } // charged with every byte looked at, as HeadProgress is

  constructor(maxBytes: number, meter: { examined: number }) {
    this.maxBytes = maxBytes
    this.meter = meter
  }

  // The data, once the body is whole.
  get data(): Buffer {
    return this.#data === undefined ? Buffer.alloc(0) : this.#data.subarray(0, this.#stored)
  }

  // Reads on from `at`: where it stopped and whether the body is whole, or a Refusal.
  read(bytes: Buffer, at: number): { at: number; done: boolean } | Refusal {
    while (at < bytes.length) {
      if (this.#remaining > 0) {
        const take = Math.min(this.#remaining, bytes.length - at)
        this.#keep(bytes, at, take)
        this.#remaining -= take
        at += take
      } else if (this.#remaining === 0) {
        // The CRLF after a chunk's data: anything else there means the data was longer than its size.
        if (bytes[at] !== 13 || (at + 1 < bytes.length && bytes[at + 1] !== 10))
          return refuse(400, 'chunk data longer than its size')
        if (at + 1 === bytes.length) break
        this.#framing += 2
        this.#remaining = -1
        at += 2
      } else {
        const from = Math.max(at, at + this.#looked - 1)
        const eol = bytes.indexOf('\r\n', from, 'latin1')
        this.meter.examined += (eol < 0 ? bytes.length : eol + 2) - from
        if (eol < 0) return this.#partialLine(bytes, at)
        this.#framing += eol + 2 - at
        if (this.#framing > MAX_FRAMING_BYTES) return FRAMING_TOO_LARGE
        this.#looked = 0
        this.meter.examined += eol - at
        const step = this.#line(bytes.toString('latin1', at, eol))
        at = eol + 2
        if (step !== undefined) return step === true ? { at, done: true } : step
      }
    }
    return { at, done: false }
  }

  // One line: a size line, or a trailer line; true at the end.
  #line(line: string): Refusal | true | undefined {
    if (this.#remaining === -2) {
      if (line === '') return true
      // llhttp counts trailer lines as it counts a head's, apart from the head's own.
      if (++this.#trailers > MAX_FIELDS) return TOO_MANY_FIELDS
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

  // A line not yet whole: refused at once if it cannot become one, or if it is already too long.
  #partialLine(bytes: Buffer, at: number): { at: number; done: boolean } | Refusal {
    if (this.#framing + bytes.length - at > MAX_FRAMING_BYTES) return FRAMING_TOO_LARGE
    if (bytes.indexOf(10, at + this.#looked) >= 0) return refuse(400, 'a bare LF in a chunked body')
    this.meter.examined += bytes.length - at - this.#looked
    this.#looked = bytes.length - at
    return { at, done: false }
  }

  // Copies data out of the bytes read, into a buffer that grows to at most maxBytes.
  #keep(bytes: Buffer, at: number, take: number) {
    const needed = this.#stored + take
    if (this.#data === undefined || needed > this.#data.length) {
      const grown = Buffer.allocUnsafe(Math.min(this.maxBytes, Math.max(2 * needed, 1024)))
      this.#data?.copy(grown, 0, 0, this.#stored)
      this.#data = grown
    }
    bytes.copy(this.#data, this.#stored, at, at + take)
    this.#stored = needed
  }
}

// chunk-size [ chunk-ext ]: hex digits, then any number of ;name or ;name=value (a token or a quoted
// string). The whitespace RFC 9112, 7.1.1 tolerates around ; and = (BWS) is refused, as llhttp does.
const CHUNK_LINE =
  /^([0-9A-Fa-f]+)(?:;[!#$%&'*+\-.^_`|~0-9A-Za-z]+(?:=(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+|"(?:[\t !#-[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"))?)*$/
