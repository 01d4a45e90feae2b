// `npm start` (dist/start.js) with LITESTREAM_REPLICA_URL: which Litestream it runs, what it tells
// Litestream, and what the server then reports of the replica. The losses, stops and outages are
// test/faults/replication.test.ts's. On the default HTTP server alone: what is checked is start.js and
// the replica's state in /health, whatever serves HTTP (test/servers.ts runs the HTTP tests on each).
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { chmodSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { startServer } from '../harness/server.ts'
import { sleep, within } from '../harness/time.ts'
import { NO_LITESTREAM, ROOT } from '../harness/tools.ts'
import { describeNeeding, smallDatabase } from './helpers.ts'
import { LITESTREAM_ENV, notIn, restoreByHand } from './replication.ts'

const boxes: ReturnType<typeof smallDatabase>[] = []
after(() => boxes.forEach((box) => box.remove()))
const box = () => {
  const b = smallDatabase()
  boxes.push(b)
  return b
}

// npm start on a database that is there (nothing to restore, nothing to seed), to its end, bounded.
function start(env: Record<string, string>) {
  const b = box()
  const run = spawnSync(process.execPath, ['dist/start.js'], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH,
      SQLITE_PATH: b.path,
      PORT: '0',
      LITESTREAM_REPLICA_URL: `file://${join(b.dir, 'replica')}`,
      ...env,
    },
    encoding: 'utf8',
    timeout: 30_000,
  })
  return { box: b, status: run.status, output: run.stdout + run.stderr }
}

// A stand-in `litestream` that says it is the given version, and for any other command prints what
// it was asked and exits 0.
function fakeLitestream(version: string) {
  const path = join(box().dir, 'litestream')
  writeFileSync(
    path,
    `#!/bin/sh\nif [ "$1" = version ]; then echo '${version}'; exit 0; fi\necho "litestream asked: $*"\n`,
  )
  chmodSync(path, 0o755)
  return path
}

