// The challenge submission, run the way the challenge's CI runs it: install.sh (with a pre-placed
// tarball: nodejs.org is out of reach here), build.sh as a normal user, start.sh on a fresh copy of the
// seed with only the four variables, healthy within 60 s, then the contract. So on the default HTTP
// server, as the challenge runs it (its CI sets no HTTP_SERVER); the contract on node:http is
// test/contract.test.ts's (test/servers.ts).
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import {
  chmodSync,
  chownSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { DEFAULT_SECRET, freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { contractTests } from './contract.ts'
import { asUser, freePort, runnableByUser, waitHealthy } from './helpers.ts'

const work = mkdtempSync(join(tmpdir(), 'feed-challenge-'))
chmodSync(work, 0o755)
const submission = join(work, 'typescript-hono-node-sqlite')

after(() => rmSync(work, { recursive: true, force: true }))

describe('install.sh', () => {
  const version = /^NODE_VERSION=(\S+)$/m.exec(readFileSync(join(ROOT, 'challenge', 'install.sh'), 'utf8'))![1]
  const name = `node-v${version}-linux-x64`

  // A tarball in the official layout (node-vX-linux-x64/bin/node), made once, and its SHASUMS256.txt.
  const release = join(work, 'release')
  before(() => {
    mkdirSync(join(release, name, 'bin'), { recursive: true })
    cpSync(process.execPath, join(release, name, 'bin', 'node'))
    // xz's fastest level: the default takes minutes on a 120 MB binary.
    execFileSync('tar', ['-c', '-I', 'xz -0 -T0', '-f', join(release, `${name}.tar.xz`), '-C', release, name])
  })

  function preplace(downloads: string) {
    mkdirSync(downloads, { recursive: true })
    cpSync(join(release, `${name}.tar.xz`), join(downloads, `${name}.tar.xz`))
    const sha = createHash('sha256')
      .update(readFileSync(join(downloads, `${name}.tar.xz`)))
      .digest('hex')
    writeFileSync(join(downloads, 'SHASUMS256.txt'), `${'0'.repeat(64)}  ${name}.tar.gz\n${sha}  ${name}.tar.xz\n`)
  }

  const install = (prefix: string, downloads: string) =>
    spawnSync('bash', [join(ROOT, 'challenge', 'install.sh')], {
      encoding: 'utf8',
      env: { PATH: process.env.PATH, PREFIX: prefix, INSTALL_ROOT: join(prefix, 'opt'), DOWNLOADS: downloads },
    })

  test('installs the pinned release from a verified tarball and links node', (t) => {
    t.diagnostic(
      'the download from nodejs.org is not exercised: these machines cannot reach it; the tarball is pre-placed',
    )
    const prefix = join(work, 'good')
    preplace(join(prefix, 'downloads'))
    const run = install(prefix, join(prefix, 'downloads'))
    assert.equal(run.status, 0, run.stderr)
    assert.equal(execFileSync(join(prefix, 'bin', 'node'), ['--version'], { encoding: 'utf8' }).trim(), process.version)
    assert.match(run.stdout, new RegExp(`installed in .*/opt/${name}`))
    assert.match(run.stdout, /install\.sh: libmimalloc(2\.0|3) installed, for start\.sh to preload/)
  })

  test('refuses a tarball whose SHA-256 does not match, and installs nothing', () => {
    const prefix = join(work, 'tampered')
    const downloads = join(prefix, 'downloads')
    preplace(downloads)
    const tarball = join(downloads, `${name}.tar.xz`)
    const bytes = readFileSync(tarball)
    bytes[bytes.length - 100] ^= 0xff
    writeFileSync(tarball, bytes)
    const run = install(prefix, downloads)
    assert.equal(run.status, 1)
    assert.match(run.stderr, /does not match SHA-256/)
    assert.equal(existsSync(join(prefix, 'bin', 'node')), false)
    assert.equal(existsSync(tarball), false, 'the bad tarball is removed, so a rerun downloads it again')
  })
})

describe('build.sh and start.sh, as the challenge runs them', () => {
  const db = freshSeededCopy()
  let server: Server
  let healthySeconds = 0

  before(async () => {
    execFileSync(process.execPath, [join(ROOT, 'challenge', 'pack.mjs'), submission])
    const home = join(work, 'home')
    mkdirSync(home)
    // The Node install.sh would have linked, first on PATH, where the normal user can run it.
    const PATH = `${runnableByUser().dir}${delimiter}${process.env.PATH}`
    if (asUser.uid !== undefined) {
      execFileSync('chown', ['-R', `${asUser.uid}:${asUser.gid}`, submission, home])
      chownSync(db.dir, asUser.uid, asUser.gid!)
      execFileSync('chown', ['-R', `${asUser.uid}:${asUser.gid}`, db.dir])
    }
    const build = spawnSync('bash', ['build.sh'], {
      cwd: submission,
      encoding: 'utf8',
      // The machine's environment (its registry and CA settings), with the build user's own home.
      env: { ...process.env, PATH, HOME: home, npm_config_cache: join(home, '.npm') },
      ...asUser,
    })
    assert.equal(build.status, 0, build.stdout + build.stderr)
    const port = await freePort()
    server = await startServer('bash', ['start.sh'], {
      cwd: submission,
      env: { PATH, SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET, HOST: '127.0.0.1', PORT: String(port) },
      ...asUser,
    })
    assert.equal(server.url, `http://127.0.0.1:${port}`, 'listens on HOST:PORT')
    healthySeconds = await waitHealthy(server.url, 60_000)
  })

  after(async () => {
    if (server) await within(server.stop('SIGKILL'), 15_000, 'the server to exit on SIGKILL')
    db.remove()
  })

  test('packs a self-contained folder: the scripts, the README and the sources they build', () => {
    for (const file of [
      'install.sh',
      'build.sh',
      'start.sh',
      'README.md',
      'package.json',
      'package-lock.json',
      'build.mjs',
      'app.ts',
      'server/main.ts',
      'schema.sql',
    ]) {
      assert.ok(existsSync(join(submission, file)), file)
    }
    assert.ok(existsSync(join(submission, 'dist', 'app.js')), 'build.sh wrote the bundle')
  })

  test('says nothing about JWT_SECRET when it is set', () => {
    assert.doesNotMatch(server.output(), /JWT_SECRET/)
  })

  test('is healthy within 60 s', (t) => {
    t.diagnostic(`healthy ${healthySeconds.toFixed(2)} s after start.sh`)
    assert.ok(healthySeconds < 60)
  })

  contractTests(() => ({ url: server.url, tokens: db.tokens }))

  test('start.sh runs node with mimalloc preloaded', () => {
    assert.match(readFileSync(`/proc/${server.child.pid}/maps`, 'utf8'), /\/libmimalloc\.so\.[23]/)
  })

  test('start.sh hands SIGTERM to node, which exits 0', async () => {
    assert.equal(await within(server.stop('SIGTERM'), 15_000, 'node under start.sh to exit on SIGTERM'), 0)
  })
})
