// Fixed sequences of requests for counting instructions: request i of a kind is the same on every run
// (the same ids, tokens and bodies, from a seeded generator), and every answer is checked, as wrk.lua
// checks them. The mix draws each request's kind in the k6 loop's proportions.
import { connect, type Socket } from 'node:net'
import { mulberry32 } from '../random.ts'

export const KINDS = ['feed', 'post', 'like', 'create', 'mix'] as const
export type Kind = (typeof KINDS)[number]
export type Single = Exclude<Kind, 'mix'>

// What each kind's answer must be: its statuses and how its body starts (bench/users.ts checks the same).
export const EXPECT: Record<Single, [number[], string]> = {
  feed: [[200], '{"posts":[{"id":'],
  post: [[200], '{"post":{"id":'],
  like: [[200, 201], '{"liked":true,'],
  create: [[201], '{"post":{"id":'],
}
// The k6 loop's proportions (46.1% feeds, 46.1% posts, 6.9% likes, 0.9% new posts), as the share of
// draws below which each kind is chosen.
const MIX: [Single, number][] = [
  ['feed', 0.461],
  ['post', 0.922],
  ['like', 0.991],
  ['create', 1],
]

type Request = { kind: Single; bytes: string }

// The first count requests of a kind's sequence.
export function sequence(kind: Kind, count: number, tokens: string[]): Request[] {
  const next = mulberry32(20261201 + KINDS.indexOf(kind)) // the seed's generator: the same requests on every run
  const requests: Request[] = []
  for (let i = 0; i < count; i++) {
    const draw = next()
    const single = kind === 'mix' ? MIX.find(([, below]) => draw < below)![0] : kind
    const postId = 1 + Math.floor(next() * 500_000)
    const token = tokens[Math.floor(next() * tokens.length)]
    requests.push({ kind: single, bytes: requestBytes(single, postId, token, i) })
  }
  return requests
}

// The fields k6 (v2.2.0) sends first, in the challenge given the server's address (load.js's BASE_URL):
// Host is an IPv4 address and a port, which the server must read as WHATWG URL would.
const K6 = 'Host: 10.0.0.2:3000\r\nUser-Agent: Grafana k6/2.2.0\r\n'

// One request of the kind, as k6 sends load.js's, field by field; i numbers a new post's body.
export function requestBytes(kind: Single, postId: number, token: string, i: number): string {
  switch (kind) {
    case 'feed':
      return `GET /feed HTTP/1.1\r\n${K6}\r\n`
    case 'post':
      return `GET /posts/${postId} HTTP/1.1\r\n${K6}\r\n`
    case 'like':
      return `POST /posts/${postId}/like HTTP/1.1\r\n${K6}Content-Length: 0\r\nAuthorization: Bearer ${token}\r\n\r\n`
    case 'create': {
      const body = `{"body":"A user post, number ${i}."}`
      return `POST /posts HTTP/1.1\r\n${K6}Content-Length: ${body.length}\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\n\r\n${body}`
    }
  }
}

// Sends the requests over `connections` keep-alive connections, each sending its next request when
// the last is answered (request i on connection i % connections); resolves once all are answered, and
// rejects at the first wrong answer, closed connection, or an answer later than timeoutMs.
export async function send(port: number, requests: Request[], { connections = 1, timeoutMs = 60_000 } = {}) {
  const lanes = Array.from({ length: connections }, (_, lane) => requests.filter((_, i) => i % connections === lane))
  await Promise.all(
    lanes.map(async (lane) => {
      if (lane.length === 0) return
      const connection = await KeepAlive.open(port, timeoutMs)
      try {
        for (const request of lane) await connection.ask(request)
      } finally {
        connection.close()
      }
    }),
  )
}

// Sends the requests one at a time, each on the next of `connections` keep-alive connections in turn,
// so that each finds its connection as a user's next request does, not touched since its last; every
// connection has asked for the feed once first (a connection that never asks is closed by the server).
export async function sendInTurn(port: number, requests: Request[], connections: number, timeoutMs = 60_000) {
  const opened: KeepAlive[] = []
  try {
    for (let i = 0; i < connections; i++) {
      opened.push(await KeepAlive.open(port, timeoutMs))
      await opened[i].ask({ kind: 'feed', bytes: requestBytes('feed', 0, '', 0) })
    }
    for (const [i, request] of requests.entries()) await opened[i % connections].ask(request)
  } finally {
    for (const connection of opened) connection.close()
  }
}

// One keep-alive connection, asking one request at a time and checking each answer.
class KeepAlive {
  readonly #socket: Socket
  readonly #timeoutMs: number
  #buffer: Buffer = Buffer.alloc(0)
  #asked = 0
  #gone: Error | undefined // why the connection can take no more requests
  #waiting: { request: Request; resolve: () => void; reject: (error: Error) => void; timer: NodeJS.Timeout } | undefined

  static async open(port: number, timeoutMs: number) {
    const connection = new KeepAlive(connect({ port, host: '127.0.0.1', noDelay: true }), timeoutMs)
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => (connection.close(), reject(new Error(`no connection in ${timeoutMs} ms`))),
        timeoutMs,
      )
      connection.#socket.once('connect', () => (clearTimeout(timer), resolve()))
      connection.#socket.once('error', (error) => (clearTimeout(timer), reject(error)))
    })
    return connection
  }

  constructor(socket: Socket, timeoutMs: number) {
    this.#socket = socket
    this.#timeoutMs = timeoutMs
    socket.on('data', (chunk: Buffer) => this.#received(chunk))
    socket.on('error', (error) => this.#fail(error))
    socket.on('close', () => this.#fail(new Error(`the server closed the connection at request ${this.#asked}`)))
  }

  // Resolves once the request is answered as its kind expects; rejects at anything else.
  ask(request: Request): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.#gone) return reject(this.#gone)
      const timer = setTimeout(
        () => this.#fail(new Error(`no answer to request ${this.#asked} in ${this.#timeoutMs} ms`)),
        this.#timeoutMs,
      )
      this.#waiting = { request, resolve, reject, timer }
      this.#socket.write(request.bytes)
    })
  }

  // A request still waiting is rejected, and its timer cleared.
  close() {
    this.#fail(new Error('closed'))
    this.#socket.destroy()
  }

  #received(chunk: Buffer) {
    const buffer = (this.#buffer = this.#buffer.length ? Buffer.concat([this.#buffer, chunk]) : chunk)
    const end = buffer.indexOf('\r\n\r\n')
    if (end < 0 || !this.#waiting) return
    const head = buffer.toString('latin1', 0, end)
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? NaN)
    if (buffer.length < end + 4 + length) return
    const status = Number(head.slice(9, 12))
    const body = buffer.toString('utf8', end + 4, end + 4 + length)
    this.#buffer = buffer.subarray(end + 4 + length)
    const { request, resolve, timer } = this.#waiting
    const [statuses, prefix] = EXPECT[request.kind]
    if (!statuses.includes(status) || !body.startsWith(prefix))
      return this.#fail(new Error(`${request.kind} ${this.#asked}: ${status} ${body.slice(0, 80)}`))
    clearTimeout(timer)
    this.#waiting = undefined
    this.#asked++
    resolve()
  }

  #fail(error: Error) {
    this.#gone ??= error
    const waiting = this.#waiting
    if (!waiting) return
    clearTimeout(waiting.timer)
    this.#waiting = undefined
    waiting.reject(error)
  }
}
