// What every process that serves does alike, whatever its role (server/processes.ts): it keeps its
// connections, and while it accepts against a capacity (the first process, a helper), says once when it
// is nearly full and once when it is full; its role decides what follows.
import { readdirSync, readFileSync } from 'node:fs'
import { Server as NetServer, type AddressInfo, type Server, type Socket } from 'node:net'
import { closeDatabase, HOST } from '../app.ts'

// Every connection is an open file, and a process may have only so many: 65,535 under the challenge's
// systemd, 20,000 on our test machines.
export const FILE_LIMIT = openFileLimit()
// Files of a process that are not its connections (the database, its WAL, the event loop, a follower's
// forwarded writes), and connections accepted until its listener is closed.
const SPARE_FILES = Math.max(64, Math.floor(FILE_LIMIT / 16))
// Nearly full: the room a helper's start (about 0.3 s) needs at the challenge's fastest arrivals, 1,700
// connections a second, many times over: 2,300 under a limit of 20,000 and 7,700 under 65,535.
const NEARLY_FULL = 7 / 8

// What a role does when its process is nearly full, when it is full, and when its last connection has
// closed after it stopped accepting.
export type Role = { nearlyFull?(): void; full?(): void; lastClosed?(): void }

// Keeps the connections `server` takes in `connections` (the memory guard reads them too), and tells
// `role` how full they make it while it accepts.
export const countConnections = (server: Server, connections: Set<Socket>, role: Role = {}) =>
  new Intake(server, connections, role)

// A process's connections, and whether it takes new ones on its server.
export class Intake {
  #capacity = Infinity // connections it takes before it stops accepting
  #accepting = false
  #saidNearlyFull = false
  #saidFull = false
  #steppedOut = false // it accepted, and no longer does
  readonly #server: Server
  readonly #connections: Set<Socket>
  readonly #role: Role

  // One close listener serves every connection.
  constructor(server: Server, connections: Set<Socket>, role: Role) {
    this.#server = server
    this.#connections = connections
    this.#role = role
    const intake = this
    const uncounted = function (this: Socket) {
      connections.delete(this)
      if (intake.#steppedOut && connections.size === 0) role.lastClosed?.()
    }
    server.on('connection', (socket: Socket) => {
      connections.add(socket)
      socket.on('close', uncounted)
      if (this.#accepting) this.#counted()
    })
  }

  get accepting() {
    return this.#accepting
  }

  get saidFull() {
    return this.#saidFull
  }

  // Its server listens: it takes `capacity` connections before it stops.
  accept(capacity: number) {
    this.#accepting = true
    this.#capacity = capacity
  }

  sayNearlyFull() {
    this.#saidNearlyFull = true
    this.#role.nearlyFull?.()
  }

  // Only the listener closes: node:http's close() would also close the idle connections.
  stopAccepting() {
    if (!this.#accepting) return
    this.#steppedOut = true
    this.#saidNearlyFull = this.#saidFull = false
    NetServer.prototype.close.call(this.#server)
    this.#accepting = false
    console.log(
      `process ${process.pid} is full (${this.#connections.size} connections, ${FILE_LIMIT} open files at most): the next takes new ones`,
    )
  }

  #counted() {
    if (this.#connections.size >= this.#capacity * NEARLY_FULL && !this.#saidNearlyFull) this.sayNearlyFull()
    if (this.#connections.size >= this.#capacity && !this.#saidFull) {
      this.#saidFull = true
      this.#role.full?.()
    }
  }
}

// The connections a process may take from now: what its open files leave.
export const room = () => FILE_LIMIT - filesOpen() - SPARE_FILES

// Listens on HOST and `port` (0: any), says so in the log, and calls back with the port it got.
export function listenOnPort(server: Server, port: number, reusePort: boolean, listening?: (port: number) => void) {
  server.listen({ host: HOST, port, reusePort, exclusive: true }, () => {
    const { address, port } = server.address() as AddressInfo
    console.log(`listening on http://${address}:${port}`)
    listening?.(port)
  })
}

// Every connection of its own is closed, and every process it started gone.
export function exitDrained(): never {
  closeDatabase()
  process.exit(0)
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