describe('npm start with LITESTREAM_REPLICA_URL', () => {
  describe('which Litestream', () => {
    test('none on the PATH or in LITESTREAM_BIN: the start stops with one line that says where to get 0.5.17', () => {
      const run = start({ PATH: '/usr/bin:/bin', LITESTREAM_BIN: '' })
      assert.equal(run.status, 1)
      assert.match(
        run.output,
        /^start: LITESTREAM_REPLICA_URL needs Litestream 0\.5\.17 or later, and there is no litestream on the PATH: get it from the image litestream\/litestream:0\.5\.17/m,
      )
      assert.doesNotMatch(run.output, /listening on/)
    })

    test('an older one (0.3.13): the start stops and names it', () => {
      const old = fakeLitestream('v0.3.13')
      const run = start({ LITESTREAM_BIN: old })
      assert.equal(run.status, 1)
      assert.match(run.output, new RegExp(`and ${old} says "v0\\.3\\.13": get it from`))
      assert.equal(run.output.trim().split('\n').length, 1, `one line, before any restore or seed:\n${run.output}`)
    })

    test('a binary that does not run: the start stops and says why', () => {
      const path = join(box().dir, 'litestream')
      writeFileSync(path, 'not a program')
      const run = start({ LITESTREAM_BIN: path })
      assert.equal(run.status, 1)
      assert.match(run.output, /does not run \(EACCES\)/)
    })

    test('0.5.17, or a build between releases that names it in a Go pseudo-version, or later: it runs', () => {
      for (const version of ['v0.5.17', 'v0.5.17-0.20260819145314-63225f17ccbb', 'v0.6.0', 'v1.0.0']) {
        const run = start({ LITESTREAM_BIN: fakeLitestream(version) })
        assert.equal(run.status, 0, `${version}: ${run.output}`)
        assert.match(
          run.output,
          /litestream asked: replicate -config \S+\.feed\.db-litestream\.yml -no-expand-env -exec /,
          version,
        )
      }
      for (const version of ['v0.5.16', 'v0.4.99', '0.3.13', 'development build']) {
        assert.equal(start({ LITESTREAM_BIN: fakeLitestream(version) }).status, 1, version)
      }
    })

    test("the config is 0.5's: one database, one replica, and the control socket beside the database", () => {
      const run = start({
        LITESTREAM_BIN: fakeLitestream('v0.5.17'),
        AWS_ENDPOINT_URL_S3: 'http://127.0.0.1:9',
        AWS_REGION: 'auto',
      })
      assert.equal(run.status, 0, run.output)
      const config = JSON.parse(readFileSync(join(run.box.dir, '.feed.db-litestream.yml'), 'utf8'))
      assert.deepEqual(config, {
        socket: { enabled: true, path: join(run.box.dir, '.feed.db-litestream.sock') },
        dbs: [
          {
            path: run.box.path,
            replica: { url: `file://${join(run.box.dir, 'replica')}`, endpoint: 'http://127.0.0.1:9', region: 'auto' },
          },
        ],
      })
    })

    test('LITESTREAM_SYNC_INTERVAL sets how often Litestream reads the WAL and how often it uploads', () => {
      const run = start({ LITESTREAM_BIN: fakeLitestream('v0.5.17'), LITESTREAM_SYNC_INTERVAL: '100ms' })
      assert.equal(run.status, 0, run.output)
      const [db] = JSON.parse(readFileSync(join(run.box.dir, '.feed.db-litestream.yml'), 'utf8')).dbs
      assert.equal(db['monitor-interval'], '100ms')
      assert.equal(db.replica['sync-interval'], '100ms')
    })

    test('an interval that is not a duration stops the start before Litestream runs', () => {
      for (const [name, value] of [
        ['LITESTREAM_SYNC_INTERVAL', '100'],
        ['LITESTREAM_FOLLOW_INTERVAL', 'fast'],
      ]) {
        const run = start({ LITESTREAM_BIN: fakeLitestream('v0.5.17'), [name]: value })
        assert.equal(run.status, 1, run.output)
        assert.equal(run.output.trim(), `start: ${name} is a duration such as 100ms or 1s, not "${value}"`)
      }
    })
  })

  describeNeeding(NO_LITESTREAM, 'under the real Litestream 0.5', {}, () => {
    test('/health says the replica is ok; a write reaches it; SIGTERM stops both with 0', async () => {
      const b = box()
      const replica = join(b.dir, 'replica')
      const server = await startServer(process.execPath, ['dist/start.js'], {
        env: { SQLITE_PATH: b.path, LITESTREAM_REPLICA_URL: `file://${replica}`, ...LITESTREAM_ENV },
      })
      try {
        // behind_ms: since the replica last took all there was (at first, since the server started).
        const { replica: state } = await (
          await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(5_000) })
        ).json()
        assert.equal(state.state, 'ok')
        assert.ok(state.behind_ms >= 0 && state.behind_ms < 5_000, `behind_ms ${state.behind_ms}`)
        const res = await fetch(`${server.url}/posts`, {
          method: 'POST',
          headers: { authorization: `Bearer ${await b.tokenFor(1)}` },
          body: JSON.stringify({ body: 'replicated' }),
          signal: AbortSignal.timeout(10_000),
        })
        assert.equal(res.status, 201)
        const { post } = await res.json()
        // Litestream sends each second: restored by hand, the replica soon holds the post.
        const restored = join(b.dir, 'restored.db')
        const holds = () => {
          rmSync(restored, { force: true })
          try {
            restoreByHand(`file://${replica}`, restored)
          } catch {
            return false // nothing there yet
          }
          return notIn(restored, [{ kind: 'post', id: post.id, body: 'replicated', at: 0, ms: 0 }]).missing.length === 0
        }
        const deadline = performance.now() + 10_000
        while (!holds() && performance.now() < deadline) await sleep(200)
        assert.ok(holds(), 'the replica held the write within 10 s')
        await sleep(1_500) // the server asks Litestream once a second: /health after its next question
        const after = (await (await fetch(`${server.url}/health`, { signal: AbortSignal.timeout(5_000) })).json())
          .replica
        assert.equal(after.state, 'ok')
        assert.ok(after.behind_ms < 3_000, `the replica took what was new ${after.behind_ms} ms ago`)
      } finally {
        assert.equal(
          await within(server.stop(), 15_000, 'Litestream and the server to exit on SIGTERM'),
          0,
          server.output(),
        )
      }
    })
  })
})
