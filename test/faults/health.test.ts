// /health while every write succeeds: another process that takes the write lock for a moment (Litestream
// at its checkpoints, the other worker of WORKERS=2 at its commits) is no fault, and /health must not
// say degraded for it. The faults it does report are test/faults/database.test.ts's.
import assert from 'node:assert/strict'
import { join } from 'node:path'
import { after, describe, test, type TestContext } from 'node:test'
import type { Token } from '../../harness/seed.ts'
import { type Server, startServer } from '../../harness/server.ts'
import { sleep, until, within } from '../../harness/time.ts'
import { NO_LITESTREAM } from '../../harness/tools.ts'
import { claims, makeToken, probeHealth, skipUnless, smallDatabase } from '../helpers.ts'
import { LITESTREAM_ENV, writeStream } from '../replication.ts'

// 16 lanes of posts and likes at full rate for so many seconds, /health asked every 20 ms meanwhile.
// Long enough that the commit before fails: it answered 503 to about 0.15 probes a second under
// Litestream (1 and 2 in two runs of 10 s; 30 s leave about a 1% chance of none), and to about 1 a
// second with WORKERS=2.
async function writesAndProbes(t: TestContext, server: Server, tokens: Token[], seconds: number) {
  const port = Number(new URL(server.url).port)
  const stream = writeStream(server.url, tokens, 'health')
  const health = probeHealth(port, 20)
  await sleep(seconds * 1000) // how long the writes and the probes last
  const probes = await health.stop()
  await stream.stop()
  const sorted = [...probes.latencies].sort((a, b) => a - b)
  t.diagnostic(
    `${stream.acknowledged.length} writes acknowledged, ${stream.errors.length} failed; ${probes.latencies.length} /health probes, ` +
      `${probes.failures.length} not 200; /health p99 ${sorted[Math.floor(sorted.length * 0.99)].toFixed(1)} ms, max ${probes.max.toFixed(1)} ms`,
  )
  assert.deepEqual(stream.errors.slice(0, 5), [], `${stream.errors.length} writes failed`)
  assert.ok(stream.acknowledged.length > 1_000, `only ${stream.acknowledged.length} writes in ${seconds} s`)
  assert.deepEqual(
    probes.failures.slice(0, 5),
    [],
    `${probes.failures.length} of ${probes.latencies.length} probes were not 200`,
  )
}

async function box() {
  const db = smallDatabase()
  const tokens = await Promise.all(
    Array.from({ length: 50 }, async (_, i) => ({
      id: i + 1,
      username: `user_${i + 1}`,
      token: await makeToken(claims(String(i + 1))),
    })),
  )
  return { db, tokens }
}

describe('/health under writes at full rate', () => {
  const servers: Server[] = []
  const boxes: Awaited<ReturnType<typeof box>>[] = []
  after(async () => {
    for (const server of servers) await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    for (const { db } of boxes) db.remove()
  })

  test(
    'replicated by Litestream (npm start with a file replica): never a 503',
    { skip: skipUnless(NO_LITESTREAM) },
    async (t) => {
      const b = await box()
      boxes.push(b)
      const server = await startServer(process.execPath, ['dist/start.js'], {
        env: {
          SQLITE_PATH: b.db.path,
          LITESTREAM_REPLICA_URL: `file://${join(b.db.dir, 'replica')}`,
          ...LITESTREAM_ENV,
        },
      })
      servers.push(server)
      // From its first snapshot on, Litestream checkpoints.
      await until(() => /snapshot complete/.test(server.output()), 10_000, "Litestream's first snapshot")
      await writesAndProbes(t, server, b.tokens, 30)
    },
  )

  test('with WORKERS=2, each worker committing beside the other: never a 503', async (t) => {
    const b = await box()
    boxes.push(b)
    const server = await startServer(process.execPath, ['dist/app.js'], {
      env: { SQLITE_PATH: b.db.path, WORKERS: '2' },
    })
    servers.push(server)
    await until(() => (server.output().match(/listening on/g) ?? []).length === 2, 10_000, 'both workers listening')
    await writesAndProbes(t, server, b.tokens, 10)
  })
})
