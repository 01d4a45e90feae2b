// The benchmark's load scripts check what they get: a wrong status or body is counted, never timed.
// No speed is asserted here.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { freshSeededCopy, ROOT, startServer, type Server } from './helpers.ts'

const hasWrk = spawnSync('which', ['wrk']).status === 0
const db = freshSeededCopy()
const tokens = join(db.dir, 'tokens.txt')
let app: Server
let ceiling: Server

before(async () => {
  writeFileSync(tokens, db.tokens.map((t) => t.token).join('\n'))
  app = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
  ceiling = await startServer(process.execPath, ['bench/ceiling.ts'], { env: {} })
})
after(async () => {
  await Promise.all([app.stop(), ceiling.stop()])
  db.remove()
})

function wrk(url: string, kind: string) {
  const out = execFileSync('wrk', ['-t1', '-c4', '-d1s', '-s', join(ROOT, 'bench', 'wrk.lua'), url, '--', kind, tokens], { encoding: 'utf8' })
  return JSON.parse(out.trim().split('\n').at(-1)!) as { requests: number; bad: number; bad_example: string }
}

function users(url: string) {
  const out = execFileSync(process.execPath, [join(ROOT, 'bench', 'users.ts'), '--url', url, '--connections', '50', '--think-scale', '0.01', '--idle', '0', '--hold', '2', '--tokens', tokens], { encoding: 'utf8' })
  return JSON.parse(out.trim().split('\n').at(-1)!)
}

describe('bench/wrk.lua', { skip: !hasWrk && 'wrk is not installed (.ci/run installs it)' }, () => {
  test('passes every kind against the API', () => {
    for (const kind of ['feed', 'post', 'like', 'create', 'mix']) {
      const result = wrk(app.url, kind)
      assert.ok(result.requests > 0, kind)
      assert.equal(result.bad, 0, `${kind}: ${result.bad_example}`)
    }
  })

  test('counts every response that is not what the kind expects', () => {
    const result = wrk(ceiling.url, 'post') // the ceiling answers a feed to everything
    assert.ok(result.requests > 0)
    assert.equal(result.bad, result.requests)
    assert.match(result.bad_example, /^200 \{"posts"/)
  })
})

describe('bench/users.ts', () => {
  test('runs the k6 loop on every keep-alive connection and checks every answer', () => {
    const result = users(app.url)
    assert.equal(result.connections, 50)
    assert.ok(result.answered > 300, `answered ${result.answered}`)
    assert.equal(result.answered, result.sent)
    assert.deepEqual({ ...result.errors, example: '' }, { status: 0, body: 0, closed: 0, connect: 0, example: '' })
    assert.equal(result.unanswered, 0)
  })

  test('counts wrong answers as errors, not as latencies', () => {
    const result = users(ceiling.url)
    assert.ok(result.errors.body > 0, 'posts, likes and creates get a feed body from the ceiling')
    assert.ok(result.answered < result.sent)
  })
})
