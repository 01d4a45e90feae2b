// The challenge's users: N keep-alive connections, each one k6 user running the challenge's loop (a
// feed, 3-7 s, a post from it, 3-8 s, a like 15% of the time, a new post 2%, 5-15 s), which adds up to
// N x 0.106 requests a second. Every response is checked and timed.
//
// Our own code because no tool we can install does this: autocannon lowers its connection count to its
// overall rate (it rates each connection in whole requests a second), and wrk and h2load do not rate
// connections at all; none holds 15,000 connections that each send one request every 9 s or so.
//
//   node bench/users.ts --url http://127.0.0.1:3000 --connections 15000 --idle 5 --hold 60 \
//     --tokens tokens.txt [--think-scale 1] [--ramp 0]
//     [--latencies file.json]   (every latency, sorted, for a caller that merges several generators)
//     [--interval 60]           (also prints {"event":"interval",...} every so many seconds of the hold)
//
// Each user connects and asks for the feed, as a k6 user does on arrival; then all are idle for --idle
// seconds (for the caller to measure the server's memory per idle connection); then the loops run for
// --hold seconds, started at random points of a loop so the rate is steady from the first second.
// With --loop-on-arrival each user goes on with its loop as soon as it has the feed, as a k6 user of
// ramping-vus does, and the hold (the time measured) starts once every user has arrived.
// Prints JSON lines: {"event":"connected",...} when every connection has had its first answer, then
// {"event":"done",...} with the results.
import { readFileSync, writeFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { parseArgs } from 'node:util'
import { EXPECT, requestBytes, type Single as Kind } from './sequence.ts'

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string' },
    connections: { type: 'string', default: '15000' },
    idle: { type: 'string', default: '5' },
    hold: { type: 'string', default: '60' },
    tokens: { type: 'string' },
    'think-scale': { type: 'string', default: '1' },
    ramp: { type: 'string', default: '0' },
    latencies: { type: 'string' },
    interval: { type: 'string' },
    'loop-on-arrival': { type: 'boolean', default: false },
  },
})
const url = new URL(opts.url!)
const CONNECTIONS = Number(opts.connections)
const TOKENS = readFileSync(opts.tokens!, 'utf8').trim().split('\n')
// Multiplies every think time: 1 is the challenge; the harness's own tests use less to finish quickly.
const THINK_SCALE = Number(opts['think-scale'])
const RAMP_S = Number(opts.ramp)
const LOOP_ON_ARRIVAL = opts['loop-on-arrival']

const token = () => TOKENS[Math.floor(Math.random() * TOKENS.length)]
const between = (min: number, max: number) => (min + Math.random() * (max - min)) * 1000 * THINK_SCALE
let created = 0

type User = {
  socket: Socket
  open: boolean
  kind: Kind
  sentAt: number
  buffer: Buffer
  postIds: number[] // from the last feed, as a k6 user opens a post it saw
  answered?: (status: number, body: string) => void
}

const latencies: number[] = []
let window: number[] = [] // the latencies of the current --interval
const errors = { status: 0, body: 0, closed: 0, connect: 0, example: '' }
let sent = 0
let measuring = false
let holding = LOOP_ON_ARRIVAL // the loops run from each arrival, or from the hold's start
let end = Infinity // when the loops stop: the hold's end

function fail(type: 'status' | 'body' | 'closed' | 'connect', example: string) {
  if (!measuring && type !== 'connect') return
  errors[type]++
  errors.example ||= example
}

// Reads one response with a Content-Length (all the server sends), checks it, and times it.
function onData(u: User, chunk: Buffer) {
  u.buffer = u.buffer.length ? Buffer.concat([u.buffer, chunk]) : chunk
  const headerEnd = u.buffer.indexOf('\r\n\r\n')
  if (headerEnd < 0) return
  const head = u.buffer.toString('latin1', 0, headerEnd)
  const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0)
  if (u.buffer.length < headerEnd + 4 + length) return
  const status = Number(head.slice(9, 12))
  const body = u.buffer.toString('utf8', headerEnd + 4, headerEnd + 4 + length)
  u.buffer = u.buffer.subarray(headerEnd + 4 + length)
  const [statuses, prefix] = EXPECT[u.kind]
  if (!statuses.includes(status)) fail('status', `${u.kind}: ${status} ${body.slice(0, 80)}`)
  else if (!body.startsWith(prefix)) fail('body', `${u.kind}: ${body.slice(0, 80)}`)
  else if (measuring) {
    latencies.push(performance.now() - u.sentAt)
    window.push(performance.now() - u.sentAt)
  }
  const answered = u.answered
  u.answered = undefined
  answered?.(status, body)
}

