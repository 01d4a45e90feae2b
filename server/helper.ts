// A helper: the server again, started by the first process past its open-file limit (server/first-process.ts),
// with database connections of its own and a copy of the listening socket at SOCKET_FD. It takes new
// connections once the first tells it to, until it is full; then it exits with its last connection.
import type { Socket } from 'node:net'
import type { ApiServer } from './api-server.ts'
import { report, SOCKET_FD, type Order } from './messages.ts'
import { countConnections, exitDrained, type Intake, room } from './serving.ts'

// Serves `api` as the first process orders, until SIGTERM or SIGINT, or until the first is gone (nobody
// would start the next); then drains and exits 0.
export function serveAsHelper(api: ApiServer, connections: Set<Socket>) {
  const helper = new Helper(api, connections)
  process.on('message', (order: Order) => helper.obey(order))
  report({ kind: 'ready' })
  const stop = () => helper.stop()
  process.on('SIGTERM', stop).on('SIGINT', stop)
  process.on('disconnect', stop)
}

class Helper {
  #succeeded = false // its successor holds a copy of the socket it accepts from
  #stopping = false // draining, then exiting
  readonly #api: ApiServer
  readonly #intake: Intake

  constructor(api: ApiServer, connections: Set<Socket>) {
    this.#api = api
    this.#intake = countConnections(api.server, connections, {
      nearlyFull: () => report({ kind: 'nearly full' }),
      full: () => {
        report({ kind: 'full' })
        // With the socket held by its successor, it stops at once: a burst queued in the kernel would
        // otherwise be accepted past the file limit while the first process answers, and reset.
        if (this.#succeeded) this.#intake.stopAccepting()
      },
      lastClosed: () => this.stop(), // it no longer accepts, and nothing is left to serve
    })
  }

  // What the first process orders: the one place a helper hears it.
  obey(order: Order) {
    switch (order.kind) {
      case 'copy':
        return report({ kind: 'copy' }, this.#intake.accepting ? this.#api.server : undefined)
      case 'stop':
        return this.#intake.stopAccepting()
      case 'successor':
        this.#succeeded = true
        if (this.#intake.saidFull) this.#intake.stopAccepting()
        return
      case 'accept':
        return this.#accept()
    }
  }

  #accept() {
    this.#api.server.listen({ fd: SOCKET_FD }, () => {
      this.#intake.accept(room())
      console.log(`process ${process.pid} takes new connections`)
      // Its successor is started now, not when it is nearly full: ready long before it is needed.
      this.#intake.sayNearlyFull()
    })
  }

  stop() {
    if (this.#stopping) return // a second signal changes nothing: the drain is under way, bounded at 10 s
    this.#stopping = true
    this.#api.drain(exitDrained)
  }
}
