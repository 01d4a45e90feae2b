// How many processes serve, and how each listens and exits. Every connection is an open file, and a
// process may have only so many: 65,535 under the challenge's systemd, 20,000 on our test machines. One
// process serves a request for the least CPU, so the first serves alone while it has room. Nearly full,
// it starts a helper: the server again, with database connections of its own, born with a copy of the
// listening socket. Full, it stops accepting and the helper accepts from the same socket: the kernel
// queues what arrives between the two and refuses nothing. The first process does this for every helper
// in turn, and starts each helper's successor as soon as that helper accepts. A connection stays where it was taken; a helper that no longer accepts exits with its last
// connection. WORKERS=N fixes the number of processes instead (README, "Configuration").
import { fork, type ChildProcess } from 'node:child_process'
import cluster from 'node:cluster'
import { once } from 'node:events'
import { readdirSync, readFileSync } from 'node:fs'
import { createServer as createNetServer, Server as NetServer, type AddressInfo, type Server, type Socket } from 'node:net'
import { closeDatabase, HOST, PORT } from '../app.ts'
import type { ApiServer } from './api-server.ts'
import { takingConnections } from './memory.ts'

// A fixed number of processes sharing the port, each with its own database connections.
export const WORKERS = Number(process.env.WORKERS || 0)
// Set in a helper's environment by the first process, which started it.
const HELPER_OF = 'HELPER_OF'
const isHelper = process.env[HELPER_OF] !== undefined
// Under WORKERS=N, the first process only starts and replaces the workers.
export const supervisesWorkers = WORKERS > 1 && cluster.isPrimary
// The process that speaks for the service in the log: the first, or the first of the WORKERS.
export const speaksForAll = !isHelper && (cluster.isPrimary || cluster.worker?.id === 1)

const FILE_LIMIT = openFileLimit()
// Files of a process that are not its connections (the database, its WAL, the event loop, a follower's
// forwarded writes), and connections accepted until its listener is closed.
const SPARE_FILES = Math.max(64, Math.floor(FILE_LIMIT / 16))
// Nearly full: the room a helper's start (about 0.3 s) needs at the challenge's fastest arrivals, 1,700
// connections a second, many times over: 2,300 under a limit of 20,000 and 7,700 under 65,535.
const NEARLY_FULL = 7 / 8
const SOCKET_FD = 4 // where a helper has its copy: after stdin, stdout, stderr and the IPC channel
type Order = 'ready' | 'nearly full' | 'full' | 'copy' | 'successor' | 'stop' | 'accept'

// Every process that serves: its connections, and whether it takes new ones.
export const connections = new Set<Socket>()
let capacity = Infinity // connections it takes before it stops accepting
let accepting: Server | undefined
let saidNearlyFull = false
let saidFull = false
let succeeded = false // another process holds a copy of the socket it accepts from
let steppedOut = false // it accepted, and no longer does
let stopping = false // SIGTERM: draining, then exiting
let drained = false // every connection of its own closed

let served: ApiServer // this process's server
let entry = '' // the server's script, which helpers run

// Serves `api` from this process until SIGTERM or SIGINT, with helpers running `serverEntry` as the
// connections need them; then drains, closes the database and exits 0.
export function serveInProcesses(api: ApiServer, serverEntry: string) {
  served = api
  entry = serverEntry
  const server = api.server
  server.on('connection', counted)
  if (isHelper) takeOrders(server)
  else listenOnPort(server)
  process.on('SIGTERM', stop).on('SIGINT', stop)
  if (isHelper) process.on('disconnect', stop) // the first process is gone: nobody would start the next
}

function stop() {
  if (stopping) return // a second signal changes nothing: the drain is under way, bounded at 10 s
  stopping = true
  for (const helper of helpers) helper.kill('SIGTERM')
  served.drain(() => {
    drained = true
    exitWhenDone()
  })
}

