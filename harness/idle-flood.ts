// A load program that test/faults/memory.test.ts and bench/memory.ts both run: idle keep-alive
// connections, from a process of their own (a process here has 20,000 files at most):
// each connects, asks for `GET /posts/1` once, reads the answer, then stays open and says nothing.
//
//   node harness/idle-flood.ts --port 3000 --host 127.0.0.2 --connections 15000 [--rate 400]
//
// Opens them 500 at a time, or at most `rate` a second, then prints {"event":"opened", answered,
// refused, closed, failed, wrong}: each connection answered 200, answered 503 (the server at capacity)
// and closed, closed by the server without an answer, not connected at all, or answered anything else.
// Then waits for a line on stdin, counts the answered ones the server has closed since (`shed`), closes
// the rest, prints {"event":"done", shed} and exits.
import { connect } from 'node:net'
import { createInterface } from 'node:readline'
import { parseArgs } from 'node:util'

const { values: opts } = parseArgs({
  options: {
    port: { type: 'string' },
    host: { type: 'string', default: '127.0.0.1' },
    connections: { type: 'string', default: '1000' },
    rate: { type: 'string', default: 'Infinity' },
  },
})
const print = (event: object) => process.stdout.write(JSON.stringify(event) + '\n')
type Outcome = 'answered' | 'refused' | 'closed' | 'failed' | 'wrong'

const open = (): Promise<{ outcome: Outcome; closed: () => boolean; close: () => void }> =>
  new Promise((resolve) => {
    const socket = connect(Number(opts.port), opts.host)
    let answer = ''
    let connected = false
    let closed = false
    const done = (outcome: Outcome) => resolve({ outcome, closed: () => closed, close: () => socket.destroy() })
    socket.setEncoding('latin1')
    socket.on('connect', () => {
      connected = true
      socket.write('GET /posts/1 HTTP/1.1\r\nHost: flood\r\n\r\n')
    })
    socket.on('data', (chunk) => {
      answer += chunk
      const end = answer.indexOf('\r\n\r\n')
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(answer)?.[1])
      if (end < 0 || answer.length < end + 4 + length) return
      if (answer.startsWith('HTTP/1.1 200 ') && answer.includes('{"post":')) done('answered')
      else
        done(
          answer.startsWith('HTTP/1.1 503 ') && answer.endsWith('{"error":"server at capacity"}') ? 'refused' : 'wrong',
        )
    })
    socket.on('error', () => {})
    socket.on('close', () => {
      closed = true
      done(connected ? 'closed' : 'failed')
    })
    // Every connection has an outcome in time: one still waiting is as wrong as a wrong answer.
    setTimeout(() => done('wrong'), 30_000).unref()
  })

const total = Number(opts.connections)
const connections: Awaited<ReturnType<typeof open>>[] = []
const rate = Number(opts.rate)
const batch = Math.min(500, Math.ceil(rate / 10))
const started = performance.now()
for (let i = 0; i < total; i += batch) {
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, started + (i / rate) * 1000 - performance.now())))
  connections.push(...(await Promise.all(Array.from({ length: Math.min(batch, total - i) }, open))))
}
const count = (outcome: Outcome) => connections.filter((c) => c.outcome === outcome).length
print({
  event: 'opened',
  answered: count('answered'),
  refused: count('refused'),
  closed: count('closed'),
  failed: count('failed'),
  wrong: count('wrong'),
})

createInterface({ input: process.stdin }).once('line', () => {
  const shed = connections.filter((c) => c.outcome === 'answered' && c.closed()).length
  for (const c of connections) c.close()
  print({ event: 'done', shed })
  process.exit(0)
})
