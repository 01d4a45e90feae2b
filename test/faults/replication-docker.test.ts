// The image, for real, with LITESTREAM_REPLICA_URL: replication is one -e more. A first container on an
// empty volume seeds and replicates; `docker stop`; the volume is lost; a second container on an empty
// volume restores the database (it does not seed), with the writes made before the stop.
// Needs a Docker engine: ../shared/tools/docker-engine.sh starts one where Docker Hub is out of reach.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { chownSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import type { Token } from '../../harness/seed.ts'
import { ROOT } from '../../harness/tools.ts'
import { describeNeeding, waitHealthy } from '../helpers.ts'

// Bounded, so an engine that stops answering fails the test instead of hanging it.
const docker = (...args: string[]) =>
  execFileSync('docker', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 300_000 }).trim()
const engine = spawnSync('docker', ['info'], { stdio: 'ignore', timeout: 20_000 }).status === 0
const IMAGE = `twelve-dollar-feed-replication-test-${process.pid}`

describeNeeding(
  !engine && 'no Docker engine answers `docker info` (../shared/tools/docker-engine.sh starts one)',
  'the image with LITESTREAM_REPLICA_URL, under a real Docker engine',
  {},
  () => {
    const work = mkdtempSync(join(tmpdir(), 'feed-docker-'))
    const data = join(work, 'data')
    const replica = join(work, 'replica')
    const containers: string[] = []
    // Host folders for /data and /replica, owned by the image's node user (uid 1000).
    const emptyFolder = (path: string) => {
      rmSync(path, { recursive: true, force: true })
      mkdirSync(path)
      if (process.getuid?.() === 0) chownSync(path, 1000, 1000)
    }

    before(() => {
      docker('build', '-t', IMAGE, ROOT)
      emptyFolder(data)
      emptyFolder(replica)
    })
    after(() => {
      for (const id of containers) spawnSync('docker', ['rm', '-f', id], { stdio: 'ignore' })
      spawnSync('docker', ['image', 'rm', IMAGE], { stdio: 'ignore' })
      rmSync(work, { recursive: true, force: true })
    })

    // One more -e than the README's `docker run`, and the replica's folder mounted where the URL says.
    async function run() {
      const id = docker(
        'run',
        '-d',
        '-p',
        '127.0.0.1::3000',
        '-v',
        `${data}:/data`,
        '-v',
        `${replica}:/replica`,
        '-e',
        'LITESTREAM_REPLICA_URL=file:///replica',
        IMAGE,
      )
      containers.push(id)
      const url = `http://${docker('port', id, '3000/tcp').split('\n')[0]}`
      await waitHealthy(url, 180_000)
      const logs = () => {
        const out = spawnSync('docker', ['logs', id], { encoding: 'utf8' })
        return out.stdout + out.stderr
      }
      return { id, url, logs }
    }
    const stop = (id: string) => {
      docker('stop', '-t', '30', id)
      return Number(docker('inspect', '-f', '{{.State.ExitCode}}', id))
    }

    // The official image's binary; here docker-engine.sh's stand-in for it, the 0.5.17 build.
    test('carries Litestream 0.5.17 on the PATH', () => {
      assert.match(docker('run', '--rm', IMAGE, 'litestream', 'version'), /^v0\.5\.17(-|$)/)
    })

    test('seeds an empty volume and replicates; after docker stop and the volume lost, restores it on an empty one', async (t) => {
      const first = await run()
      assert.match(first.logs(), /nothing to restore, so the seed builds one/)
      const [user] = JSON.parse(readFileSync(join(data, 'tokens.json'), 'utf8')) as Token[]
      const posts: { id: number; body: string }[] = []
      for (let i = 0; i < 20; i++) {
        const body = `made in the first container, ${i}`
        const res = await fetch(`${first.url}/posts`, {
          method: 'POST',
          headers: { authorization: `Bearer ${user.token}` },
          body: JSON.stringify({ body }),
        })
        assert.equal(res.status, 201)
        posts.push({ id: (await res.json()).post.id, body })
      }
      assert.equal(stop(first.id), 0, 'docker stop: Litestream and the server exit 0')
      assert.match(first.logs(), /litestream shut down/)

      emptyFolder(data)
      const started = performance.now()
      const second = await run()
      t.diagnostic(
        `the second container restored and was healthy in ${((performance.now() - started) / 1000).toFixed(1)} s`,
      )
      assert.match(second.logs(), /start: restored \/data\/feed\.db/)
      assert.doesNotMatch(second.logs(), /seed: users/)
      for (const post of posts) {
        const res = await fetch(`${second.url}/posts/${post.id}`)
        assert.equal(res.status, 200)
        assert.equal((await res.json()).post.body, post.body)
      }
      assert.equal(stop(second.id), 0)
    })
  },
)