// A process exits once its own connections and every helper it started are gone.
function exitWhenDone() {
  if (!drained || helpers.size > 0) return
  closeDatabase()
  process.exit(0)
}

// The first process listens on PORT. WORKERS workers each listen on a socket of their own, and the
// kernel spreads new connections over them.
let boundPort = PORT // once listening, the port it got (PORT=0), to listen again on the same
function listenOnPort(server: Server) {
  server.listen({ host: HOST, port: boundPort, reusePort: WORKERS > 1, exclusive: true }, () => {
    const { address, port } = server.address() as AddressInfo
    boundPort = port
    console.log(`listening on http://${address}:${port}`)
    accepting = server
    if (!WORKERS) capacity = FILE_LIMIT - filesOpen() - SPARE_FILES
  })
}

function counted(socket: Socket) {
  connections.add(socket)
  socket.on('close', uncounted)
  if (!accepting) return
  if (connections.size >= capacity * NEARLY_FULL && !saidNearlyFull) {
    saidNearlyFull = true
    tellFirst('nearly full')
  }
  if (connections.size >= capacity && !saidFull) {
    saidFull = true
    tellFirst('full')
    // With the socket held by its successor, it stops at once: a burst queued in the kernel would
    // otherwise be accepted past the file limit while the first process answers, and reset.
    if (isHelper && succeeded) stopAccepting()
  }
}

function uncounted(this: Socket) {
  connections.delete(this)
  if (isHelper && steppedOut && connections.size === 0) stop()
}

// Only the listener closes: node:http's close() would also close the idle connections.
function stopAccepting() {
  if (!accepting) return
  steppedOut = true
  saidNearlyFull = saidFull = succeeded = false
  NetServer.prototype.close.call(accepting!)
  accepting = undefined
  console.log(`process ${process.pid} is full (${connections.size} connections, ${FILE_LIMIT} open files at most): the next takes new ones`)
}

// A helper tells the first process over IPC; the first tells itself.
function tellFirst(what: Order) {
  if (isHelper) process.send!(what)
  else if (what === 'nearly full') prepareNext(undefined)
  else if (what === 'full') moveOn(undefined)
}

// In the first process: the helpers, the one accepting (undefined: the first itself) and the one to
// accept next.
const helpers = new Set<ChildProcess>()
const ready = new Set<ChildProcess>()
let acceptor: ChildProcess | undefined
let nextHelper: ChildProcess | undefined
let copyAsked = false
let fullWaiting = false // the one accepting is full, and the next is not started yet

function prepareNext(from: ChildProcess | undefined) {
  // Short of memory, no process is started: it would cost more memory, for connections refused anyway.
  if (nextHelper || copyAsked || stopping || !takingConnections()) return
  if (!from) nextHelper = startHelper(accepting!)
  else {
    copyAsked = true
    from.send('copy') // it answers with its listening server
  }
}

function moveOn(from: ChildProcess | undefined) {
  prepareNext(from)
  fullWaiting = !nextHelper
  if (!nextHelper) return
  if (from) from.send('stop')
  else stopAccepting()
  promoteNext()
}

function promoteNext() {
  acceptor = nextHelper!
  nextHelper = undefined
  if (ready.has(acceptor)) acceptor.send('accept')
}

// node:net has no public way to a listening socket's file descriptor; its handle has it.
type Listener = NetServer & { _handle: { fd: number } }

