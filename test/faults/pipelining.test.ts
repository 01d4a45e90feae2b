// Requests that keep coming while their answers are never read, beside the challenge's users: the
// attack of test/hostile.test.ts at its full size during a users hold, what memory does after it, and
// connections that send one request each and never read. Slower than npm test's: holds of 20 s (the
// attack, one burst, is then well under 1% of the requests), and a wait for the 65 s keep-alive
// timeout, which runs beside the holds, on a server of its own.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { memoryKb } from '../../harness/proc.ts'
import { freshSeededCopy } from '../../harness/seed.ts'
import { type Server, shippedNodeFlags, startServer } from '../../harness/server.ts'
import { sleep, until, within } from '../../harness/time.ts'
import { ROOT } from '../../harness/tools.ts'
import { pipeliningAttacker, probeHealth } from '../helpers.ts'
import { heldOn } from '../sockets.ts'

const HOLD_S = 20
const rssMb = (server: Server) => memoryKb(server.child.pid!, 'VmRSS') / 1024

// A server with the image's flags on a fresh copy of the seed: started before the describe's tests,
// stopped after them.
function aServer() {
  const db = freshSeededCopy()
  const started = { db, server: undefined as unknown as Server, port: 0 }
  before(async () => {
    started.server = await startServer(process.execPath, [...shippedNodeFlags(), 'dist/app.js'], {
      env: { SQLITE_PATH: db.path },
    })
    started.port = Number(new URL(started.server.url).port)
  })
  after(async () => {
    if (started.server) await within(started.server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
  })
  return started
}

type Hold = {
  sent: number
  answered: number
  unanswered: number
  errors: Record<string, number | string>
  p99_ms: number
  max_ms: number
}

// 2,000 users of bench/users.ts running the k6 loop at twice its pace (about 420 requests a second)
// for HOLD_S seconds, after a second's idle: `connected` once every user has had its first answer (or
// the generator has exited, and `done` says why); `done` with its results, or rejected when they are
// 30 s late. It is run as a program, by its path, not imported: test/ imports nothing of bench/.
function holdUsers(server: Server, tokens: string): { connected: Promise<void>; done: Promise<Hold> } {
  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'bench', 'users.ts'),
      '--url',
      server.url,
      '--connections',
      '2000',
      '--think-scale',
      '0.5',
      '--idle',
      '1',
      '--hold',
      String(HOLD_S),
      '--tokens',
      tokens,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  )
  let output = ''
  let markConnected = () => {}
  const connected = new Promise<void>((resolve) => (markConnected = resolve))
  child.stdout.on('data', (chunk) => {
    output += chunk
    if (output.includes('"event":"connected"')) markConnected()
  })
  const timer = setTimeout(() => child.kill('SIGKILL'), (HOLD_S + 30) * 1000)
  const done = once(child, 'exit').then(([code]) => {
    markConnected()
    clearTimeout(timer)
    const results = output
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line))
      .find((e) => e.event === 'done')
    if (!results) throw new Error(`the users generator exited with ${code}: ${output}`)
    return results as Hold
  })
  return { connected, done }
}

const errorCount = (hold: Hold) =>
  Number(hold.errors.status) +
  Number(hold.errors.body) +
  Number(hold.errors.closed) +
  Number(hold.errors.connect) +
  hold.unanswered

