// The challenge's users: N keep-alive connections, each one user, together sending the k6 mix at a
// total rate (N x 0.106 requests a second), every response checked and timed.
//
// Our own code because no tool we can install does this: autocannon lowers its connection count to its
// overall rate (it rates each connection in whole requests a second), and wrk and h2load do not rate
// connections at all; none holds 15,000 connections that each send one request every 9 s or so.
//
//   node bench/users.ts --url http://127.0.0.1:3000 --connections 15000 --rate 1590 --idle 5 --hold 60 \
//     --tokens tokens.txt [--posts 500000] [--local-address 127.0.0.2]
//
// Prints JSON lines: {"event":"connected",...} once every connection is open (the idle phase follows,
// for the caller to measure the server's memory), then {"event":"done",...} with the results.
import { readFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { parseArgs } from 'node:util'

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string' },
    connections: { type: 'string', default: '15000' },
    rate: { type: 'string' },
    idle: { type: 'string', default: '5' },
    hold: { type: 'string', default: '60' },
    tokens: { type: 'string' },
    posts: { type: 'string', default: '500000' },
    'local-address': { type: 'string' },
  },
})
const url = new URL(opts.url!)
const CONNECTIONS = Number(opts.connections)
const RATE = Number(opts.rate ?? CONNECTIONS * 0.106)
const TOKENS = readFileSync(opts.tokens!, 'utf8').trim().split('\n')
const POSTS = Number(opts.posts)

// One k6 loop: a feed, a post, a like 15% of the time, a new post 2% of the time.
type Kind = 'feed' | 'post' | 'like' | 'create'
const MIX: [Kind, number][] = [['feed', 1], ['post', 1], ['like', 0.15], ['create', 0.02]]
const EXPECT: Record<Kind, [number[], string]> = {
  feed: [[200], '{"posts":[{"id":'],
  post: [[200], '{"post":{"id":'],
  like: [[200, 201], '{"liked":true,'],
  create: [[201], '{"post":{"id":'],
}

const random = (n: number) => 1 + Math.floor(Math.random() * n)
const token = () => TOKENS[Math.floor(Math.random() * TOKENS.length)]
let created = 0

function pickKind(): Kind {
  let r = Math.random() * 2.17
  for (const [kind, weight] of MIX) if ((r -= weight) <= 0) return kind
  return 'feed'
}

function requestBytes(kind: Kind): string {
  switch (kind) {
    case 'feed':
      return 'GET /feed HTTP/1.1\r\nHost: bench\r\n\r\n'
    case 'post':
      return `GET /posts/${random(POSTS)} HTTP/1.1\r\nHost: bench\r\n\r\n`
    case 'like':
      return `POST /posts/${random(POSTS)}/like HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer ${token()}\r\nContent-Length: 0\r\n\r\n`
    case 'create': {
      const body = `{"body":"A user post, number ${++created}."}`
      return `POST /posts HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer ${token()}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`
    }
  }
}

type Connection = { socket: Socket; open: boolean; busy: boolean; kind: Kind; sentAt: number; buffer: Buffer }

const latencies: number[] = []
const errors = { status: 0, body: 0, closed: 0, connect: 0, example: '' }
let sent = 0
let measuring = false

function fail(type: 'status' | 'body' | 'closed' | 'connect', example: string) {
  errors[type]++
  errors.example ||= example
}

// Reads one response with a Content-Length (all the server sends), checks it, and times it.
function onData(c: Connection, chunk: Buffer) {
  c.buffer = c.buffer.length ? Buffer.concat([c.buffer, chunk]) : chunk
  const headerEnd = c.buffer.indexOf('\r\n\r\n')
  if (headerEnd < 0) return
  const head = c.buffer.toString('latin1', 0, headerEnd)
  const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0)
  if (c.buffer.length < headerEnd + 4 + length) return
  const status = Number(head.slice(9, 12))
  const body = c.buffer.toString('utf8', headerEnd + 4, headerEnd + 4 + length)
  c.buffer = c.buffer.subarray(headerEnd + 4 + length)
  c.busy = false
  if (!measuring) return
  const [statuses, prefix] = EXPECT[c.kind]
  if (!statuses.includes(status)) fail('status', `${c.kind}: ${status} ${body.slice(0, 80)}`)
  else if (!body.startsWith(prefix)) fail('body', `${c.kind}: ${body.slice(0, 80)}`)
  else latencies.push(performance.now() - c.sentAt)
}

