// An existing user's replica, written by Litestream 0.3.13 as the project's earlier releases ran it,
// restores under Litestream 0.5.17 as `npm start` runs it now. 0.3.13 keeps generations/<id>/ with
// snapshots and WAL segments; 0.5 writes LTX files in ltx/ beside them, and its restore takes whichever
// format holds the newer backup. The box is lost (its data folder deleted) twice: once with only
// 0.3.13's files in the replica, once after 0.5.17 has replicated to it as well.
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { DatabaseSync } from 'node:sqlite'
import type { Token } from '../../harness/seed.ts'
import { type Server, startServer } from '../../harness/server.ts'
import { sleep, within } from '../../harness/time.ts'
import { LITESTREAM, ROOT } from '../../harness/tools.ts'
import { claims, describeNeeding, makeToken, smallDatabase } from '../helpers.ts'
import { killEverything, LITESTREAM_ENV, notIn, OLD_LITESTREAM, restoreByHand, type Write } from '../replication.ts'

const folders: string[] = []
const servers: Server[] = []
// Whatever a failed test left running is killed, Litestream and the server under it, so the file still ends.
after(async () => {
  for (const server of servers)
    if (server.child.exitCode === null && server.child.signalCode === null) await killEverything(server.child.pid!)
  folders.forEach((dir) => rmSync(dir, { recursive: true, force: true }))
})
const folder = (name: string) => {
  const dir = mkdtempSync(join(tmpdir(), `feed-${name}-`))
  folders.push(dir)
  return dir
}

// Everything a Litestream process gets: PATH, and what it is given; never AWS_CA_BUNDLE (replication.ts).
const litestreamEnv = (env: Record<string, string> = {}) => ({ PATH: process.env.PATH ?? '', ...env })

// The previous release's `npm start` (start.ts before the move to 0.5): Litestream 0.3.13 with a config of
// one database and its replicas, and the server as its child under -exec, leaving checkpoints to it.
async function startUnderOldLitestream(db: string, url: string) {
  const config = join(folder('old-config'), 'litestream.yml')
  writeFileSync(config, JSON.stringify({ dbs: [{ path: db, replicas: [{ url }] }] }, null, 2) + '\n')
  const exec = [process.execPath, join(ROOT, 'dist', 'app.js')]
    .map((word) => `'${word.replaceAll("'", `'\\''`)}'`)
    .join(' ')
  const server = await startServer(OLD_LITESTREAM!, ['replicate', '-config', config, '-no-expand-env', '-exec', exec], {
    env: { SQLITE_PATH: db, WAL_AUTOCHECKPOINT: '0' },
  })
  servers.push(server)
  return server
}

// `npm start` as it is now (dist/start.js), with LITESTREAM_REPLICA_URL set and Litestream 0.5.
async function startReplicated(dir: string, url: string) {
  const server = await startServer(process.execPath, ['dist/start.js'], {
    env: { SQLITE_PATH: join(dir, 'feed.db'), LITESTREAM_REPLICA_URL: url, ...LITESTREAM_ENV },
  })
  servers.push(server)
  return server
}

type Answered = Write & { answer?: unknown }

// n acknowledged pairs, one after the other: a post by one user, then a like of it by the next.
async function writePairs(url: string, tokens: Token[], label: string, n: number) {
  const writes: Answered[] = []
  const send = async (path: string, token: string, body?: string) => {
    const sent = performance.now()
    const res = await fetch(url + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body,
    })
    const text = await res.text()
    assert.equal(res.status, 201, `POST ${path}: ${text}`)
    return { at: performance.now(), ms: performance.now() - sent, answer: JSON.parse(text) }
  }
  for (let i = 0; i < n; i++) {
    const author = tokens[i % tokens.length]
    const liker = tokens[(i + 1) % tokens.length]
    const body = `${label}, write ${i}`
    const post = await send('/posts', author.token, JSON.stringify({ body }))
    writes.push({ kind: 'post', id: post.answer.post.id, body, at: post.at, ms: post.ms, answer: post.answer })
    const like = await send(`/posts/${post.answer.post.id}/like`, liker.token)
    writes.push({ kind: 'like', userId: liker.id, postId: post.answer.post.id, at: like.at, ms: like.ms })
  }
  return writes
}

// Restores the replica with Litestream 0.3.13 until the copy holds every write (it syncs each second).
async function untilOldReplicaHolds(url: string, writes: Write[], timeoutMs: number) {
  const started = performance.now()
  let missing: Write[] = writes
  while (performance.now() - started < timeoutMs) {
    const dir = folder('old-check')
    const run = spawnSync(OLD_LITESTREAM!, ['restore', '-o', join(dir, 'feed.db'), url], {
      encoding: 'utf8',
      env: litestreamEnv(),
      timeout: 30_000,
    })
    if (run.status === 0) {
      missing = notIn(join(dir, 'feed.db'), writes).missing
      if (!missing.length) return (performance.now() - started) / 1000
    }
    rmSync(dir, { recursive: true, force: true })
    await sleep(250)
  }
  throw new Error(
    `Litestream 0.3.13's replica still lacks ${missing.length} of ${writes.length} writes after ${timeoutMs / 1000} s`,
  )
}

// The replica folder as a listing: every file under it, relative, sorted.
const filesIn = (dir: string) =>
  readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile())
    .map((entry) => join(entry.parentPath, entry.name).slice(dir.length + 1))
    .sort()

