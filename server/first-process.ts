// The first process (WORKERS unset): it listens on PORT and serves alone while it has room. Nearly full,
// it starts a helper (server/helper.ts), born with a copy of the listening socket; full, it stops
// accepting and the helper accepts from the same socket: the kernel queues what arrives between the two
// and refuses nothing. It does this for every helper in turn, and starts each helper's successor as soon
// as that helper accepts, from a copy of the socket that helper sends. A connection stays where it was
// taken.
import { fork, type ChildProcess } from 'node:child_process'
import type { Server, Socket } from 'node:net'
import { PORT } from '../app.ts'
import type { ApiServer } from './api-server.ts'
import { takingConnections } from './memory.ts'
import { HELPER_OF, order, type Report } from './messages.ts'
import { countConnections, exitDrained, type Intake, listenOnPort, room } from './serving.ts'

// The process that takes new connections: a helper, or the first itself.
type Acceptor = ChildProcess | 'first'

// Serves `api` until SIGTERM or SIGINT, with helpers running `entry` as the connections need them;
// then stops them, drains, and exits 0 once they are gone too.
export function serveAsFirst(api: ApiServer, connections: Set<Socket>, entry: string) {
  const first = new FirstProcess(api, connections, entry)
  const stop = () => first.stop()
  process.on('SIGTERM', stop).on('SIGINT', stop)
}

class FirstProcess {
  readonly #helpers = new Set<ChildProcess>()
  readonly #ready = new Set<ChildProcess>() // said 'ready': each accepts as soon as it is told to
  #acceptor: Acceptor = 'first'
  #nextHelper: ChildProcess | undefined // started, to accept once the acceptor is full
  #copyAsked = false // the acceptor is asked for its copy of the socket, for the next
  #fullWaiting = false // the one accepting is full, and the next is not started yet
  #port = PORT // once listening, the port it got (PORT=0), to listen again on the same
  #stopping = false // SIGTERM: draining, then exiting
  #drained = false // every connection of its own closed
  readonly #api: ApiServer
  readonly #entry: string
  readonly #intake: Intake

  constructor(api: ApiServer, connections: Set<Socket>, entry: string) {
    this.#api = api
    this.#entry = entry
    this.#intake = countConnections(api.server, connections, {
      nearlyFull: () => this.#prepareNext('first'),
      full: () => this.#moveOn('first'),
    })
    this.#listen()
  }

  stop() {
    if (this.#stopping) return // a second signal changes nothing: the drain is under way, bounded at 10 s
    this.#stopping = true
    for (const helper of this.#helpers) helper.kill('SIGTERM')
    this.#api.drain(() => {
      this.#drained = true
      this.#exitWhenDone()
    })
  }

  // It exits once its own connections and every helper it started are gone.
  #exitWhenDone() {
    if (this.#drained && this.#helpers.size === 0) exitDrained()
  }

  #listen() {
    listenOnPort(this.#api.server, this.#port, false, (port) => {
      this.#port = port
      this.#intake.accept(room())
    })
  }

  #prepareNext(from: Acceptor) {
    // Short of memory, no process is started: it would cost more memory, for connections refused anyway.
    if (this.#nextHelper || this.#copyAsked || this.#stopping || !takingConnections()) return
    if (from === 'first') this.#nextHelper = this.#startHelper(this.#api.server)
    else {
      this.#copyAsked = true
      order(from, { kind: 'copy' }) // it answers with its listening server
    }
  }

  #moveOn(from: Acceptor) {
    this.#prepareNext(from)
    this.#fullWaiting = !this.#nextHelper
    if (!this.#nextHelper) return
    if (from === 'first') this.#intake.stopAccepting()
    else order(from, { kind: 'stop' })
    this.#promoteNext()
  }

  #promoteNext() {
    this.#acceptor = this.#nextHelper!
    this.#nextHelper = undefined
    if (this.#ready.has(this.#acceptor)) order(this.#acceptor, { kind: 'accept' })
  }

  // A helper runs the server's entry (dist/app.js), never the script that started this process: under
  // `npm start` that is the supervisor, dist/start.js, which would seed again.
  #startHelper(copy: Server): ChildProcess {
    const helper = fork(this.#entry, [], {
      env: { ...process.env, [HELPER_OF]: String(process.pid) },
      stdio: ['inherit', 'inherit', 'inherit', 'ipc', listeningFd(copy)], // the fifth: the helper's SOCKET_FD
    })
    this.#helpers.add(helper)
    helper.on('message', (report: Report, socket?: Server) => this.#heard(helper, report, socket))
    // An order sent as it dies fails; its 'close' below says what happens next.
    helper.on('error', () => {})
    // 'close', not 'exit': by then every message it sent has arrived, a copy of the socket included, so
    // whether anyone else still holds the socket is known.
    helper.on('close', (code, signal) => this.#closed(helper, code, signal))
    return helper
  }

  // What a helper tells: the one place the first process hears it.
  #heard(helper: ChildProcess, report: Report, socket?: Server) {
    switch (report.kind) {
      case 'ready':
        this.#ready.add(helper)
        if (helper === this.#acceptor) order(helper, { kind: 'accept' })
        return
      case 'copy':
        if (socket) this.#copied(helper, socket)
        return
      case 'nearly full':
        if (helper === this.#acceptor) this.#prepareNext(helper)
        return
      case 'full':
        if (helper === this.#acceptor) this.#moveOn(helper)
    }
  }

  // `helper` sent its copy of the socket: its successor starts with it.
  #copied(helper: ChildProcess, socket: Server) {
    this.#copyAsked = false
    this.#nextHelper = this.#startHelper(socket)
    socket.close() // the new helper has its own copy now
    order(helper, { kind: 'successor' })
    if (this.#fullWaiting) this.#moveOn(helper)
  }

  #closed(helper: ChildProcess, code: number | null, signal: NodeJS.Signals | null) {
    this.#helpers.delete(helper)
    this.#ready.delete(helper)
    if (helper === this.#nextHelper) this.#nextHelper = undefined
    if (this.#stopping) return this.#exitWhenDone()
    if (code !== 0) console.error(`process ${helper.pid} exited (${signal ?? code}), and its connections with it`)
    if (helper === this.#acceptor) this.#acceptAgain()
  }

  // The helper accepting died: the next accepts, or else the first listens again, on a new socket (what
  // was queued on the old one is reset with it, as it would be with a single process that died).
  #acceptAgain() {
    this.#copyAsked = this.#fullWaiting = false
    this.#acceptor = 'first'
    if (this.#nextHelper) this.#promoteNext()
    else this.#listen()
  }
}

// The file descriptor of a listening server, for a helper's stdio. node:net has no public way to it, and
// `subprocess.send(message, server)`, the public way to hand a server over, makes the server received
// listen at once: a helper would take connections before it is told to, and the copy a helper sends
// would accept connections in this process until passed on.
function listeningFd(server: Server): number {
  return (server as Server & { _handle: { fd: number } })._handle.fd
}