// A helper runs the server's entry (dist/app.js), never the script that started this process: under
// `npm start` that is the supervisor, dist/start.js, which would seed again.
function startHelper(copy: NetServer): ChildProcess {
  const helper = fork(entry, [], {
    env: { ...process.env, [HELPER_OF]: String(process.pid) },
    stdio: ['inherit', 'inherit', 'inherit', 'ipc', { fd: (copy as Listener)._handle.fd } as never],
  })
  helpers.add(helper)
  helper.on('message', (message: Order, server?: NetServer) => {
    if (message === 'ready') {
      ready.add(helper)
      if (helper === acceptor) helper.send('accept')
    } else if (message === 'copy' && server) {
      copyAsked = false
      nextHelper = startHelper(server)
      server.close() // the new helper has its own copy now
      helper.send('successor')
      if (fullWaiting) moveOn(helper)
    } else if (helper === acceptor) {
      if (message === 'nearly full') prepareNext(helper)
      else if (message === 'full') moveOn(helper)
    }
  })
  // An order sent as it dies fails; its 'close' below says what happens next.
  helper.on('error', () => {})
  // 'close', not 'exit': by then every message it sent has arrived, a copy of the socket included, so
  // whether anyone else still holds the socket is known.
  helper.on('close', (code, signal) => {
    helpers.delete(helper)
    ready.delete(helper)
    if (helper === nextHelper) nextHelper = undefined
    if (stopping) return exitWhenDone()
    if (code !== 0) console.error(`process ${helper.pid} exited (${signal ?? code}), and its connections with it`)
    if (helper === acceptor) acceptAgain()
  })
  return helper
}

// The helper accepting died: the next accepts, or else the first listens again, on a new socket (what
// was queued on the old one is reset with it, as it would be with a single process that died).
function acceptAgain() {
  copyAsked = fullWaiting = false
  acceptor = undefined
  if (nextHelper) promoteNext()
  else listenOnPort(served.server)
}

// In a helper: what the first process asks of it.
function takeOrders(server: Server) {
  process.on('message', (message: Order) => {
    if (message === 'copy') process.send!('copy', accepting)
    else if (message === 'stop') stopAccepting()
    else if (message === 'successor') {
      succeeded = true
      if (saidFull) stopAccepting()
    } else if (message === 'accept') {
      server.listen({ fd: SOCKET_FD }, () => {
        accepting = server
        capacity = FILE_LIMIT - filesOpen() - SPARE_FILES
        console.log(`process ${process.pid} takes new connections`)
        // Its successor is started now, not when it is nearly full: ready long before it is needed.
        saidNearlyFull = true
        process.send!('nearly full')
      })
    }
  })
  process.send!('ready')
}

function openFileLimit(): number {
  try {
    const soft = /^Max open files +(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]
    return soft ? Number(soft) : Infinity
  } catch {
    return Infinity // not Linux: the limit is the operator's to know, and WORKERS theirs to set
  }
}

function filesOpen(): number {
  try {
    return readdirSync('/proc/self/fd').length
  } catch {
    return 0
  }
}

// WORKERS processes on one port, each running `entry` with its own database connections; WAL and the
// lock retries keep their writes safe. A worker that dies is replaced; SIGTERM stops them all and exits 0.
export async function runWorkers(entry: string) {
  // Port 0 would give every worker a different port: choose one for all of them.
  const port = PORT || (await freePort())
  cluster.setupPrimary({ exec: entry, args: [] })
  let stoppingWorkers = false
  for (let i = 0; i < WORKERS; i++) cluster.fork({ PORT: String(port) })
  cluster.on('exit', (worker, code, signal) => {
    if (stoppingWorkers) {
      if (Object.keys(cluster.workers ?? {}).length === 0) process.exit(0)
      return
    }
    console.error(`worker ${worker.process.pid} exited (${signal ?? code}); starting another`)
    cluster.fork({ PORT: String(port) })
  })
  const stop = () => {
    if (stoppingWorkers) return
    stoppingWorkers = true
    for (const worker of Object.values(cluster.workers ?? {})) worker?.process.kill('SIGTERM')
  }
  process.on('SIGTERM', stop).on('SIGINT', stop)
}

async function freePort(): Promise<number> {
  const probe = createNetServer().listen(0, HOST)
  await once(probe, 'listening')
  const { port } = probe.address() as AddressInfo
  probe.close()
  return port
}