const count = (path: string, table: string) => {
  const db = new DatabaseSync(path, { readOnly: true })
  try {
    return (db.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n
  } finally {
    db.close()
  }
}

const skip = !OLD_LITESTREAM
  ? 'no Litestream 0.3.13 (npm package @flydotio/litestream-linux-x64, linux-x64 only, from test/litestream-0.3)'
  : !LITESTREAM
    ? 'no Litestream 0.5 binary: set LITESTREAM_BIN, or put one at ../shared/tools/litestream'
    : false

describeNeeding(skip, 'an existing replica written by Litestream 0.3.13, after the upgrade to 0.5.17', {}, () => {
  test("an existing user's replica written by Litestream 0.3.13 restores under 0.5.17, and 0.5.17 replicates on beside it", async (t) => {
    const replica = folder('replica')
    const url = `file://${replica}`
    const small = smallDatabase()
    folders.push(small.dir)
    const tokens: Token[] = await Promise.all(
      Array.from({ length: 50 }, async (_, i) => ({
        id: i + 1,
        username: `user_${i + 1}`,
        token: await makeToken(claims(String(i + 1))),
      })),
    )

    // The earlier release: the server under Litestream 0.3.13, some acknowledged writes, all synced, a clean stop.
    const old = await startUnderOldLitestream(small.path, url)
    assert.match(old.output(), /litestream version=v0\.3\.13/)
    const before = await writePairs(old.url, tokens, 'under 0.3.13', 40)
    const synced = await untilOldReplicaHolds(url, before, 15_000)
    const oldCode = await within(old.stop(), 15_000, 'Litestream 0.3.13 and the server to exit on SIGTERM')
    assert.equal(oldCode, 0, `Litestream 0.3.13 exits 0 on SIGTERM:\n${old.output().slice(-3000)}`)
    assert.match(old.output(), /snapshot written/)
    const oldFiles = filesIn(replica)
    t.diagnostic(
      `0.3.13: ${before.length} writes acknowledged, all in its replica within ${synced.toFixed(1)} s; its replica holds ${oldFiles.join(', ')}`,
    )
    assert.deepEqual(readdirSync(replica), ['generations'])
    assert.ok(
      oldFiles.some((f) => /^generations\/[0-9a-f]{16}\/snapshots\/[0-9a-f]{8}\.snapshot\.lz4$/.test(f)),
      'a 0.3 snapshot',
    )
    assert.ok(
      oldFiles.some((f) => /^generations\/[0-9a-f]{16}\/wal\/[0-9a-f]{8}_[0-9a-f]{8}\.wal\.lz4$/.test(f)),
      'a 0.3 WAL segment',
    )

    // The disk lost: the database, its -wal and -shm and 0.3.13's state, all gone with the folder.
    rmSync(small.dir, { recursive: true, force: true })

    // The upgrade: `npm start` on an empty folder restores 0.3.13's replica with 0.5.17, and does not seed.
    const dir = folder('upgraded-box')
    const started = performance.now()
    const server = await startReplicated(dir, url)
    const restoredIn = (performance.now() - started) / 1000
    assert.match(server.output(), /start: .*feed\.db is missing; restoring it from file:\/\//)
    assert.match(server.output(), /start: restored .*feed\.db \([\d.]+ MB\) from the replica in [\d.]+ s/)
    assert.doesNotMatch(server.output(), /nothing to restore|seed: users/)
    assert.match(server.output(), /seed: .*feed\.db exists, serving it as it is/)
    assert.match(server.output(), /start: serving .*feed\.db under litestream replicate/)
    const restored = notIn(join(dir, 'feed.db'), before)
    assert.equal(restored.integrity, 'ok')
    assert.deepEqual(restored.missing, [], "every write acknowledged under 0.3.13 is in 0.5.17's restore")
    assert.equal(
      count(join(dir, 'feed.db'), 'posts'),
      100 + before.filter((w) => w.kind === 'post').length,
      'the small database and the new posts, nothing more',
    )
    const sample = before.findLast((w) => w.kind === 'post')! as Answered & { kind: 'post' }
    const got = await fetch(`${server.url}/posts/${sample.id}`)
    assert.equal(got.status, 200)
    const expected = sample.answer as { post: Record<string, unknown> }
    assert.deepEqual(await got.json(), { post: { ...expected.post, like_count: 1 } })
    t.diagnostic(`0.5.17: restored and listening in ${restoredIn.toFixed(1)} s`)

    // Under 0.5.17 from here: more writes, a clean stop, and LTX files beside 0.3.13's.
    const afterUpgrade = await writePairs(server.url, tokens, 'under 0.5.17', 10)
    const code = await within(server.stop(), 15_000, 'Litestream 0.5.17 and the server to exit on SIGTERM')
    assert.equal(code, 0, `Litestream 0.5.17 exits 0 on SIGTERM:\n${server.output().slice(-3000)}`)
    const top = readdirSync(replica).sort()
    const ltxFiles = filesIn(replica).filter((f) => f.startsWith('ltx/'))
    t.diagnostic(`replica after 0.5.17: top level ${top.join(', ')}; LTX files ${ltxFiles.join(', ')}`)
    assert.deepEqual(top, ['generations', 'ltx'])
    assert.ok(
      ltxFiles.some((f) => /\.ltx$/.test(f)),
      "0.5.17's LTX files",
    )
    assert.deepEqual(
      filesIn(replica).filter((f) => f.startsWith('generations/')),
      oldFiles,
      "0.3.13's files stay as they were",
    )

    // A second loss restores from the mixed replica, with both releases' writes.
    const again = join(folder('second-loss'), 'feed.db')
    restoreByHand(url, again, {})
    const second = notIn(again, [...before, ...afterUpgrade])
    assert.equal(second.integrity, 'ok')
    assert.deepEqual(second.missing, [], 'the writes of both releases are in the second restore')
    assert.equal(count(again, 'posts'), 100 + 50)
    t.diagnostic(
      `second loss: restored by hand with all ${before.length} writes from 0.3.13's time and ${afterUpgrade.length} from 0.5.17's`,
    )
  })
})
