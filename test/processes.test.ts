// More connections than one process has files for (server/processes.ts): the built server, with no setting, takes
// them all in as many processes as its open-file limit needs, and in one where one is enough; on each of
// its HTTP servers (test/servers.ts).
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync, writeFileSync } from 'node:fs'
import { connect, type Socket } from 'node:net'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { after, before, describe } from 'node:test'
import { isRunning, processTree } from '../harness/proc.ts'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { until, within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { forEachServer, type HttpServer, test } from './servers.ts'

let db: ReturnType<typeof freshSeededCopy>
let tokens: string
before(() => {
  db = freshSeededCopy()
  tokens = join(db.dir, 'tokens.txt')
  writeFileSync(tokens, db.tokens.map((t) => t.token).join('\n'))
})
after(() => db.remove())

const start = (limit: number, HTTP_SERVER: HttpServer) =>
  startServer('prlimit', [`--nofile=${limit}`, process.execPath, 'dist/app.js'], {
    env: { SQLITE_PATH: db.path, HTTP_SERVER },
  })

// bench/users.ts: every user one keep-alive connection, all connecting at once (harder than k6's ramp),
// then the challenge's loop at 20 times its pace, every answer checked. Meanwhile the server's processes
// are looked at every 250 ms: the most seen at once come back (one look at 3 s came too early, once,
// on a machine loaded by other tests).
// bench/users.ts is run as a program, by its path, not imported: test/ imports nothing of bench/.
async function users(url: string, connections: number, serverPid: number) {
  const run = promisify(execFile)(
    process.execPath,
    [
      join(ROOT, 'bench', 'users.ts'),
      '--url',
      url,
      '--connections',
      String(connections),
      '--think-scale',
      '0.05',
      '--idle',
      '2',
      '--hold',
      '5',
      '--tokens',
      tokens,
    ],
    { encoding: 'utf8', timeout: 60_000 },
  )
  let processes: number[] = []
  const look = setInterval(() => {
    const now = processTree(serverPid)
    if (now.length > processes.length) processes = now
  }, 250)
  try {
    const lines = (await run).stdout
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line))
    return { connected: lines.find((l) => l.event === 'connected'), done: lines.at(-1), processes }
  } finally {
    clearInterval(look)
  }
}

// Connections that each had one answer and stay open. Those past a full process wait in the kernel's
// queue for the next to start, which took over 10 s once with another test file loading the machine.
async function openConnections(port: number, count: number): Promise<Socket[]> {
  return Promise.all(
    Array.from({ length: count }, async () => {
      const socket = connect(port, '127.0.0.1').on('error', () => {}) // those of a process killed: reset
      await within(once(socket, 'connect'), 30_000, 'a connection accepted')
      socket.write('GET /posts/1 HTTP/1.1\r\nHost: x\r\n\r\n')
      const [answer] = await within(once(socket, 'data'), 30_000, 'the answer on a new connection')
      assert.match(String(answer), /^HTTP\/1.1 200 OK/)
      return socket
    }),
  )
}

// The first process's connections that are still open (at least 900 of them), and the new ones: 50 of
// each still answer. The last of the new ones may wait in the kernel's queue for a helper that is
// still starting, which can take seconds while the whole suite loads both cores (seen once: no
// answer within 10 s).
async function stillServe(kept: Socket[], more: Socket[]) {
  const survivors = kept.filter((socket) => !socket.destroyed)
  assert.ok(survivors.length >= 900, `${survivors.length} of the first process's connections still open`)
  for (const socket of [...survivors.slice(0, 50), ...more.slice(-50)]) {
    socket.write('GET /posts/2 HTTP/1.1\r\nHost: x\r\n\r\n')
    const [answer] = await within(once(socket, 'data'), 30_000, 'the answer on a connection kept open')
    assert.match(String(answer), /^HTTP\/1.1 200 OK/)
  }
  for (const socket of [...kept, ...more]) socket.destroy()
}

