// test/servers.ts's forEachServer, on a suite of its own run by node:test in a process of its own: each
// case once a server, a difference's skip printed with its reason on that server alone, a difference
// that names no case a failure, and HTTP_SERVER choosing one server.
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
import { after, describe, test } from 'node:test'

const dir = mkdtempSync(join(tmpdir(), 'feed-servers-'))
after(() => rmSync(dir, { recursive: true, force: true }))

// Runs a suite of two cases with the given differences; what node:test printed (TAP), and its exit code.
function run(differences: unknown[], env: Record<string, string> = {}) {
  const file = join(dir, `suite-${Math.random().toString(36).slice(2)}.test.ts`)
  writeFileSync(
    file,
    `import assert from 'node:assert/strict'
import { forEachServer, test } from ${JSON.stringify(pathToFileURL(join(import.meta.dirname, 'servers.ts')).href)}
forEachServer('a suite', (server) => {
  test('runs', () => assert.ok(server === 'net' || server === 'node-server'))
  test('differs', () => assert.equal(server, 'net'))
}, { differences: ${JSON.stringify(differences)} })
`,
  )
  const { stdout, status } = spawnSync(process.execPath, ['--test', '--test-reporter=tap', file], {
    encoding: 'utf8',
    timeout: 30_000,
    env: { PATH: process.env.PATH, ...env },
  })
  return { tap: stdout, status }
}

describe('forEachServer', () => {
  test('runs each case once for each server; a difference skips its case on its server alone, with the reason', () => {
    const { tap, status } = run([{ server: 'node-server', test: 'differs', reason: 'known: a test of the helper' }])
    assert.equal(status, 0, tap)
    assert.match(tap, /# Subtest: a suite \(HTTP_SERVER=net\)/)
    assert.match(tap, /# Subtest: a suite \(HTTP_SERVER=node-server\)/)
    assert.equal(tap.match(/^ {4}ok \d+ - runs$/gm)?.length, 2, tap)
    assert.match(tap, /^ {4}ok \d+ - differs$/m)
    assert.match(tap, /^ {4}ok \d+ - differs # SKIP node-server: known: a test of the helper$/m)
  })

  test('a case that fails on a server with no difference for it fails the run', () => {
    const { tap, status } = run([])
    assert.equal(status, 1, tap)
    assert.match(tap, /^ {4}not ok \d+ - differs$/m)
  })

  test('a difference that names no case of the suite fails the run, naming it', () => {
    const { tap, status } = run([
      { server: 'node-server', test: 'differs', reason: 'r' },
      { server: 'net', test: 'gone', reason: 'renamed since' },
    ])
    assert.equal(status, 1, tap)
    assert.match(tap, /not ok \d+ - the difference on net names a case of the suite: "gone"/)
  })

  test('with HTTP_SERVER set, the other server is one skipped test that says so', () => {
    const { tap, status } = run([], { HTTP_SERVER: 'net' })
    assert.equal(status, 0, tap)
    assert.match(tap, /ok \d+ - a suite \(HTTP_SERVER=node-server\) # SKIP this run is for HTTP_SERVER=net alone/)
    assert.doesNotMatch(tap, /not ok/)
  })
})
