// The benchmark's own tests, beside it (npm test runs them; they import the bench's modules, which
// test/ may not): its load scripts check what they get, a wrong status or body counted, never timed; its
// readers of /proc and perf; the score's percentiles; the floors, held to the goldens and to ours'
// answers. No speed is asserted here.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { type AddressInfo, createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { exchange } from '../harness/client.ts'
import { treeCpu, treeSwitches } from '../harness/proc.ts'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { countSyscalls } from './lib.ts'
import { k6Percentile, levelsOfLog, limitOf, type Scoring } from './score-level.ts'
import { confirm, search } from './score-search.ts'
import { send, sendInTurn, sequence } from './sequence.ts'
import { usersVariantsOf } from './users-comparison.ts'

// wrk: .ci/run installs it. Missing, its tests skip, or fail where REQUIRE_TOOLS says every tool is here (CI).
const noWrk = spawnSync('which', ['wrk']).status !== 0 && 'wrk is not installed (.ci/run installs it)'
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
  const out = execFileSync(
    'wrk',
    ['-t1', '-c4', '-d1s', '-s', join(ROOT, 'bench', 'wrk.lua'), url, '--', kind, tokens],
    { encoding: 'utf8' },
  )
  return JSON.parse(out.trim().split('\n').at(-1)!) as { requests: number; bad: number; bad_example: string }
}

function users(url: string, ...more: string[]) {
  const out = execFileSync(
    process.execPath,
    [
      join(ROOT, 'bench', 'users.ts'),
      '--url',
      url,
      '--connections',
      '50',
      '--think-scale',
      '0.01',
      '--idle',
      '0',
      '--hold',
      '2',
      '--tokens',
      tokens,
      ...more,
    ],
    { encoding: 'utf8', timeout: 60_000 },
  )
  return JSON.parse(out.trim().split('\n').at(-1)!)
}

describe('bench/wrk.lua', { skip: !process.env.REQUIRE_TOOLS && noWrk }, () => {
  before(() => assert.ok(!noWrk, `REQUIRE_TOOLS is set, and ${noWrk}`))
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

  test('with --loop-on-arrival, loops from each arrival through the ramp, and measures the hold alone', () => {
    const result = users(app.url, '--ramp', '1', '--loop-on-arrival')
    assert.equal(result.connections, 50)
    assert.ok(result.answered > 300, `answered ${result.answered}`)
    assert.deepEqual({ ...result.errors, example: '' }, { status: 0, body: 0, closed: 0, connect: 0, example: '' })
    assert.equal(result.unanswered, 0)
    assert.ok(result.seconds < 3, `the hold alone is measured: ${result.seconds} s`)
  })

  test('counts wrong answers as errors, not as latencies', () => {
    const result = users(ceiling.url)
    assert.ok(result.errors.body > 0, 'posts, likes and creates get a feed body from the ceiling')
    assert.ok(result.answered < result.sent)
  })
})

// What the users holds read of the server over their window (bench/users-comparison.ts): every thread's CPU and
// context switches from /proc, and its syscalls from perf, or why perf could not count them.
describe('harness/proc.ts and bench/lib.ts', () => {
  test("reads a server's CPU, context switches and syscalls over a window of requests", async () => {
    const pid = app.child.pid!
    const perf = countSyscalls([pid])
    await new Promise((resolve) => setTimeout(resolve, 500)) // perf attaches to every thread
    const [cpu, switches] = [treeCpu(pid), treeSwitches(pid)]
    // Enough for a few of the clock's ticks of CPU time (10 ms each) on a server the tests above warmed up.
    await send(
      Number(new URL(app.url).port),
      sequence(
        'mix',
        1_000,
        db.tokens.map((t) => t.token),
      ),
    )
    const [cpuAfter, switchesAfter] = [treeCpu(pid), treeSwitches(pid)]
    const syscalls = await perf.stop()
    assert.ok(cpuAfter.user + cpuAfter.system > cpu.user + cpu.system, 'CPU time went up')
    // One request at a time: the server waits in epoll_wait for many, each wait a voluntary switch (at
    // least a tenth of them: 473 of 1,000 were seen once, 197 with another test file loading the
    // machine; the next request is often there before the wait).
    assert.ok(
      switchesAfter.voluntary - switches.voluntary >= 100,
      `${switchesAfter.voluntary - switches.voluntary} voluntary switches`,
    )
    if (syscalls.count === undefined) assert.match(syscalls.note!, /perf/)
    else assert.ok(syscalls.count >= 3 * 1_000, `${syscalls.count} syscalls`) // a read, a write and an epoll_wait at least
  })
})