forEachServer('more connections than one process has files for', (HTTP_SERVER) => {
  describe('under an open-file limit of 1,024', () => {
    let server: Server
    before(async () => (server = await start(1024, HTTP_SERVER)))
    after(() => server.stop('SIGKILL'))

    test('3,000 users at once: none refused, no errors, in several processes; SIGTERM stops them all, exit 0', async () => {
      const { connected, done, processes } = await users(server.url, 3000, server.child.pid!)
      assert.equal(connected.failed, 0, 'every user connected and had its first answer')
      assert.deepEqual(done.errors, { status: 0, body: 0, closed: 0, connect: 0, example: '' })
      assert.equal(done.unanswered, 0)
      assert.ok(done.answered > 3000, `${done.answered} answers`)
      // 3,000 connections over about 930 a process, and the next one started.
      assert.ok(processes.length >= 4, `${processes.length} processes`)
      assert.match(
        server.output(),
        /process \d+ is full \(\d+ connections, 1024 open files at most\): the next takes new ones/,
      )
      assert.equal(await within(server.stop('SIGTERM'), 30_000, 'the first process to exit on SIGTERM'), 0)
      await until(() => !processes.some(isRunning), 15_000, 'every process to exit')
      server = await start(1024, HTTP_SERVER)
    })

    // 1,500: the first full (about 930 connections), a helper with the rest, and its successor started
    // as soon as it accepted.
    const withHelpers = async () => {
      await server.stop('SIGKILL')
      server = await start(1024, HTTP_SERVER)
      const port = Number(new URL(server.url).port)
      const kept = await openConnections(port, 1500)
      // Its line comes down the pipe, which this process may read after the answers it gave.
      const takes = /process (\d+) takes new connections/
      await until(() => takes.test(server.output()), 10_000, 'a helper to say it takes new connections')
      const taking = Number(takes.exec(server.output())![1])
      await until(() => processTree(server.child.pid!).length === 3, 10_000, 'the successor to start')
      const successor = processTree(server.child.pid!).find((pid) => pid !== server.child.pid && pid !== taking)!
      return { port, kept, taking, successor }
    }

    test('the process taking new connections dies with 1500 open: its successor takes new ones; every other connection stays', async () => {
      const { port, kept, taking, successor } = await withHelpers()
      process.kill(taking, 'SIGKILL')
      await until(
        () => server.output().includes(`process ${taking} exited (SIGKILL), and its connections with it`),
        10_000,
        'the first to see it',
      )
      await until(
        () => server.output().includes(`process ${successor} takes new connections`),
        10_000,
        'the successor to take new connections',
      )
      await stillServe(kept, await openConnections(port, 1000))
      assert.equal(server.output().split('listening on').length, 2, 'the socket stayed: the first did not listen again')
    })

    // With no successor after it, its socket goes with it: the first listens again, on the same port.
    test('the process taking new connections dies after its successor did: the first listens again; every other connection stays', async () => {
      const { port, kept, taking, successor } = await withHelpers()
      process.kill(successor, 'SIGKILL')
      await until(
        () => server.output().includes(`process ${successor} exited (SIGKILL)`),
        10_000,
        'the first to see the successor die',
      )
      process.kill(taking, 'SIGKILL')
      await until(() => server.output().split('listening on').length === 3, 10_000, 'the first to listen again')
      assert.ok(isRunning(server.child.pid!), `the first process is alive:\n${server.output()}`)
      await stillServe(kept, await openConnections(port, 100))
    })
  })

  describe('under a high limit', () => {
    test('3,000 users in one process', async () => {
      const server = await start(20_000, HTTP_SERVER)
      try {
        const { connected, done, processes } = await users(server.url, 3000, server.child.pid!)
        assert.equal(connected.failed, 0)
        assert.deepEqual(done.errors, { status: 0, body: 0, closed: 0, connect: 0, example: '' })
        assert.deepEqual(processes, [server.child.pid])
        assert.doesNotMatch(server.output(), /is full|takes new connections/)
      } finally {
        await within(server.stop(), 30_000, 'the server to exit on SIGTERM')
      }
    })
  })
})

// npm start and the image run dist/start.js, which seeds if it must and then serves in its own
// process: the processes it adds run the server (dist/app.js), never start.js again, seed step and all.
// Which script a process runs is start.js's choice, whatever serves HTTP in it: on the default server
// alone (the HTTP servers past the open-file limit are the suite above's).
describe('more connections than one process has files for, under npm start (dist/start.js)', () => {
  const script = (pid: number) =>
    readFileSync(`/proc/${pid}/cmdline`, 'utf8')
      .split('\0')
      .find((arg) => arg.endsWith('.js'))
  const seedLines = (output: string) => output.split('\n').filter((line) => line.startsWith('seed: '))

  test('past the open-file limit, every helper runs dist/app.js, and the seed step runs once', async () => {
    const server = await startServer('prlimit', ['--nofile=256', process.execPath, 'dist/start.js'], {
      env: { SQLITE_PATH: db.path },
    })
    try {
      // What the processes said, with a connection that failed: why, if they know.
      const sockets = await openConnections(Number(new URL(server.url).port), 600).catch((error) =>
        assert.fail(`${error.message}\n${server.output()}`),
      )
      const [first, ...helpers] = processTree(server.child.pid!)
      assert.ok(helpers.length >= 2, `${helpers.length} helpers for 600 connections`)
      assert.equal(script(first), 'dist/start.js')
      for (const helper of helpers) assert.match(script(helper) ?? '', /\/dist\/app\.js$/)
      assert.deepEqual(seedLines(server.output()), [`seed: ${db.path} exists, serving it as it is`])
      for (const socket of sockets) socket.destroy()
      assert.equal(await within(server.stop('SIGTERM'), 30_000, 'the server to exit on SIGTERM'), 0)
    } finally {
      server.child.kill('SIGKILL')
    }
  })

  test('WORKERS=2: both workers run dist/app.js and answer; the seed step runs once', async () => {
    const server = await startServer(process.execPath, ['dist/start.js'], {
      env: { SQLITE_PATH: db.path, WORKERS: '2' },
    })
    try {
      await until(() => server.output().split('listening on').length === 3, 10_000, 'both workers to listen')
      const [primary, ...workers] = processTree(server.child.pid!)
      assert.equal(script(primary), 'dist/start.js')
      assert.equal(workers.length, 2)
      for (const worker of workers) assert.match(script(worker) ?? '', /\/dist\/app\.js$/)
      assert.deepEqual(seedLines(server.output()), [`seed: ${db.path} exists, serving it as it is`])
      assert.equal((await fetch(`${server.url}/posts/1`)).status, 200)
      assert.equal(await within(server.stop('SIGTERM'), 30_000, 'the server to exit on SIGTERM'), 0)
    } finally {
      server.child.kill('SIGKILL')
    }
  })
})
