// What goes on the wire for an answer: the status line, the header fields a client relies on (Date, as
// RFC 9110, 6.6.1 asks of a server with a clock; Content-Length; Connection), and the body, as
// node:http writes them. Also the JSON errors written before a request exists.
import { STATUS_CODES } from 'node:http'
import { errorBody, JSON_HEADERS } from '../app.ts'
import { KEEP_ALIVE_MS } from './api-server.ts'
import { GIVEN, type Given } from './web.ts'

// The idle keep-alive timeout, which every answer on a connection kept open announces.
const KEEP_ALIVE = `Connection: keep-alive\r\nKeep-Alive: timeout=${KEEP_ALIVE_MS / 1000}\r\n`
const CLOSE = 'Connection: close\r\n'

// The Date field, made once a second: emptied at the next second, and made again when next asked for.
const date = { field: '' }
function dateField(): string {
  if (!date.field) {
    date.field = `Date: ${new Date().toUTCString()}\r\n`
    setTimeout(() => (date.field = ''), 1000 - (Date.now() % 1000)).unref()
  }
  return date.field
}

// Each status line made once.
const statusLines: string[] = []
const statusLine = (status: number) =>
  (statusLines[status] ??= `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Unknown'}\r\n`)

// A whole answer in the JSON error shape, which closes the connection: for what is refused before a
// fetch handler sees it (malformed HTTP, headers too large, a client too slow, a server full). To a
// HEAD, its fields alone (RFC 9110, 9.3.2), as every answer to one.
export function rawError(status: number, message: string, fields: Record<string, string> = {}, head = false): string {
  const body = errorBody(message)
  const lines = Object.entries({ ...JSON_HEADERS, ...fields })
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join('')
  return `${statusLine(status)}${lines}Content-Length: ${Buffer.byteLength(body)}\r\n${dateField()}${CLOSE}\r\n${head ? '' : body}`
}

export const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n'

// How an answer goes: the head (latin1 where a field value is past ASCII), and a body given whole
// (written with it) or a stream of one.
export type Answer = {
  head: string
  latin1?: boolean
  body: string | Uint8Array | null
  stream?: ReadableStream<Uint8Array>
  chunked: boolean
  close: boolean
}
type Request = { head: boolean; keepAlive: boolean; minor: 0 | 1 }

// A field name is a token, and a value holds no CR, LF or NUL: what a handler puts in them goes on the
// wire, so a field that would break the head (or smuggle another in) is refused.
const FIELD_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
const ASCII_VALUE = /^[\t\x20-\x7e]*$/
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/
// Fields this server writes itself from the answer's framing.
const FRAMING = new Set(['content-length', 'transfer-encoding', 'connection', 'keep-alive', 'date'])

// A handler's header fields as the head writes them: checked, and what they say of the connection.
type Fields = { text: string; latin1: boolean; close: boolean }

// A frozen record of strings (app.ts's JSON_HEADERS, on every answer) cannot change: checked and
// written once, then reused.
const checked = new WeakMap<object, Fields>()

function fieldsOf(headers: HeadersInit | undefined): Fields {
  const known = headers && checked.get(headers)
  if (known) return known
  const fields: Fields = { text: '', latin1: false, close: false }
  if (headers instanceof Headers) {
    for (const cookie of headers.getSetCookie()) addField(fields, 'set-cookie', cookie)
    headers.forEach((value, name) => name !== 'set-cookie' && addField(fields, name, value))
  } else if (Array.isArray(headers)) for (const [name, value] of headers) addField(fields, name, value)
  else if (headers) {
    let strings = true
    for (const name in headers) {
      const value = (headers as Record<string, string>)[name]
      strings &&= typeof value === 'string'
      addField(fields, name, value)
    }
    if (strings && Object.isFrozen(headers)) checked.set(headers, fields)
  }
  return fields
}

function addField(fields: Fields, name: string, value: string) {
  if (!FIELD_NAME.test(name) || !(ASCII_VALUE.test(value) || (fields.latin1 = FIELD_VALUE.test(value)))) {
    throw new TypeError(`an invalid response field: ${JSON.stringify(name)}`)
  }
  const lower = name.toLowerCase()
  if (lower === 'connection' && /\bclose\b/i.test(value)) fields.close = true
  if (!FRAMING.has(lower)) fields.text += `${name}: ${value}\r\n`
}

// The answer to a request from what a fetch handler returned: a Response that kept what it was given
// (server/web.ts), or a real one.
export function answerOf(response: globalThis.Response, request: Request): Answer {
  const given = (response as { [GIVEN]?: Given })[GIVEN]
  // The common case, every answer of the API's: a body given whole, framed by its length.
  if (given) return givenAnswer(given, request)
  return streamAnswer(response, request)
}

function givenAnswer({ status, headers, body }: Given, request: Request): Answer {
  const fields = fieldsOf(headers)
  const close = !request.keepAlive || fields.close
  const type = typeof body === 'string' && !headers ? 'content-type: text/plain;charset=UTF-8\r\n' : ''
  const bodiless = request.head || status === 204 || status === 304
  const length = body === null ? 0 : typeof body === 'string' ? Buffer.byteLength(body) : body.byteLength
  const head = headOf(status, fields.text + type, close, bodiless ? '' : `Content-Length: ${length}\r\n`)
  return { head, latin1: fields.latin1, body: bodiless ? null : body, chunked: false, close }
}

// A real Response: its body is a stream, chunked in HTTP/1.1 and ended by the close in HTTP/1.0.
function streamAnswer(response: globalThis.Response, request: Request): Answer {
  const { status } = response
  const fields = fieldsOf(response.headers)
  const bodiless = request.head || status === 204 || status === 304
  const stream = bodiless ? undefined : (response.body ?? undefined)
  const chunked = stream !== undefined && request.minor === 1
  const close = !request.keepAlive || fields.close || (stream !== undefined && !chunked)
  const framing = bodiless ? '' : !stream ? 'Content-Length: 0\r\n' : chunked ? 'Transfer-Encoding: chunked\r\n' : ''
  return {
    head: headOf(status, fields.text, close, framing),
    latin1: fields.latin1,
    body: null,
    stream,
    chunked,
    close,
  }
}

const headOf = (status: number, fields: string, close: boolean, framing: string) =>
  `${statusLine(status)}${fields}${dateField()}${close ? CLOSE : KEEP_ALIVE}${framing}\r\n`
