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
  await Promise.all(lanes.map((lane) => sendOn(port, lane, timeoutMs)))
}

async function sendOn(port: number, requests: Request[], timeoutMs: number) {
  if (requests.length === 0) return
  const socket: Socket = connect({ port, host: '127.0.0.1', noDelay: true })
  try {
    await new Promise<void>((resolve, reject) => {
      let i = 0
      let buffer: Buffer = Buffer.alloc(0)
      let timer = setTimeout(() => reject(new Error(`no answer to request ${i} in ${timeoutMs} ms`)), timeoutMs)
      socket.on('error', reject)
      socket.on('close', () => reject(new Error(`the server closed the connection at request ${i}`)))
      socket.on('data', (chunk: Buffer) => {
        buffer = buffer.length ? Buffer.concat([buffer, chunk]) : chunk
        const end = buffer.indexOf('\r\n\r\n')
        if (end < 0) return
        const head = buffer.toString('latin1', 0, end)
        const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? NaN)
        if (buffer.length < end + 4 + length) return
        const status = Number(head.slice(9, 12))
        const body = buffer.toString('utf8', end + 4, end + 4 + length)
        buffer = buffer.subarray(end + 4 + length)
        const [statuses, prefix] = EXPECT[requests[i].kind]
        if (!statuses.includes(status) || !body.startsWith(prefix))
          return reject(new Error(`${requests[i].kind} ${i}: ${status} ${body.slice(0, 80)}`))
        clearTimeout(timer)
        if (++i === requests.length) return resolve()
        timer = setTimeout(() => reject(new Error(`no answer to request ${i} in ${timeoutMs} ms`)), timeoutMs)
        socket.write(requests[i].bytes)
      })
      socket.once('connect', () => socket.write(requests[0].bytes))
    })
  } finally {
    socket.destroy()
  }
}
