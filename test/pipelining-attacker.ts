// The attackers of the pipelining tests, in a process of their own so that their work does not distort
// what the tests measure: connections that send requests and never read an answer.
//
//   node test/pipelining-attacker.ts --port 3000 --connections 200 --depth 2000
//     pipelined: each connection sends --depth `GET /feed` at once (2,000 are 62 KB), then nothing
//   node test/pipelining-attacker.ts --port 3000 --connections 200 --every 2 --seconds 5
//     trickle: each connection sends one more every --every ms for --seconds, as a reader too slow to
//     take one feed before it asks for the next (the --depth first, 1 by default)
//
// Connects every connection, prints {"event":"connected"} and waits for a line on stdin (for 120 s at
// most: a test that failed before its go would otherwise wait on this process for ever); then sends,
// and after --seconds reads whatever each connection still holds and prints {"event":"done","open":n,...}:
// n connections that the server had not closed.
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import { parseArgs } from 'node:util'
import { holdsWithin, sleep, within } from '../harness/time.ts'

const { values: opts } = parseArgs({
  options: {
    port: { type: 'string' },
    connections: { type: 'string', default: '200' },
    depth: { type: 'string', default: '1' },
    every: { type: 'string' },
    seconds: { type: 'string', default: '3' },
  },
})
const REQUEST = 'GET /feed HTTP/1.1\r\nHost: attacker\r\n\r\n'
const burst = Buffer.from(REQUEST.repeat(Number(opts.depth)))
const print = (event: object) => process.stdout.write(JSON.stringify(event) + '\n')

type Attacker = { socket: Socket; sent: number; closed: boolean }
const attackers: Attacker[] = await Promise.all(
  Array.from({ length: Number(opts.connections) }, async () => {
    const socket = connect(Number(opts.port), '127.0.0.1')
    const attacker = { socket, sent: 0, closed: false }
    socket.on('error', () => {})
    socket.on('close', () => (attacker.closed = true))
    await once(socket, 'connect')
    socket.pause() // never read: the answers stay in the kernel's buffers, then in the server's
    return attacker
  }),
)
print({ event: 'connected' })
await within(once(process.stdin, 'data'), 120_000, "the test's go")
for (const a of attackers) {
  a.socket.write(burst)
  a.sent += Number(opts.depth)
}

// A tick that comes late (this process is niced, and the machine may be busy) sends every request due
// by then: the attack is as big as its schedule, however little CPU it gets.
const started = performance.now()
const trickle = opts.every
  ? setInterval(() => {
      const due = Number(opts.depth) + Math.floor((performance.now() - started) / Number(opts.every))
      for (const a of attackers) {
        if (a.socket.writable && a.sent < due) {
          a.socket.write(REQUEST.repeat(due - a.sent))
          a.sent = due
        }
      }
    }, Number(opts.every))
  : undefined
await sleep(Number(opts.seconds) * 1000) // how long the attack lasts
clearInterval(trickle)

// A paused socket does not see the server's close: read now, and give each a moment to see it.
for (const a of attackers) a.socket.resume().on('data', () => {})
await holdsWithin(() => attackers.every((a) => a.closed), 2_000)
print({
  event: 'done',
  connections: attackers.length,
  open: attackers.filter((a) => !a.closed).length,
  requests: attackers.reduce((sum, a) => sum + a.sent, 0),
})
for (const a of attackers) a.socket.destroy()