// Sends one request and waits for its answer (or for the connection to close).
function ask(u: User, kind: Kind, postId = 0): Promise<string | undefined> {
  if (!u.open || (measuring && !holding)) return Promise.resolve(undefined)
  u.kind = kind
  u.sentAt = performance.now()
  if (measuring) sent++
  return new Promise((resolve) => {
    u.answered = (status, body) => resolve(status < 300 ? body : undefined)
    u.socket.write(requestBytes(kind, postId, token(), kind === 'create' ? ++created : 0))
  })
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

// One k6 user, looping until the hold ends, from the given step of its loop after the given sleep.
async function loop(u: User, step: number, firstSleep: number) {
  await sleep(firstSleep)
  while (holding && u.open && performance.now() < end) {
    if (step === 0) {
      const feed = await ask(u, 'feed')
      if (feed) u.postIds = [...feed.matchAll(/\{"id":(\d+),"body"/g)].map((m) => Number(m[1]))
      await sleep(between(3, 7))
    } else if (step === 1) {
      const id = u.postIds[Math.floor(Math.random() * u.postIds.length)] ?? 1
      await ask(u, 'post', id)
      await sleep(between(3, 8))
      if (Math.random() < 0.15) await ask(u, 'like', id)
      if (Math.random() < 0.02) await ask(u, 'create')
    } else {
      await sleep(between(5, 15))
    }
    step = (step + 1) % 3
  }
}

const users: User[] = []

// Connects every user and has each ask for the feed once: evenly over --ramp seconds, as k6 ramps its
// users up, or else in batches of 500 (the listen backlog holds that much).
async function connectAll() {
  const started = performance.now()
  const arriving: Promise<void>[] = []
  const batch = RAMP_S > 0 ? Math.max(1, Math.round(CONNECTIONS / (RAMP_S * 20))) : 500
  for (let i = 0; i < CONNECTIONS; i++) {
    if (i % batch === 0 && i > 0) await sleep(50)
    const socket = connect({ host: url.hostname, port: Number(url.port), noDelay: true })
    const u: User = { socket, open: false, kind: 'feed', sentAt: 0, buffer: Buffer.alloc(0), postIds: [] }
    users.push(u)
    socket.on('data', (chunk: Buffer) => onData(u, chunk))
    socket.on('close', () => {
      if (u.open && holding) fail('closed', 'the server closed a connection')
      u.open = false
      u.answered?.(0, '')
    })
    arriving.push(
      new Promise<void>((resolve) => {
        socket.once('connect', () => {
          u.open = true
          ask(u, 'feed').then((feed) => {
            if (feed) u.postIds = [...feed.matchAll(/\{"id":(\d+),"body"/g)].map((m) => Number(m[1]))
            resolve()
            // On with the loop after the feed's think time: the post it opens is next.
            if (LOOP_ON_ARRIVAL) void loop(u, 1, between(3, 7))
          })
        })
        socket.once('error', (err) => {
          if (!u.open) fail('connect', err.message)
          resolve()
        })
      }),
    )
  }
  await Promise.all(arriving)
  return (performance.now() - started) / 1000
}

const percentile = (sorted: number[], p: number) =>
  sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? 0
const print = (event: object) => process.stdout.write(JSON.stringify(event) + '\n')

const connectSeconds = await connectAll()
const open = users.filter((u) => u.open).length
print({ event: 'connected', connections: open, failed: CONNECTIONS - open, seconds: connectSeconds })
await sleep(Number(opts.idle) * 1000)

// Everything sent in the hold is measured; answers still due at its end are waited for.
measuring = holding = true
const cpuBefore = process.cpuUsage()
const started = performance.now()
end = started + Number(opts.hold) * 1000
if (!LOOP_ON_ARRIVAL) for (const u of users) void loop(u, Math.floor(Math.random() * 3), Math.random() * between(3, 15))
const reporter = opts.interval
  ? setInterval(
      () => {
        const sorted = window.sort((a, b) => a - b)
        window = []
        print({
          event: 'interval',
          seconds: (performance.now() - started) / 1000,
          answered: sorted.length,
          errors: { ...errors },
          p50_ms: percentile(sorted, 50),
          p99_ms: percentile(sorted, 99),
        })
      },
      Number(opts.interval) * 1000,
    )
  : undefined
await sleep(Number(opts.hold) * 1000)
clearInterval(reporter)
holding = false
const drainUntil = performance.now() + 5000
while (users.some((u) => u.answered) && performance.now() < drainUntil) await sleep(10)
const elapsed = (performance.now() - started) / 1000
measuring = false
const cpu = process.cpuUsage(cpuBefore)
const unanswered = users.filter((u) => u.answered).length
latencies.sort((a, b) => a - b)
if (opts.latencies) writeFileSync(opts.latencies, JSON.stringify(latencies))
print({
  event: 'done',
  connections: open,
  rate: sent / elapsed,
  sent,
  answered: latencies.length,
  unanswered,
  seconds: elapsed,
  errors,
  p50_ms: percentile(latencies, 50),
  p95_ms: percentile(latencies, 95),
  p99_ms: percentile(latencies, 99),
  max_ms: latencies.at(-1) ?? 0,
  generator_cpu: (cpu.user + cpu.system) / 1e6 / elapsed,
})
for (const u of users) u.socket.destroy()
