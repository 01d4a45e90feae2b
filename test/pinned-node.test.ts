// The project brings its own Node: npm installs the pinned build from the registry, npm scripts run it,
// and every place that names a Node version names the same one.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { delimiter, dirname, join } from 'node:path'
import { after, describe, test } from 'node:test'
import { ROOT } from '../harness/tools.ts'

const read = (path: string) => readFileSync(join(ROOT, path), 'utf8')
const PIN = read('.nvmrc').trim()
const pinnedNode = JSON.parse(read('pinned-node/package.json'))

describe('the pin', () => {
  test('is one exact version', () => {
    assert.match(PIN, /^\d+\.\d+\.\d+$/)
  })

  test('is what pinned-node installs, on every platform it lists', () => {
    assert.equal(pinnedNode.version, PIN)
    const builds = Object.entries(pinnedNode.optionalDependencies)
    assert.ok(builds.length >= 2)
    for (const [name, version] of builds) assert.equal(version, PIN, name)
  })

  test('agrees with engines, the Dockerfile, the challenge install and the bundle target', () => {
    assert.equal(JSON.parse(read('package.json')).engines.node, `>=${PIN}`)
    const bases = [...read('Dockerfile').matchAll(/^FROM node:(\S+)/gm)].map((m) => m[1])
    assert.ok(bases.length > 0)
    for (const base of bases) assert.match(base, new RegExp(`^${PIN.replaceAll('.', '\\.')}-[a-z]+-slim$`))
    assert.match(read('challenge/install.sh'), new RegExp(`^NODE_VERSION=${PIN}$`, 'm'))
    assert.match(read('build.mjs'), new RegExp(`target: 'node${PIN.split('.')[0]}'`))
  })

  test('runs these tests, when npm installed it', (t) => {
    const linked = join(ROOT, 'node_modules', '.bin', 'node')
    if (!existsSync(linked)) return t.skip('no pinned build for this platform: the tests run on the Node you chose')
    assert.equal(realpathSync(process.execPath), realpathSync(linked))
    assert.equal(process.version, `v${PIN}`)
  })
})

// A Node older than the pin, as most machines have (Debian's, Ubuntu's): the first one on PATH that
// is not ours.
function olderNode(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    const candidate = join(dir, 'node')
    if (dir.includes('node_modules') || !existsSync(candidate)) continue
    const version = spawnSync(candidate, ['--version'], { encoding: 'utf8' }).stdout?.trim()
    if (version && Number(version.slice(1).split('.')[0]) < Number(PIN.split('.')[0])) return candidate
  }
}

describe('on an older Node, npm start and npm test stop at once with one line', () => {
  const old = olderNode()
  const skip = old ? false : 'no Node older than the pin on PATH here'
  const dir = mkdtempSync(join(tmpdir(), 'feed-old-node-'))
  after(() => rmSync(dir, { recursive: true, force: true }))

  // The project's package.json and check, without node_modules: what a clone holds before npm install.
  function clone() {
    rmSync(dir, { recursive: true, force: true })
    mkdirSync(dir)
    for (const file of ['package.json', '.nvmrc', 'pinned-node'])
      cpSync(join(ROOT, file), join(dir, file), { recursive: true })
  }
  // npm puts node_modules/.bin first on PATH; with nothing there, the older node answers.
  const npm = (script: string) =>
    spawnSync('npm', [script], {
      cwd: dir,
      encoding: 'utf8',
      env: { ...process.env, PATH: `${dirname(old!)}${delimiter}${process.env.PATH}` },
    })

  for (const script of ['start', 'test']) {
    test(`npm ${script} before npm install: says to run it`, { skip }, () => {
      clone()
      const run = npm(script)
      assert.equal(run.status, 1)
      const lines = run.stderr.split('\n').filter((line) => line && !line.startsWith('npm'))
      assert.deepEqual(lines, [
        `This project needs Node.js ${PIN} or newer, found ${execFileSync(old!, ['--version'], { encoding: 'utf8' }).trim()} (${realpathSync(old!)}): run \`npm install\` first, which brings the pinned Node.js for this machine.`,
      ])
    })
  }

  test('npm start where the registry has no build for the platform: says how to get one', { skip }, () => {
    clone()
    mkdirSync(join(dir, 'node_modules', 'pinned-node'), { recursive: true })
    writeFileSync(join(dir, 'node_modules', 'pinned-node', 'package.json'), read('pinned-node/package.json'))
    const run = npm('start')
    assert.equal(run.status, 1)
    const lines = run.stderr.split('\n').filter((line) => line && !line.startsWith('npm'))
    assert.equal(lines.length, 1, run.stderr)
    assert.match(
      lines[0],
      new RegExp(
        `needs Node.js ${PIN} or newer, found v\\d+.*: the npm registry has no Node.js ${PIN} build for ${process.platform}-${process.arch}: install it with nvm \\(\`nvm install\` reads .nvmrc\\) or from https://nodejs.org\\.$`,
      ),
    )
    assert.doesNotMatch(run.stdout + run.stderr, /node:sqlite|ERR_|at .*\.js:\d+/)
  })
})
