// Every row of the challenge's CONTRACT.md (docs/challenge.md, "The challenge's spec"), over HTTP, against a
// server started on a fresh copy of the seed.
// Used by the tests that start the API in different ways: dist/app.js, the container layout, the
// challenge submission.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { describe } from 'node:test'
import type { Token } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { claims, makeToken, now } from './helpers.ts'
import { test } from './servers.ts'

const GOLDEN = join(ROOT, 'test', 'golden')

// target() is read when the tests run, after the caller's before() has started its server. Servers
// that share one database (a cluster's nodes) check the goldens first, each, then the rest with
// goldens: false, each with tokens of its own.
export function contractTests(target: () => { url: string; tokens: Token[] }, { goldens = true } = {}) {
  const token = (i: number) => target().tokens[i].token
  const username = (i: number) => target().tokens[i].username
  const get = (path: string) => fetch(target().url + path)
  const post = (
    path: string,
    { token, body, headers = {} }: { token?: string; body?: string; headers?: Record<string, string> } = {},
  ) =>
    fetch(target().url + path, {
      method: 'POST',
      headers: {
        ...(token ? { authorization: `Bearer ${token}` } : {}),
        'content-type': 'application/json',
        ...headers,
      },
      body,
    })

  async function expectError(res: Response, status: number, message: string) {
    assert.equal(res.status, status)
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
    assert.equal(await res.text(), `{"error":"${message}"}`)
  }

  if (goldens) goldenTests(target)

  describe('GET /health', () => {
    test('is 200 with status, db and a whole-second uptime', async () => {
      const res = await get('/health')
      assert.equal(res.status, 200)
      assert.match(await res.text(), /^\{"status":"ok","db":"ok","uptime_s":\d+\}$/)
    })
  })

  describe('connections', () => {
    test('stay open for at least 65 s between requests', async () => {
      const res = await get('/health')
      assert.equal(res.headers.get('connection'), 'keep-alive')
      const timeout = Number(/timeout=(\d+)/.exec(res.headers.get('keep-alive') ?? '')?.[1])
      assert.ok(timeout >= 65, `keep-alive timeout ${timeout}`)
    })
  })

  describe('errors, every row of the contract', () => {
    test('unknown path is 404 not found', async () => {
      await expectError(await get('/nope'), 404, 'not found')
    })

    test('an id that is not a positive integer is 400 invalid post id', async () => {
      for (const id of ['0', '-1', 'abc', '1.5']) await expectError(await get(`/posts/${id}`), 400, 'invalid post id')
    })

    test('a post that does not exist is 404 post not found, to read or to like', async () => {
      await expectError(await get('/posts/999999999'), 404, 'post not found')
      await expectError(await post('/posts/999999999/like', { token: token(0) }), 404, 'post not found')
    })

    test('no Authorization header, or one that is not Bearer, is 401 missing bearer token', async () => {
      await expectError(await post('/posts', { body: '{"body":"x"}' }), 401, 'missing bearer token')
      await expectError(
        await post('/posts', { body: '{"body":"x"}', headers: { authorization: `Token ${token(0)}` } }),
        401,
        'missing bearer token',
      )
    })

    test('a bad signature, expiry, no exp, alg none or a malformed JWT is 401 invalid or expired token', async () => {
      const cases = [
        await makeToken(claims('1'), { secret: 'not the secret' }),
        await makeToken({ ...claims('1'), exp: now() - 1 }),
        // Signed and well formed, but it would never expire: "verify exp on every request" refuses it.
        await makeToken({ sub: '1', username: username(0), iat: now() }),
        await makeToken(claims('1'), { alg: 'none' }),
        await makeToken(claims('1'), { alg: 'HS384' }),
        'not.a.jwt',
      ]
      for (const bad of cases)
        await expectError(await post('/posts', { token: bad, body: '{"body":"x"}' }), 401, 'invalid or expired token')
    })

    test('a valid signature with a bad sub or username is 401 invalid token payload', async () => {
      for (const payload of [{ ...claims('1'), sub: 1 }, { ...claims('abc') }, { ...claims('1'), username: 7 }]) {
        await expectError(
          await post('/posts', { token: await makeToken(payload), body: '{"body":"x"}' }),
          401,
          'invalid token payload',
        )
      }
    })

    test('a body that is not JSON is 400 malformed JSON body', async () => {
      await expectError(await post('/posts', { token: token(0), body: '{"body":' }), 400, 'malformed JSON body')
    })

    test('a missing, non-string or blank body is 400 body is required', async () => {
      for (const body of ['{}', '{"body":1}', '{"body":"   "}'])
        await expectError(await post('/posts', { token: token(0), body }), 400, 'body is required')
    })

    test('a body over 500 characters after trimming is 400', async () => {
      const body = JSON.stringify({ body: ` ${'a'.repeat(501)} ` })
      await expectError(await post('/posts', { token: token(0), body }), 400, 'body must be at most 500 characters')
    })

    test('auth comes before the id: 401 without a token, 400 with one', async () => {
      await expectError(await post('/posts/abc/like'), 401, 'missing bearer token')
      await expectError(await post('/posts/abc/like', { token: token(0) }), 400, 'invalid post id')
    })

    test('a body over 16 KB is a JSON 413 and the connection closes', async () => {
      const res = await post('/posts', { token: token(0), body: JSON.stringify({ body: 'x'.repeat(20_000) }) })
      await expectError(res, 413, 'request body must be at most 16 KB')
      assert.equal(res.headers.get('connection'), 'close')
    })
  })

  describe('writes', () => {
    test('a new post is 201, reads back byte for byte, and tops the feed', async () => {
      const res = await post('/posts', {
        token: token(41),
        body: JSON.stringify({ body: '  fresh from the contract test  ' }),
      })
      assert.equal(res.status, 201)
      const text = await res.text()
      const created = JSON.parse(text).post
      assert.equal(created.body, 'fresh from the contract test')
      assert.equal(created.author, username(41))
      assert.equal(created.like_count, 0)
      assert.ok(created.id > 500_000)
      assert.equal(await (await get(`/posts/${created.id}`)).text(), text)
      const feed = JSON.parse(await (await get('/feed')).text())
      assert.deepEqual(feed.posts[0], created)
    })

    test('500 emoji are a valid body', async () => {
      const res = await post('/posts', { token: token(42), body: JSON.stringify({ body: '🐈'.repeat(500) }) })
      assert.equal(res.status, 201)
    })

    test('a like is 201, then 200 already liked, and like_count counts it at once', async () => {
      const before = JSON.parse(await (await get('/posts/250000')).text()).post.like_count
      const first = await post('/posts/250000/like', { token: token(7) })
      assert.equal(first.status, 201)
      assert.equal(await first.text(), '{"liked":true,"already_liked":false,"post_id":250000}')
      assert.equal(JSON.parse(await (await get('/posts/250000')).text()).post.like_count, before + 1)
      const second = await post('/posts/250000/like', { token: token(7) })
      assert.equal(second.status, 200)
      assert.equal(await second.text(), '{"liked":true,"already_liked":true,"post_id":250000}')
      assert.equal(JSON.parse(await (await get('/posts/250000')).text()).post.like_count, before + 1)
    })

    test('25 racing likes by one user give exactly one 201', async () => {
      const before = JSON.parse(await (await get('/posts/123456')).text()).post.like_count
      const results = await Promise.all(
        Array.from({ length: 25 }, () => post('/posts/123456/like', { token: token(99) })),
      )
      const statuses = results.map((r) => r.status).sort((a, b) => b - a)
      assert.deepEqual(statuses, [201, ...Array(24).fill(200)])
      assert.equal(JSON.parse(await (await get('/posts/123456')).text()).post.like_count, before + 1)
    })

    test('concurrent creates all commit and all read back', async () => {
      const results = await Promise.all(
        Array.from({ length: 40 }, (_, i) =>
          post('/posts', { token: token(1000 + i), body: JSON.stringify({ body: `concurrent ${i}` }) }),
        ),
      )
      const created = await Promise.all(
        results.map(async (r) => (assert.equal(r.status, 201), JSON.parse(await r.text()).post)),
      )
      assert.equal(new Set(created.map((p) => p.id)).size, 40)
      for (const p of created) assert.deepEqual(JSON.parse(await (await get(`/posts/${p.id}`)).text()).post, p)
    })
  })
}

// GET /feed and three posts are the spec's golden files (kept in test/golden), byte for byte, on a fresh seed.
export function goldenTests(target: () => { url: string }) {
  const get = (path: string) => fetch(target().url + path)
  describe('the golden responses on a fresh seed', () => {
    for (const [path, file] of [
      ['/feed', 'feed.json'],
      ['/posts/1', 'post-1.json'],
      ['/posts/250000', 'post-250000.json'],
      ['/posts/500000', 'post-500000.json'],
    ]) {
      test(`GET ${path} is ${file}, byte for byte`, async () => {
        const res = await get(path)
        assert.equal(res.status, 200)
        assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
        assert.equal(Buffer.compare(Buffer.from(await res.arrayBuffer()), readFileSync(join(GOLDEN, file))), 0)
      })
    }
  })
}
