// The attackers of slowloris.test.ts, in a process of their own so their work does not distort the
// latencies the test measures. Opens SLOW connections that send half a request and then a header byte
// a second, and SILENT ones that send nothing; prints one JSON line when all are closed (or at 25 s).
import { connect, type Socket } from 'node:net'

const [port, slow, silent] = process.argv.slice(2).map(Number)
const started = performance.now()
const attackers: { socket: Socket; closedAt?: number; answer: string; slow: boolean }[] = []

for (let i = 0; i < slow + silent; i++) {
  const socket = connect(port, '127.0.0.1')
  const attacker = { socket, closedAt: undefined as number | undefined, answer: '', slow: i < slow }
  socket.on('data', (chunk) => (attacker.answer += chunk))
  socket.on('close', () => (attacker.closedAt = (performance.now() - started) / 1000))
  socket.on('error', () => {})
  if (attacker.slow) socket.write('GET /feed HTTP/1.1\r\nHost: slow\r\nX-Slow: ')
  attackers.push(attacker)
  if (i % 200 === 199) await new Promise((resolve) => setTimeout(resolve, 20))
}
process.stdout.write(JSON.stringify({ event: 'open' }) + '\n')

const drip = setInterval(() => {
  for (const a of attackers) if (a.slow && !a.closedAt) a.socket.write('a')
}, 1_000)
while (attackers.some((a) => !a.closedAt) && performance.now() - started < 25_000)
  await new Promise((resolve) => setTimeout(resolve, 200))
clearInterval(drip)

const closed = attackers.filter((a) => a.closedAt)
process.stdout.write(
  JSON.stringify({
    event: 'done',
    open: attackers.length - closed.length,
    lastClosedAt: Math.max(0, ...closed.map((a) => a.closedAt!)),
    slowTold408: attackers.filter(
      (a) => a.slow && /^HTTP\/1\.1 408 /.test(a.answer) && a.answer.endsWith('{"error":"request timed out"}'),
    ).length,
  }) + '\n',
)
for (const a of attackers) a.socket.destroy()
