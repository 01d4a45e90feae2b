// The container without a Docker engine: the Dockerfile is linted and read, and its runtime stage is
// laid out in an empty folder (what it copies, nothing else) and run the way the image runs it: its
// CMD, its ENV, its USER, its HEALTHCHECK, on an empty volume so the first-start seed runs.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { chmodSync, chownSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { contractTests } from './contract.ts'
import { ROOT, startServer, type Server, type Token } from './helpers.ts'

type Instruction = { keyword: string; args: string }

// Dockerfile instructions by stage, continuation lines joined, comments dropped.
function readDockerfile(path: string): Instruction[][] {
  const lines = readFileSync(path, 'utf8').replace(/\\\n\s*/g, '').split('\n')
  const stages: Instruction[][] = []
  for (const line of lines.map((l) => l.trim()).filter((l) => l && !l.startsWith('#'))) {
    const [, keyword, args] = /^(\S+)\s+(.*)$/.exec(line)!
    if (keyword.toUpperCase() === 'FROM') stages.push([])
    stages.at(-1)!.push({ keyword: keyword.toUpperCase(), args })
  }
  return stages
}

const stages = readDockerfile(join(ROOT, 'Dockerfile'))
const runtime = stages.at(-1)!
const one = (keyword: string) => {
  const found = runtime.filter((i) => i.keyword === keyword)
  assert.equal(found.length, 1, `one ${keyword} in the runtime stage`)
  return found[0].args
}
const execForm = (args: string) => JSON.parse(args) as string[]

// The image's Node user (uid 1000 in the official images), when these tests may switch to it.
const NODE_USER = process.getuid?.() === 0 ? { uid: 1000, gid: 1000 } : {}

describe('Dockerfile', () => {
  test('lints clean with dockerfile-utils', () => {
    const lint = execFileSync(join(ROOT, 'node_modules', '.bin', 'dockerfile-utils'), ['lint', join(ROOT, 'Dockerfile')], { encoding: 'utf8' })
    assert.equal(lint.trim(), '', lint)
  })

  test('builds from a Node 24 base pinned to an exact version, in both stages', () => {
    const bases = stages.map((stage) => stage[0].args.split(/\s+/)[0])
    for (const base of bases) assert.match(base, /^node:24\.\d+\.\d+-[a-z]+-slim$/)
    assert.equal(new Set(bases).size, 1, 'the build and the runtime use the same Node')
  })

  test('sends only what the build stage copies into the build context', () => {
    const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').filter((l) => l.startsWith('!')).map((l) => l.slice(1))
    const copied = stages[0].filter((i) => i.keyword === 'COPY').flatMap((i) => i.args.split(/\s+/).slice(0, -1))
    assert.deepEqual([...copied].sort(), [...ignore].sort())
    for (const file of copied) assert.ok(existsSync(join(ROOT, file)), file)
  })

  test('gives node the same flags as challenge/start.sh and npm start', () => {
    const [, ...args] = execForm(one('CMD'))
    const flags = args.slice(0, -1)
    const startSh = readFileSync(join(ROOT, 'challenge', 'start.sh'), 'utf8')
    assert.match(startSh, new RegExp(`^exec node ${flags.join(' ')} dist/app\\.js$`, 'm'))
    const { scripts } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'))
    assert.match(scripts.start, new RegExp(`node ${flags.join(' ')} dist/start\\.js$`))
  })

  test('runs as a non-root user, with exec-form CMD and HEALTHCHECK that need only node', () => {
    assert.notEqual(one('USER'), 'root')
    assert.equal(execForm(one('CMD'))[0], 'node')
    const healthcheck = /^(--\S+\s+)*CMD\s+(\[.*\])$/.exec(one('HEALTHCHECK'))
    assert.ok(healthcheck, 'HEALTHCHECK ... CMD [exec form]')
    assert.equal(execForm(healthcheck[2])[0], 'node')
  })
})

