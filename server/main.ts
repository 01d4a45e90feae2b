// What `node dist/app.js` runs (build.mjs bundles it so): the API of app.ts, served by node:http in as
// many processes as its connections need, with a guard on memory, under Litestream or as a follower
// when start.ts says so.
import { app, hooks, openDatabase, warnOnDefaultSecret } from '../app.ts'
import { guardMemory, memoryHealth } from './memory.ts'
import { connections, runWorkers, serveInProcesses, speaksForAll, supervisesWorkers } from './processes.ts'
import { follow, PRIMARY_API_URL, replicaHealth, replicate } from './replica.ts'
import { createApiServer, idleSince } from './serve.ts'

// This script: every process of the server runs it, helpers and workers too, never start.ts again.
const entry = import.meta.filename

if (supervisesWorkers) await runWorkers(entry)
else await run()

async function run() {
  if (speaksForAll) warnOnDefaultSecret()
  const fetch = PRIMARY_API_URL ? follow(app.fetch) : await replicate(app.fetch, speaksForAll)
  hooks.health = () => ({ ...replicaHealth(), ...memoryHealth() })
  await openDatabase()
  const server = createApiServer(fetch)
  guardMemory(server, connections, idleSince)
  serveInProcesses(server, entry)
}