// The score's pass line is k6's: its percentiles interpolate between ranks (k6's Trend), unlike a
// nearest rank, which moves a p99 by a whole sample.
describe('bench/score.ts', () => {
  test('takes percentiles as k6 does', () => {
    const sorted = Array.from({ length: 10 }, (_, i) => i + 1)
    assert.equal(k6Percentile(sorted, 50), 5.5)
    assert.ok(Math.abs(k6Percentile(sorted, 95) - 9.55) < 1e-9)
    assert.equal(k6Percentile(sorted, 100), 10)
    assert.equal(k6Percentile([7], 99), 7)
    assert.equal(k6Percentile([], 99), 0)
  })

  test('names what failed a level first, and a level slow with every request answered as latency', () => {
    const level = { outOfMemory: false, said: '', server_cpu: 0.89, failed: 0, complete: true }
    assert.equal(limitOf(level), 'latency') // 52,500 users on 2026-12-03: p99 1.8 s, nothing failed
    assert.equal(limitOf({ ...level, server_cpu: 0.95 }), 'cpu')
    assert.equal(limitOf({ ...level, failed: 0.02 }), 'errors')
    assert.equal(limitOf({ ...level, complete: false }), 'errors')
    assert.equal(limitOf({ ...level, server_cpu: 0.95, said: 'Error: EMFILE: too many open files' }), 'files')
    assert.equal(limitOf({ ...level, server_cpu: 0.95, failed: 0.5, outOfMemory: true }), 'memory')
  })

  // A resumed run takes its log's levels in the search's own order, and measures only past them; a log
  // of another commit, or levels in another order, is refused rather than mixed in.
  test('resumes a search from its log, and refuses a log of another run', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'score-'))
    const run = { commit: 'abc1234', full: true, flags: ['--max-old-space-size=1536'], confirmFrom: null }
    const passes = (users: number) => users <= 8100 // the search: 2,500 .. 10,000, then narrowing to 250
    const taken = [2500, 5000, 10000, 7500, 8750, 8250, 8000].map((users, i) => ({
      users,
      phase: i < 3 ? 'search' : 'narrowing',
      pass: passes(users),
    }))
    const log = join(dir, 'run.log')
    writeFileSync(
      log,
      [{ run }, ...taken].map((line) => `2026-12-06T00:00:00Z a progress line\n${JSON.stringify(line)}`).join('\n'),
    )
    const scoring = (replay: object[]) => ({ levels: [], replay, remaining: () => 0 }) as unknown as Scoring
    const lengths = { warmup: { ramp: 1, hold: 1 }, search: { ramp: 1, hold: 1 }, confirm: { ramp: 1, hold: 1 } }
    const s = scoring(levelsOfLog(log, run))
    const { passed, resolution } = await search(s, { full: true, lengths, expected: 2500 })
    assert.deepEqual([passed, resolution, s.levels.length, s.replay.length], [8000, 250, 7, 0])
    assert.throws(() => levelsOfLog(log, { ...run, commit: 'def5678' }), /is a run of .*abc1234/)
    const reordered = scoring([taken[1], ...taken.slice(1)])
    await assert.rejects(search(reordered, { full: true, lengths, expected: 2500 }), /next level is search at 5000/)
  })

  test('confirms by 5-minute holds: steps down doubling until one holds, then halves the bracket', async () => {
    const holds = (users: number) => users <= 7100
    const asked = [8000, 7750, 7250, 6250, 6750, 7000]
    const replay = asked.map((users) => ({ users, phase: 'confirmation', pass: holds(users) }))
    const s = { levels: [], replay, remaining: () => 0 } as unknown as Scoring
    const lengths = { warmup: { ramp: 1, hold: 1 }, search: { ramp: 1, hold: 1 }, confirm: { ramp: 1, hold: 300 } }
    const { score, confirmed } = await confirm(s, { from: 8000, resolution: 250, lengths })
    assert.deepEqual([score, confirmed?.users, s.replay.length], [7000, 7000, 0])
    const none = {
      levels: [],
      replay: [2500, 2250, 1750, 750].map((users) => ({ users, phase: 'confirmation', pass: false })),
      remaining: () => 0,
    } as unknown as Scoring
    const nothing = await confirm(none, { from: 2500, resolution: 250, lengths })
    assert.deepEqual([nothing.score, nothing.confirmed?.users, nothing.confirmed?.pass], [0, 750, false])
  })
})

