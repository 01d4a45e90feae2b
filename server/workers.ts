// WORKERS=N: N processes on one port, each running the server's entry with its own database
// connections; WAL and the lock retries keep their writes safe. Each listens on a socket of its own with
// SO_REUSEPORT, and the kernel spreads new connections over them. The first process only starts and
// replaces them.
import cluster from 'node:cluster'
import { once } from 'node:events'
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net'
import { HOST, PORT } from '../app.ts'
import type { ApiServer } from './api-server.ts'
import { countConnections, exitDrained, listenOnPort } from './serving.ts'

// A fixed number of processes sharing the port, each with its own database connections.
export const WORKERS = Number(process.env.WORKERS || 0)

// In the first process: a worker that dies is replaced; SIGTERM stops them all and exits 0.
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

// A worker, or the one process of WORKERS=1: it serves `api` until SIGTERM or SIGINT, then drains and
// exits 0. Its connections are kept for the memory guard; past its open-file limit a new one is closed
// as it comes.
export function serveAsWorker(api: ApiServer, connections: Set<Socket>) {
  countConnections(api.server, connections)
  listenOnPort(api.server, PORT, WORKERS > 1)
  let stopping = false
  const stop = () => {
    if (stopping) return // a second signal changes nothing: the drain is under way, bounded at 10 s
    stopping = true
    api.drain(exitDrained)
  }
  process.on('SIGTERM', stop).on('SIGINT', stop)
}
