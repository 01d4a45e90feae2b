// The memory guard (server/memory.ts) on each of the real servers (test/servers.ts: ours on node:net,
// and node:http), in this process, with memory figures the test sets: what it closes and what it keeps,
// how it answers a connection it does not take, and when it takes connections again.
// test/faults/memory.test.ts runs the built server in a memory cgroup instead.
import assert from 'node:assert/strict'
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import type { AddressInfo } from 'node:net'
import { after, before } from 'node:test'
import type { ApiServer } from '../server/api-server.ts'
import { sleep, until, within } from '../harness/time.ts'
import { smallDatabase } from './helpers.ts'
import { forEachServer, test } from './servers.ts'
import { serverHasRead } from './sockets.ts'

const db = smallDatabase()
process.env.SQLITE_PATH = db.path
const { app, configure, MAX_BODY_BYTES, openDatabase } = await import('../app.ts')
const { createNodeServer } = await import('../server/node-server.ts')
const { createWireServer } = await import('../server/wire.ts')
const { guardMemory, memoryHealth } = await import('../server/memory.ts')
configure({ health: memoryHealth })
openDatabase()
after(() => db.remove())

const MiB = 1024 * 1024

test('a server setup is given once: a second is refused', () => {
  assert.throws(() => configure({}), /configure\(\) is called once/)
})

forEachServer('the memory guard', (HTTP_SERVER) => {
  let used = 0 // of a budget of 1,000 MiB: the guard's lines are at 100 MiB free, 50 and 150
  let stopped = false // then this guard's looks read no figures, and change nothing: the next server's guard has its own
  let api: ApiServer
  let port: number
  const connections = new Set<Socket>()
  before(async () => {
    api =
      HTTP_SERVER === 'node-server'
        ? createNodeServer(app.fetch, MAX_BODY_BYTES)
        : createWireServer(app.fetch, MAX_BODY_BYTES)
    api.server.on('connection', (socket: Socket) => {
      connections.add(socket)
      socket.on('close', () => connections.delete(socket))
    })
    guardMemory(api, connections, () => {
      if (stopped) throw new Error('this server is closed')
      return { budget: 1000 * MiB, used: used * MiB }
    })
    api.server.listen(0, '127.0.0.1')
    await once(api.server, 'listening')
    port = (api.server.address() as AddressInfo).port
  })
  after(() => {
    stopped = true
    api.server.close()
    for (const socket of connections) socket.destroy()
  })

  // A connection, and its first answer.
  async function opened(
    request = 'GET /posts/1 HTTP/1.1\r\nHost: x\r\n\r\n',
    answer = /"post"/,
  ): Promise<Socket & { text: string }> {
    const socket = Object.assign(connect(port, '127.0.0.1'), { text: '' })
    socket
      .setEncoding('utf8')
      .on('data', (chunk) => (socket.text += chunk))
      .on('error', () => {})
    await within(once(socket, 'connect'), 5_000, 'the connection')
    socket.write(request)
    if (request.endsWith('\r\n\r\n')) await until(() => answer.test(socket.text), 5_000, 'an answer')
    return socket
  }

  // Resolves once the socket has closed, if it has not already.
  const whenClosed = (socket: Socket) =>
    socket.closed ? Promise.resolve() : within(once(socket, 'close'), 5_000, 'the server to close the connection')

  test('short of memory: refuses new connections, closes idle ones oldest first, never one under way; then takes them again', async () => {
    const idle: (Socket & { text: string })[] = []
    for (let i = 0; i < 8; i++) idle.push(await opened()) // answered in this order: the first is the least recently used
    // A request whose body is on its way, and one whose headers are.
    const writing = await opened(
      `POST /posts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${await db.tokenFor(1)}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"bo`,
    )
    const asking = await opened('GET /posts/1 HTTP/1.1\r\nHo')
    // One come after their answers that has yet to ask (its request may be in the kernel still): not
    // the least recently used.
    const fresh = await opened('')
    await until(
      () => serverHasRead(writing) && serverHasRead(asking),
      2_000,
      'the server to read the two requests begun',
    )
    assert.ok([...idle, writing, asking, fresh].every((s) => !s.destroyed))

    used = 920 // 80 MiB free: taking no more than it holds
    await until(() => memoryHealth().memory === 'full', 2_000, 'the guard to see it')
    // A connection past capacity is answered, then closed: a request with a 503, /health as usual, and
    // one that asks nothing with the 503 all the same, within a second or two.
    const refused = await opened('GET /posts/1 HTTP/1.1\r\nHost: x\r\n\r\n', /"error"/)
    await whenClosed(refused)
    assert.match(
      refused.text,
      /^HTTP\/1.1 503 [^]*\r\nretry-after: 1\r\n[^]*\r\n\r\n\{"error":"server at capacity"\}$/i,
    )
    const probe = await opened('GET /health HTTP/1.1\r\nHost: x\r\n\r\n', /"status"/)
    await whenClosed(probe)
    assert.match(probe.text, /^HTTP\/1.1 200 [^]*"memory":"full"/)
    const silent = await opened('')
    await whenClosed(silent)
    assert.match(silent.text, /^HTTP\/1.1 503 /)
    assert.equal(memoryHealth().memory, 'full')

    used = 960 // 40 MiB free: closing idle connections, 5% of those held at each look (one of ten here)
    await until(() => idle.filter((s) => s.destroyed).length >= 3, 3_000, 'three idle connections closed')
    used = 920
    // Two of the guard's looks (every 250 ms) at 920, so that what it closed is all it closes: a look
    // that closes nothing leaves nothing to wait for.
    await sleep(600)
    const closed = idle.map((s) => s.destroyed)
    const count = closed.filter(Boolean).length
    assert.deepEqual(
      closed,
      idle.map((_, i) => i < count),
      'the least recently used first',
    )
    assert.ok(!writing.destroyed && !asking.destroyed, 'never one with a request on its way')
    assert.ok(!fresh.destroyed, 'not one come after the idle ones answered, before them')
    assert.equal(memoryHealth().memory, 'full')

    // One that closes makes room for one.
    idle.at(-1)!.destroy()
    fresh.destroy()
    await until(() => connections.size === 9 - count, 2_000, 'the close to be seen')
    const room = await opened()
    assert.match(room.text, /^HTTP\/1.1 200 /)

    used = 800 // 200 MiB free: taking new connections again
    await until(() => memoryHealth().memory === undefined, 2_000, 'the guard to take connections again')
    const more = await Promise.all(Array.from({ length: 5 }, () => opened()))
    assert.ok(more.every((s) => /^HTTP\/1.1 200 /.test(s.text)))
    for (const socket of [...idle, writing, asking, fresh, room, ...more]) socket.destroy()
  })
})
