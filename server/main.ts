// What `node dist/app.js` runs (build.mjs bundles it so): the API of app.ts, served on node:net by
// server/wire.ts (or on node:http by @hono/node-server, with HTTP_SERVER=node-server) in as many
// processes as its connections need, with a guard on memory, under Litestream or as a follower when
// start.ts says so.
import type { Socket } from 'node:net'
import { app, configure, MAX_BODY_BYTES } from '../app.ts'
import { databaseSetup, openDatabaseAtStart } from './database.ts'
import { forwardWrites, PRIMARY_API_URL } from './follower.ts'
import { guardMemory, memoryHealth } from './memory.ts'
import { createNodeServer } from './node-server.ts'
import { replicaHealth, replicaSetup, startReplicating } from './primary.ts'
import { serveInProcesses, speaksForAll, supervisesWorkers } from './processes.ts'
import { createWireServer } from './wire.ts'
import { runWorkers } from './workers.ts'

// `net` (the default): our own HTTP/1.1 server on node:net; `node-server`: @hono/node-server on node:http.
const HTTP_SERVER = process.env.HTTP_SERVER || 'net'
if (HTTP_SERVER !== 'net' && HTTP_SERVER !== 'node-server') {
  console.error(`HTTP_SERVER is net or node-server, not ${JSON.stringify(HTTP_SERVER)}`)
  process.exit(1)
}

// This script: every process of the server runs it, helpers and workers too, never start.ts again.
const entry = import.meta.filename

if (supervisesWorkers) await runWorkers(entry)
else await run()

async function run() {
  // The default secret is the challenge's, which anyone can read: one process says so for all.
  if (speaksForAll && !process.env.JWT_SECRET)
    console.warn("JWT_SECRET is not set: tokens are checked with the challenge's public default secret; set your own")
  // What this server adds to the API, told once, before the API opens its database.
  const follower = Boolean(PRIMARY_API_URL)
  configure({
    ...databaseSetup(follower),
    ...(follower ? {} : replicaSetup()),
    health: () => ({ ...replicaHealth(), ...memoryHealth() }),
  })
  const fetch = follower ? forwardWrites(app.fetch) : await startReplicating(app.fetch, speaksForAll)
  await openDatabaseAtStart()
  const server =
    HTTP_SERVER === 'net' ? createWireServer(fetch, MAX_BODY_BYTES) : createNodeServer(fetch, MAX_BODY_BYTES)
  const connections = new Set<Socket>() // this process's, kept by its role and read by the memory guard
  guardMemory(server, connections)
  serveInProcesses(server, connections, entry)
}