const connections: Connection[] = []

async function openAll() {
  const started = performance.now()
  const opening: Promise<void>[] = []
  for (let i = 0; i < CONNECTIONS; i++) {
    // In batches, so the listen backlog is not flooded.
    if (i % 500 === 0 && i > 0) await new Promise((resolve) => setTimeout(resolve, 50))
    const socket = connect({ host: url.hostname, port: Number(url.port), localAddress: opts['local-address'], noDelay: true })
    const c: Connection = { socket, open: false, busy: false, kind: 'feed', sentAt: 0, buffer: Buffer.alloc(0) }
    connections.push(c)
    opening.push(
      new Promise((resolve) => {
        socket.once('connect', () => ((c.open = true), resolve()))
        socket.once('error', (err) => (c.open ? fail('closed', err.message) : fail('connect', err.message), resolve()))
      }),
    )
    socket.on('data', (chunk) => onData(c, chunk))
    socket.on('close', () => {
      if (c.open && measuring) fail('closed', 'the server closed a connection')
      c.open = false
    })
  }
  await Promise.all(opening)
  return (performance.now() - started) / 1000
}

function send(c: Connection) {
  c.kind = pickKind()
  c.busy = true
  c.sentAt = performance.now()
  c.socket.write(requestBytes(c.kind))
  sent++
}

// Arrivals are a Poisson process spread over the users: each idle user is as likely as any other to
// send next, which is what many independent users with random think times add up to.
async function hold(seconds: number) {
  let due = 0
  let last = performance.now()
  let skipped = 0
  const end = last + seconds * 1000
  await new Promise<void>((resolve) => {
    const timer = setInterval(() => {
      const now = performance.now()
      due += (RATE * (now - last)) / 1000
      last = now
      for (; due >= 1; due--) {
        let c: Connection | undefined
        for (let tries = 0; tries < 20 && !c; tries++) {
          const candidate = connections[Math.floor(Math.random() * connections.length)]
          if (candidate.open && !candidate.busy) c = candidate
        }
        if (c) send(c)
        else skipped++
      }
      if (now >= end) {
        clearInterval(timer)
        resolve()
      }
    }, 5)
  })
  return skipped
}

const percentile = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0
const print = (event: object) => process.stdout.write(JSON.stringify(event) + '\n')

const connectSeconds = await openAll()
const open = connections.filter((c) => c.open).length
print({ event: 'connected', connections: open, failed: CONNECTIONS - open, seconds: connectSeconds })
await new Promise((resolve) => setTimeout(resolve, Number(opts.idle) * 1000))

// Everything sent after the idle phase is measured; answers still due at the end are waited for.
measuring = true
const cpuBefore = process.cpuUsage()
const started = performance.now()
const skipped = await hold(Number(opts.hold))
const drainUntil = performance.now() + 5000
while (connections.some((c) => c.open && c.busy) && performance.now() < drainUntil) await new Promise((resolve) => setTimeout(resolve, 10))
const elapsed = (performance.now() - started) / 1000
const cpu = process.cpuUsage(cpuBefore)
const unanswered = connections.filter((c) => c.busy).length
latencies.sort((a, b) => a - b)
print({
  event: 'done',
  connections: open,
  rate: RATE,
  sent,
  answered: latencies.length,
  unanswered,
  skipped,
  seconds: elapsed,
  errors,
  p50_ms: percentile(latencies, 50),
  p95_ms: percentile(latencies, 95),
  p99_ms: percentile(latencies, 99),
  max_ms: latencies.at(-1) ?? 0,
  generator_cpu: (cpu.user + cpu.system) / 1e6 / elapsed,
})
for (const c of connections) c.socket.destroy()