describe('the runtime stage, laid out and run without Docker', () => {
  // The image's filesystem in a temporary folder: WORKDIR and VOLUME live under it.
  const root = mkdtempSync(join(tmpdir(), 'feed-image-'))
  const inImage = (path: string) => join(root, path)
  const workdir = one('WORKDIR')
  const volume = execForm(one('VOLUME'))[0]
  const env = Object.fromEntries(one('ENV').split(/\s+/).map((pair) => pair.split('=') as [string, string]))
  // The image's paths, moved under the folder; the port is the one thing changed: any free one.
  const runEnv = {
    ...Object.fromEntries(Object.entries(env).map(([key, value]) => [key, value.startsWith('/') ? inImage(value) : value])),
    HOST: '127.0.0.1',
    PORT: '0',
  }
  const tokens = (): Token[] => JSON.parse(readFileSync(join(inImage(volume), 'tokens.json'), 'utf8'))
  let server: Server

  before(async () => {
    chmodSync(root, 0o755)
    for (const copy of runtime.filter((i) => i.keyword === 'COPY')) {
      const [from, source, target] = copy.args.split(/\s+/)
      assert.equal(from, '--from=build', 'the runtime stage copies only from the build stage')
      // Litestream's binary, used only with LITESTREAM_REPLICA_URL: test/faults/replication.test.ts runs it.
      if (source === '/src/litestream/' && target === '/usr/local/bin/') continue
      assert.equal(source, '/src/dist/', 'and only the bundles')
      cpSync(join(ROOT, 'dist'), join(inImage(workdir), target), { recursive: true })
    }
    mkdirSync(inImage(volume))
    if (NODE_USER.uid !== undefined) chownSync(inImage(volume), NODE_USER.uid, NODE_USER.gid!)
    const [, ...args] = execForm(one('CMD'))
    server = await startServer(process.execPath, args, { env: runEnv, cwd: inImage(workdir), ...NODE_USER })
  })

  after(async () => {
    await server?.stop('SIGKILL')
    rmSync(root, { recursive: true, force: true })
  })

  test('holds the bundles only: no source, no node_modules', () => {
    assert.deepEqual(readdirSync(inImage(workdir)), ['dist'])
    assert.deepEqual(readdirSync(join(inImage(workdir), 'dist')).sort(), ['app.js', 'seed.js', 'start.js'])
    const size = readdirSync(join(inImage(workdir), 'dist')).reduce((sum, f) => sum + readFileSync(join(inImage(workdir), 'dist', f)).length, 0)
    assert.ok(size < 1024 * 1024, `the image adds ${size} bytes to its base`)
  })

  test('seeded the empty volume on the first start, with progress in the log, then served', () => {
    assert.match(server.output(), /seed: likes 100% \(2,016,005 of 2,016,005\)/)
    assert.match(server.output(), /checksum 738d11ab…cf1d ok/)
    const owner = statSync(join(inImage(volume), 'feed.db')).uid
    if (NODE_USER.uid !== undefined) assert.equal(owner, NODE_USER.uid, 'written by the image user, not root')
  })

  test('answers its HEALTHCHECK', () => {
    const [, ...args] = execForm(/CMD\s+(\[.*\])$/.exec(one('HEALTHCHECK'))![1])
    const port = new URL(server.url).port
    const check = spawnSync(process.execPath, args, { env: { ...runEnv, PORT: port }, cwd: inImage(workdir), ...NODE_USER })
    assert.equal(check.status, 0, check.stderr?.toString())
  })

  contractTests(() => ({ url: server.url, tokens: tokens() }))

  test('stops on SIGTERM with exit code 0', async () => {
    assert.equal(await server.stop('SIGTERM'), 0)
    assert.equal(existsSync(join(inImage(volume), 'feed.db-wal')), false, 'the WAL was checkpointed')
  })

  test('restarts on the same volume without seeding again, with its writes kept', async () => {
    const [, ...args] = execForm(one('CMD'))
    server = await startServer(process.execPath, args, { env: runEnv, cwd: inImage(workdir), ...NODE_USER })
    assert.match(server.output(), /exists, serving it as it is/)
    assert.doesNotMatch(server.output(), /seed: users/)
    const feed = await (await fetch(`${server.url}/feed`)).json()
    assert.ok(feed.posts[0].id > 500_000, 'the posts written before the restart are still there')
    assert.equal(await server.stop('SIGTERM'), 0)
  })
})
