// How many processes serve, and which role each has. Every connection is an open file, and a process
// may have only so many: 65,535 under the challenge's systemd, 20,000 on our test machines. One process
// serves a request for the least CPU, so the first serves alone while it has room; past that it starts
// helpers, the server again, one after the other, each taking new connections from the same listening
// socket in turn (server/first-process.ts, server/helper.ts, and server/messages.ts between them).
// WORKERS=N fixes the number of processes instead (server/workers.ts; docs/operations.md).
import cluster from 'node:cluster'
import type { Socket } from 'node:net'
import type { ApiServer } from './api-server.ts'
import { serveAsFirst } from './first-process.ts'
import { serveAsHelper } from './helper.ts'
import { isHelper } from './messages.ts'
import { serveAsWorker, WORKERS } from './workers.ts'

// Under WORKERS=N, the first process only starts and replaces the workers (runWorkers).
export const supervisesWorkers = WORKERS > 1 && cluster.isPrimary
// The process that speaks for the service in the log: the first, or the first of the WORKERS.
export const speaksForAll = !isHelper && (cluster.isPrimary || cluster.worker?.id === 1)

// Serves `api` from this process in its role until SIGTERM or SIGINT, keeping its connections in
// `connections`; the first process starts helpers running `entry` as the connections need them. Each
// drains, closes the database and exits 0.
export function serveInProcesses(api: ApiServer, connections: Set<Socket>, entry: string) {
  if (isHelper) serveAsHelper(api, connections)
  else if (WORKERS) serveAsWorker(api, connections)
  else serveAsFirst(api, connections, entry)
}