// A floor is only a floor if it does the same work: the same answers, byte for byte but for the new
// post's id and time, to the requests the instruction counts send. Each of the three: bench/floor.ts on
// node:http, bench/floor-net.ts on node:net, bench/floor-hono.ts on node:net through Hono.
const GOLDENS = [
  ['/feed', 'feed.json'],
  ['/posts/1', 'post-1.json'],
  ['/posts/250000', 'post-250000.json'],
  ['/posts/500000', 'post-500000.json'],
]

// A floor on a fresh seeded copy of its own, for one test.
async function withFloor(
  script: string,
  use: (server: Server, seeded: ReturnType<typeof freshSeededCopy>) => Promise<void>,
) {
  const seeded = freshSeededCopy()
  const server = await startServer(process.execPath, [script], { env: { SQLITE_PATH: seeded.path } })
  try {
    await use(server, seeded)
  } finally {
    await server.stop()
    seeded.remove()
  }
}

for (const script of ['bench/floor.ts', 'bench/floor-net.ts', 'bench/floor-hono.ts']) {
  describe(script, () => {
    const [oursDb, floorDb] = [freshSeededCopy(), freshSeededCopy()]
    let ours: Server
    let floor: Server
    before(async () => {
      ours = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: oursDb.path } })
      floor = await startServer(process.execPath, [script], { env: { SQLITE_PATH: floorDb.path } })
    })
    after(async () => {
      await Promise.all([ours.stop(), floor.stop()])
      oursDb.remove()
      floorDb.remove()
    })
    const ask = (server: Server, bytes: string) => exchange(Number(new URL(server.url).port), bytes)

    // Its statements are copies of app.ts's (bench/floor-sql.ts): these are what says they still read
    // and write what ours does.
    test('answers the goldens byte for byte on a fresh seed, then a new post and a like of it with 201', async () => {
      await withFloor(script, async (server, seeded) => {
        for (const [path, file] of GOLDENS) {
          const res = await fetch(server.url + path)
          assert.equal(res.status, 200, path)
          assert.equal(res.headers.get('content-type'), 'application/json', path)
          assert.equal(
            Buffer.compare(Buffer.from(await res.arrayBuffer()), readFileSync(join(ROOT, 'test', 'golden', file))),
            0,
            `${path} is ${file}`,
          )
        }
        const { token, username } = seeded.tokens[0]
        const write = (path: string, body?: string) =>
          fetch(server.url + path, {
            method: 'POST',
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
            body,
          })
        const created = await write('/posts', '{"body":" hello, floor "}')
        assert.equal(created.status, 201)
        const text = await created.text()
        assert.match(
          text,
          new RegExp(
            `^\\{"post":\\{"id":500001,"body":"hello, floor","created_at":"\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z","author":"${username}","like_count":0\\}\\}$`,
          ),
        )
        const liked = await write('/posts/500001/like')
        assert.equal(liked.status, 201)
        assert.equal(await liked.text(), '{"liked":true,"already_liked":false,"post_id":500001}')
      })
    })

    // Every answer framed by a Content-Length where ours has one (bench/users.ts reads nothing else),
    // the refusals the benchmark's requests can meet included.
    test('answers the goldens, a like twice, a new post and the refusals as ours does, headers included', async () => {
      const token = db.tokens[0].token
      const post = (path: string, auth: string, body = '') =>
        `POST ${path} HTTP/1.1\r\nHost: t\r\n${auth && `Authorization: Bearer ${auth}\r\n`}Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
      const requests = [
        'GET /feed HTTP/1.1\r\nHost: t\r\n\r\n',
        'GET /posts/1 HTTP/1.1\r\nHost: t\r\n\r\n',
        'GET /posts/500001 HTTP/1.1\r\nHost: t\r\n\r\n',
        post('/posts/7/like', token),
        post('/posts/7/like', token),
        post('/posts', token, '{"body":" hello "}'),
        // The refusals: no such post, a malformed id, no token, a bad token, a malformed or empty body.
        post('/posts/900000/like', token),
        post('/posts/x7/like', token),
        'GET /posts/x7 HTTP/1.1\r\nHost: t\r\n\r\n',
        post('/posts/7/like', ''),
        post('/posts/7/like', `${token.slice(0, -4)}AAAA`),
        post('/posts/7/like', 'a.b.c'),
        post('/posts', token, '{"body"'),
        post('/posts', token, '{"body":"  "}'),
        'GET /nothing HTTP/1.1\r\nHost: t\r\n\r\n',
      ]
      const withoutDate = (raw: string) =>
        raw
          .replace(/^date: .*\r\n/im, '')
          .replace(/"id":500001,(.*)"created_at":"[^"]+"/, '"id":500001,$1"created_at":"…"')
      for (const bytes of requests) {
        const [mine, theirs] = [await ask(ours, bytes), await ask(floor, bytes)]
        assert.equal(withoutDate(theirs.raw).toLowerCase(), withoutDate(mine.raw).toLowerCase(), bytes.split('\r\n')[0])
        assert.equal(theirs.headers['content-length'], String(theirs.bodyBytes), bytes.split('\r\n')[0])
        assert.equal(theirs.headers['transfer-encoding'], undefined)
      }
    })

    test('refuses a token signed with another secret', async () => {
      const [header, payload] = db.tokens[0].token.split('.')
      const answer = await ask(
        floor,
        `POST /posts/1/like HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer ${header}.${payload}.AAAA\r\nContent-Length: 0\r\n\r\n`,
      )
      assert.equal(answer.status, 401)
    })

    // What the benchmark sends it: the instruction counts' sequences, wrk's requests and the users' loop,
    // every answer checked by the sender.
    test('answers every kind of request the benchmark sends', async () => {
      await withFloor(script, async (server) => {
        for (const kind of ['feed', 'post', 'like', 'create', 'mix'] as const)
          await send(
            Number(new URL(server.url).port),
            sequence(
              kind,
              50,
              db.tokens.map((t) => t.token),
            ),
          )
        if (!noWrk) {
          const result = wrk(server.url, 'mix')
          assert.ok(result.requests > 0)
          assert.equal(result.bad, 0, result.bad_example)
        }
        const result = users(server.url, '--ramp', '1', '--loop-on-arrival')
        assert.equal(result.connections, 50)
        assert.ok(result.answered > 300, `answered ${result.answered}`)
        assert.deepEqual({ ...result.errors, example: '' }, { status: 0, body: 0, closed: 0, connect: 0, example: '' })
        assert.equal(result.unanswered, 0)
      })
    })

    test(
      'refuses what it cannot read with a 400, and closes the connection',
      { skip: script === 'bench/floor.ts' && 'node:http reads it' },
      async () => {
        for (const bytes of [
          'nonsense\r\n\r\n',
          'GET /feed HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
          'GET /feed HTTP/1.1\r\nno colon\r\n\r\n',
        ]) {
          const answer = await ask(floor, bytes)
          assert.equal(answer.raw, 'HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n', bytes.split('\r\n')[0])
        }
      },
    )
  })
}

describe('bench/users-comparison.ts', () => {
  const ours = { name: 'ours', app: 'dist/app.js', flags: [], commit: 'abc', node: process.execPath }
  const names = (names?: string[]) =>
    usersVariantsOf(ours, [ours], { floorFits: true, quick: false, names }).map((v) => v.name)

  test('holds ours, its A/A, node-server and the three floors, or ours and the variants named', () => {
    assert.deepEqual(names(), [
      'ours',
      'ours again',
      'ours, node-server',
      'floor',
      'floor, node:net',
      'floor, node:net + Hono',
    ])
    assert.deepEqual(names(['floor, node:net', 'ours again']), ['ours', 'ours again', 'floor, node:net'])
    assert.throws(() => names(['floor, node:nett']), /no variant floor, node:nett; this run has ours; ours again/)
  })
})

describe('bench/sequence.ts', () => {
  test('is the same sequence on every call, and sends every kind with every answer checked', async () => {
    const list = db.tokens.map((t) => t.token)
    assert.deepEqual(sequence('mix', 500, list), sequence('mix', 500, list))
    const kinds = new Set(sequence('mix', 500, list).map((r) => r.kind))
    assert.deepEqual([...kinds].sort(), ['create', 'feed', 'like', 'post'])
    for (const kind of ['feed', 'post', 'like', 'create', 'mix'] as const)
      await send(Number(new URL(app.url).port), sequence(kind, 50, list))
  })

  test('rejects at the first answer that is not what the kind expects', async () => {
    await assert.rejects(send(Number(new URL(ceiling.url).port), sequence('post', 5, [])), /post 0: 200 \{"posts"/)
  })

  test('sends in turn: each request on the next connection, every connection asked once first', async () => {
    // A server that answers every request as a feed, and notes the connection each came on.
    const seen: number[] = []
    let opened = 0
    const body = '{"posts":[{"id":1}]}'
    const server = createServer((socket) => {
      const id = opened++
      socket.on('data', (chunk) => {
        for (let i = 0; i < String(chunk).split('\r\n\r\n').length - 1; i++) {
          seen.push(id)
          socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n${body}`)
        }
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      await sendInTurn((server.address() as AddressInfo).port, sequence('feed', 7, []), 3, 10_000)
      assert.deepEqual(seen, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    } finally {
      server.close()
    }
  })
})
