// load.js, the k6 scenario, against the real server: under the real k6 where it is here (as CI lays
// out ../shared/tools, or K6), on each HTTP server, and through a minimal k6 stand-in that pins each
// branch of its loop.
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { readFileSync, writeFileSync } from 'node:fs'
import { registerHooks } from 'node:module'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { pathToFileURL } from 'node:url'
import { after, before, describe } from 'node:test'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { K6_BIN, ROOT } from '../harness/tools.ts'
import { describeNeeding } from './helpers.ts'
import { forEachServer, test } from './servers.ts'

const K6 = { k6: 'k6.js', 'k6/http': 'http.js', 'k6/data': 'data.js' } as Record<string, string>
registerHooks({
  resolve: (specifier, context, next) =>
    specifier in K6
      ? { url: pathToFileURL(join(ROOT, 'test', 'k6', K6[specifier])).href, shortCircuit: true }
      : next(specifier, context),
})
const { recorded } = await import('k6')
const { requests } = (await import('k6/http')) as unknown as {
  requests: { method: string; url: string; status: number; name: string; headers: Record<string, string> }[]
}

const db = freshSeededCopy()
let server: Server
const k6Globals = globalThis as unknown as Record<string, unknown>

before(async () => {
  server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
  k6Globals.open = (path: string) =>
    path === db.path.replace('feed.db', 'tokens.json') ? JSON.stringify(db.tokens) : assert.fail(`opened ${path}`)
})
after(async () => {
  await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
  db.remove()
})

// Imports a fresh copy of load.js with these k6 -e variables.
async function loadScenario(env: Record<string, string>) {
  k6Globals.__ENV = { BASE_URL: server.url, TOKENS: db.path.replace('feed.db', 'tokens.json'), ...env }
  return import(`${pathToFileURL(join(ROOT, 'load.js')).href}?${new URLSearchParams(env)}`)
}

// Runs one loop of virtual user `vu` with Math.random fixed, so every branch is chosen on purpose.
function runLoop(scenario: { default: () => void }, vu: number, random: number) {
  const original = Math.random
  Object.assign(k6Globals, { __VU: vu, __ITER: 0 })
  Math.random = () => random
  try {
    recorded.checks.length = recorded.sleeps.length = requests.length = 0
    scenario.default()
  } finally {
    Math.random = original
  }
}

describe('load.js', () => {
  test('ramps VUS users up over RAMP_UP, holds them DURATION, with the challenge thresholds', async () => {
    const { options } = await loadScenario({ VUS: '3000', RAMP_UP: '10s', DURATION: '1m' })
    assert.deepEqual(options.scenarios.users.stages, [
      { duration: '10s', target: 3000 },
      { duration: '1m', target: 3000 },
      { duration: '30s', target: 0 },
    ])
    assert.deepEqual(options.thresholds, {
      http_req_duration: ['p(95)<500', 'p(99)<1000'],
      http_req_failed: ['rate<0.01'],
    })
  })

  test('refuses an unknown MIX', async () => {
    await assert.rejects(loadScenario({ MIX: 'read-only' }), /MIX must be one of realistic, write-heavy/)
  })

  test('a realistic loop reads the feed, opens a post from it, and thinks 3-7, 3-8 and 5-15 s', async () => {
    const scenario = await loadScenario({ MIX: 'realistic' })
    runLoop(scenario, 1, 0.5) // 0.5: no like (p 0.15), no write (p 0.02)
    assert.deepEqual(
      requests.map((r) => `${r.method} ${r.name} ${r.status}`),
      ['GET GET /feed 200', 'GET GET /posts/:id 200'],
    )
    assert.ok(
      recorded.checks.every((c) => c.ok),
      JSON.stringify(recorded.checks),
    )
    assert.deepEqual(recorded.sleeps, [5, 5.5, 10])
  })

  test('a realistic loop that likes and writes sends both with the user token, and the server takes them', async () => {
    const scenario = await loadScenario({ MIX: 'realistic' })
    runLoop(scenario, 3, 0.01) // 0.01: under both probabilities
    assert.deepEqual(
      requests.map((r) => `${r.method} ${r.name}`),
      ['GET GET /feed', 'GET GET /posts/:id', 'POST POST /posts/:id/like', 'POST POST /posts'],
    )
    assert.deepEqual(
      requests.slice(2).map((r) => r.status),
      [201, 201],
    )
    assert.equal(requests[2].headers.Authorization, `Bearer ${db.tokens[2].token}`)
    assert.ok(
      recorded.checks.every((c) => c.ok),
      JSON.stringify(recorded.checks),
    )
  })

  test('write-heavy likes every opened post and writes in half the loops', async () => {
    const scenario = await loadScenario({ MIX: 'write-heavy' })
    runLoop(scenario, 4, 0.6)
    assert.deepEqual(
      requests.map((r) => r.name),
      ['GET /feed', 'GET /posts/:id', 'POST /posts/:id/like'],
    )
    runLoop(scenario, 4, 0.4)
    assert.deepEqual(
      requests.map((r) => r.name),
      ['GET /feed', 'GET /posts/:id', 'POST /posts/:id/like', 'POST /posts'],
    )
    assert.ok(
      recorded.checks.every((c) => c.ok),
      JSON.stringify(recorded.checks),
    )
  })
})

const k6Binary = K6_BIN

// The challenge's load against each HTTP server (test/servers.ts), each a server of its own on the file's
// copy of the seed. The stand-in's loops above are load.js's logic, checked against the default server.
forEachServer("the challenge's load", (HTTP_SERVER) => {
  describeNeeding(!k6Binary && 'no k6 here (K6, ../shared/tools/k6 or PATH)', 'load.js under the real k6', {}, () => {
    let loaded: Server
    before(async () => {
      loaded = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path, HTTP_SERVER } })
    })
    after(() => within(loaded.stop(), 15_000, 'the server to exit on SIGTERM'))

    test('300 users ramped in 2 s and held 8 s: the thresholds pass, every check and request succeeds', async () => {
      const summary = join(db.dir, 'k6-summary.json')
      const tokens = join(db.dir, 'tokens.json')
      writeFileSync(tokens, JSON.stringify(db.tokens))
      // RAMP_UP, DURATION and a 1 s RAMP_DOWN (the challenge's 30 s, and as long again for loops to end,
      // took a minute): about 12 s in all.
      const { stdout } = await promisify(execFile)(
        k6Binary!,
        [
          'run',
          '--quiet',
          '--no-color',
          '--summary-export',
          summary,
          '-e',
          `BASE_URL=${loaded.url}`,
          '-e',
          'VUS=300',
          '-e',
          'RAMP_UP=2s',
          '-e',
          'DURATION=8s',
          '-e',
          'RAMP_DOWN=1s',
          '-e',
          `TOKENS=${tokens}`,
          join(ROOT, 'load.js'),
        ],
        { encoding: 'utf8', timeout: 120_000, env: { ...process.env, K6_NO_USAGE_REPORT: 'true' } },
      )
      const metrics = JSON.parse(readFileSync(summary, 'utf8')).metrics
      assert.ok(
        metrics.http_reqs.count >= 300,
        `${metrics.http_reqs.count} requests: every user asked at least for the feed\n${stdout}`,
      )
      assert.equal(metrics.http_req_failed.value, 0)
      assert.equal(metrics.checks.fails, 0)
      assert.ok(metrics.checks.passes >= metrics.http_reqs.count, 'a check on every answer')
    })
  })
})