// Side by side, on a server each: the second test mostly waits for the keep-alive timeout.
describe('pipelined and unread answers', { concurrency: true }, () => {
  const underAttack = aServer()
  const idle = aServer()

  test('beside the pipelining attack, the users see no errors and a p99 within 50 ms of a hold without it; memory is back 10 s after', async (t) => {
    const { server, port, db } = underAttack
    const tokens = join(db.dir, 'tokens.txt')
    writeFileSync(tokens, db.tokens.map((token) => token.token).join('\n') + '\n')
    // The same hold without the attack first.
    const quiet = await holdUsers(server, tokens).done
    const rest = rssMb(server)
    let peak = rest
    const sampler = setInterval(() => (peak = Math.max(peak, rssMb(server))), 20)
    const attacker = await pipeliningAttacker(port, { connections: 200, depth: 2_000, seconds: 3 })
    const attacked = holdUsers(server, tokens)
    await within(attacked.connected, 60_000, 'the users to connect')
    // Past the second's idle and 2 s into the hold: where in the hold the attack lands is a time.
    await sleep(3_000)
    const health = probeHealth(port)
    const attack = await attacker.go()
    const probes = await health.stop()
    const endedAt = performance.now()
    const hold = await attacked.done
    clearInterval(sampler)
    // Memory 10 s after the attack is what is measured: the wait is the thing tested.
    await sleep(Math.max(0, 10_000 - (performance.now() - endedAt)))
    const after10s = rssMb(server)

    // The attack's burst costs the users a few ms (p99 4 to 10 ms against 2 to 4 without it, seen
    // here), more on a busy machine; without the bound it cost them seconds (p99 3,472 ms, /health
    // 2 s, 1.5 GB held). A margin of 50 ms tells the two apart on any day, where three times the
    // difference of two quiet holds failed a run on drift alone. One quiet hold is the comparison:
    // a second one only widened the bound by its own drift, and cost 20 s of every run.
    const bound = quiet.p99_ms + 50
    t.diagnostic(
      `p99 without the attack ${quiet.p99_ms.toFixed(2)} ms, with it ${hold.p99_ms.toFixed(2)} ms (bound ${bound.toFixed(2)}); ` +
        `${hold.sent} requests, max ${hold.max_ms.toFixed(1)} ms`,
    )
    t.diagnostic(
      `RSS ${rest.toFixed(0)} MB at rest, ${peak.toFixed(0)} MB at peak, ${after10s.toFixed(0)} MB 10 s after the attack; ` +
        `/health: ${probes.latencies.length} probes during the attack, the slowest ${probes.max.toFixed(1)} ms`,
    )
    assert.equal(errorCount(quiet), 0, `errors without the attack: ${JSON.stringify(quiet.errors)}`)
    assert.equal(attack.open, 0, `${attack.open} attacking connections still open`)
    assert.equal(
      errorCount(hold),
      0,
      `errors beside the attack: ${JSON.stringify(hold.errors)}, ${hold.unanswered} unanswered`,
    )
    assert.ok(hold.p99_ms <= bound, `p99 ${hold.p99_ms.toFixed(2)} ms beside the attack`)
    assert.ok(peak - rest < 100, `RSS grew ${(peak - rest).toFixed(0)} MB`)
    assert.ok(
      after10s - rest < 100,
      `RSS ${after10s.toFixed(0)} MB 10 s after the attack, ${rest.toFixed(0)} MB before`,
    )
    assert.deepEqual(probes.failures, [])
    assert.ok(probes.max < 500, `/health took ${probes.max.toFixed(0)} ms`) // the challenge's p95 line; bounded, 101 ms at worst here
  })

  // Each answer fits in the kernel's buffers, so the server holds such a connection as it holds an idle
  // one (the open-file limit bounds how many), until the 65 s keep-alive timeout closes it.
  test('connections that send one request each and never read cost what readers cost, and the keep-alive timeout closes them', async (t) => {
    const { server, port } = idle
    const COUNT = 2_000
    const open = async (read: boolean) => {
      const rest = rssMb(server)
      const sockets = await Promise.all(
        Array.from({ length: COUNT }, async () => {
          const socket = connect(port, '127.0.0.1').on('error', () => {})
          await within(once(socket, 'connect'), 30_000, 'a connection accepted')
          if (read) socket.on('data', () => {})
          else socket.pause()
          socket.write('GET /feed HTTP/1.1\r\nHost: test\r\n\r\n')
          return socket
        }),
      )
      // The memory they cost is read once it has settled, which no event marks.
      await sleep(2_000)
      return { sockets, kb: ((rssMb(server) - rest) * 1024) / COUNT }
    }
    const readers = await open(true)
    for (const s of readers.sockets) s.destroy()
    await until(() => heldOn(port) === 0, 10_000, 'the server to close the connections the readers closed')
    const silent = await open(false)
    const openedAt = performance.now()
    const closed = (s: Socket) => s.destroyed || s.readyState === 'closed'
    for (const s of silent.sockets) s.resume().on('data', () => {}) // to see the server's close
    while (!silent.sockets.every(closed) && performance.now() - openedAt < 75_000) await sleep(500)
    const seconds = (performance.now() - openedAt) / 1000
    t.diagnostic(
      `RSS per connection: ${readers.kb.toFixed(1)} KB reading, ${silent.kb.toFixed(1)} KB never reading; all closed after ${seconds.toFixed(1)} s`,
    )
    assert.ok(
      silent.kb < readers.kb + 5,
      `${silent.kb.toFixed(1)} KB a connection that never reads, ${readers.kb.toFixed(1)} KB one that does`,
    )
    assert.ok(silent.sockets.every(closed), `${silent.sockets.filter((s) => !closed(s)).length} still open after 75 s`)
  })
})
