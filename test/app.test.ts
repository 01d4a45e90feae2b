// The API's logic through app.request(), on a small database this file builds itself.
import assert from 'node:assert/strict'
import { createHmac } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { after, before, describe, test } from 'node:test'
import { DEFAULT_SECRET } from '../harness/seed.ts'
import { mulberry32 } from '../random.ts'
import { claims, makeToken, now } from './helpers.ts'

const dir = mkdtempSync(join(tmpdir(), 'feed-app-'))
process.env.SQLITE_PATH = join(dir, 'nested', 'app.db')
process.env.JWT_SECRET = 'a secret only these tests know'
process.env.BUSY_TIMEOUT_MS = '200'
const SECRET = process.env.JWT_SECRET
const { app, configure, database, openDatabase } = await import('../app.ts')
openDatabase() // as the start does: the missing file gets the empty schema, in a folder it makes
// The fixture goes in through a connection of the test's own.
const db = new DatabaseSync(process.env.SQLITE_PATH)

after(() => {
  db.close()
  rmSync(dir, { recursive: true, force: true })
})

// Fixture: three users (one with characters JSON must escape), 25 posts a second apart
// (the last two at the same instant, to show the id tie-break), and a few likes.
const USERS = [
  { id: 1, username: 'alice' },
  { id: 2, username: 'bob' },
  { id: 3, username: 'carol "c" \\ <ünï> 🐈' },
]
type Post = { id: number; user_id: number; body: string; created_at: string }
const POSTS: Post[] = Array.from({ length: 25 }, (_, i) => ({
  id: i + 1,
  user_id: (i % 3) + 1,
  body: i === 24 ? 'tab\there, "quotes", newline\nand emoji 😀' : `post number ${i + 1}`,
  created_at: new Date(Date.UTC(2025, 0, 1, 0, 0, Math.min(i, 23))).toISOString(),
}))
const LIKES = [
  [1, 25],
  [2, 25],
  [3, 25],
  [2, 1],
] // [user_id, post_id]

before(() => {
  const user = db.prepare('INSERT INTO users (id, username) VALUES (?, ?)')
  for (const u of USERS) user.run(u.id, u.username)
  const post = db.prepare('INSERT INTO posts (id, user_id, body, created_at) VALUES (?, ?, ?, ?)')
  for (const p of POSTS) post.run(p.id, p.user_id, p.body, p.created_at)
  const like = db.prepare('INSERT INTO likes (user_id, post_id) VALUES (?, ?)')
  for (const [u, p] of LIKES) like.run(u, p)
})

// The post object as the contract spells it, keys in order.
function postJson(p: Post, likeCount: number) {
  const author = USERS.find((u) => u.id === p.user_id)!.username
  return { id: p.id, body: p.body, created_at: p.created_at, author, like_count: likeCount }
}
const likeCount = (postId: number) => LIKES.filter(([, p]) => p === postId).length

const tokenFor = (id: number, extra: Record<string, unknown> = {}) =>
  makeToken({ ...claims(String(id), USERS[id - 1]?.username ?? `ghost_${id}`), ...extra }, { secret: SECRET })

async function post(
  path: string,
  { token, body, headers = {} }: { token?: string; body?: BodyInit; headers?: Record<string, string> } = {},
) {
  const auth: Record<string, string> = token ? { authorization: `Bearer ${token}` } : {}
  return app.request(path, { method: 'POST', headers: { ...auth, ...headers }, body })
}

async function expectError(res: Response, status: number, message: string) {
  assert.equal(res.status, status)
  assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
  assert.equal(await res.text(), JSON.stringify({ error: message }))
}

describe('a server setup (configure)', () => {
  test('is refused once the API has opened its database without one: the open connection would not have it', () => {
    assert.throws(
      () => configure({ readOnly: true }),
      /configure\(\) is called once, before the API opens its database/,
    )
  })
})

describe('GET /health', () => {
  test('answers ok with the database reachable and a whole-second uptime', async () => {
    const res = await app.request('/health')
    assert.equal(res.status, 200)
    assert.match(await res.text(), /^\{"status":"ok","db":"ok","uptime_s":\d+\}$/)
  })
})

describe('GET /feed', () => {
  test('returns the 20 newest posts, created_at then id descending, keys in contract order', async () => {
    const res = await app.request('/feed')
    assert.equal(res.status, 200)
    assert.equal(res.headers.get('content-type'), 'application/json')
    const newest = [...POSTS].sort((a, b) => b.created_at.localeCompare(a.created_at) || b.id - a.id).slice(0, 20)
    assert.deepEqual(
      newest.slice(0, 2).map((p) => p.id),
      [25, 24],
      'same instant: higher id first',
    )
    assert.equal(await res.text(), JSON.stringify({ posts: newest.map((p) => postJson(p, likeCount(p.id))) }))
  })

  // app.ts reads the feed by rowid range when the 20 newest ids are contiguous, and through the index
  // otherwise: either way, the bytes of the contract's one statement.
  describe('the same bytes as the reference statement, whichever way it reads', () => {
    const reference = () =>
      (
        db
          .prepare(
            `
      SELECT json_object('posts', json_group_array(json_object(
               'id', p.id, 'body', p.body, 'created_at', p.created_at, 'author', u.username,
               'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
             ) ORDER BY p.created_at DESC, p.id DESC)) AS json
      FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p
      JOIN users AS u ON u.id = p.user_id`,
          )
          .get() as { json: string }
      ).json
    const newestIds = () =>
      (db.prepare('SELECT id FROM posts ORDER BY created_at DESC, id DESC LIMIT 20').all() as { id: number }[]).map(
        (r) => r.id,
      )
    const contiguous = (ids: number[]) => Math.max(...ids) - Math.min(...ids) + 1 === ids.length
    const added: number[] = []
    const add = (id: number | null, userId: number, createdAt: string) =>
      added.push(
        Number(
          db
            .prepare('INSERT INTO posts (id, user_id, body, created_at) VALUES (?, ?, ?, ?) RETURNING id')
            .get(id, userId, `added ${added.length}`, createdAt)!.id,
        ),
      )
    const feedMatches = async (what: string) =>
      assert.equal(await (await app.request('/feed')).text(), reference(), what)
    after(() => db.prepare(`DELETE FROM posts WHERE id IN (${added.join(',') || 0})`).run())

    test('new posts at the end: contiguous ids, read by range', async () => {
      for (let i = 0; i < 3; i++) add(null, 2, new Date(Date.UTC(2025, 0, 2, 0, 0, i)).toISOString())
      assert.ok(contiguous(newestIds()))
      await feedMatches('contiguous')
    })

    test('a newest post with an id far past the others, and one among them with an old time: read by the index', async () => {
      add(1_000_000, 1, '2025-01-03T00:00:00.000Z') // the newest, its id past the span
      add(null, 3, '2024-12-31T00:00:00.000Z') // an id inside no span, the oldest of all
      assert.ok(!contiguous(newestIds()))
      await feedMatches('ids past the span')
      db.prepare('DELETE FROM posts WHERE id = 1000000').run()
      add(10_000, 2, '2025-01-01T00:00:05.500Z') // among the old ones by time, past them by id
      await feedMatches('a new id among old times')
    })

    test('500 random states, ties and gaps included, each the reference bytes', async () => {
      const random = mulberry32(7)
      let ranges = 0
      // New posts mostly, as a server makes them; some with an id in a gap or far past, new or as old as
      // the fixture's; ties on time; a few deleted.
      for (let i = 0; i < 500; i++) {
        const id =
          random() < 0.92
            ? null
            : random() < 0.6
              ? 30 + Math.floor(random() * 200)
              : 100_000 + Math.floor(random() * 1000)
        const time =
          id === null || random() < 0.5
            ? Date.UTC(2025, 0, 5) + i * 1000 - Math.floor(random() * 3) * 1000
            : Date.UTC(2025, 0, 1, 0, 0, Math.floor(random() * 30))
        if (id === null || !db.prepare('SELECT 1 FROM posts WHERE id = ?').get(id))
          add(id, 1 + Math.floor(random() * 3), new Date(time).toISOString())
        if (random() < 0.03 && added.length)
          db.prepare('DELETE FROM posts WHERE id = ?').run(added.splice(Math.floor(random() * added.length), 1)[0])
        if (contiguous(newestIds())) ranges++
        await feedMatches(`state ${i}`)
      }
      assert.ok(ranges > 10 && ranges < 490, `${ranges} of 500 states read by range`)
    })
  })
})

describe('GET /posts/:id', () => {
  test('returns the post with its author and like count, escaped by SQLite', async () => {
    const res = await app.request('/posts/25')
    assert.equal(res.status, 200)
    assert.equal(await res.text(), JSON.stringify({ post: postJson(POSTS[24], 3) }))
  })

  test('counts a post with no likes as 0', async () => {
    const res = await app.request('/posts/2')
    assert.equal(await res.text(), JSON.stringify({ post: postJson(POSTS[1], 0) }))
  })

  test('is 404 for a well-formed id with no post, even past 2^53 and 2^63', async () => {
    for (const id of ['26', '999999999', '9007199254740993', '99999999999999999999999999999999999999999']) {
      await expectError(await app.request(`/posts/${id}`), 404, 'post not found')
    }
  })

  test('is 400 for anything but a positive decimal integer', async () => {
    for (const id of [
      '0',
      '-1',
      'abc',
      '1.5',
      '01',
      '+1',
      '1e3',
      '0x10',
      '%201',
      '1%00',
      '%E2%82%81',
      'Infinity',
      ' 1',
    ]) {
      await expectError(await app.request(`/posts/${id}`), 400, 'invalid post id')
    }
  })
})

describe('POST /posts', () => {
  const json = (value: unknown) => ({ body: JSON.stringify(value), headers: { 'content-type': 'application/json' } })

  describe('authentication', () => {
    test('is 401 missing bearer token without a Bearer header', async () => {
      await expectError(await post('/posts', json({ body: 'hi' })), 401, 'missing bearer token')
      const basic = await post('/posts', { ...json({ body: 'hi' }), headers: { authorization: 'Basic YTpi' } })
      await expectError(basic, 401, 'missing bearer token')
      // Header values are trimmed, so a scheme with no token is a missing token.
      const empty = await post('/posts', { ...json({ body: 'hi' }), headers: { authorization: 'Bearer ' } })
      await expectError(empty, 401, 'missing bearer token')
    })

    test('is 401 invalid or expired token for bad signatures, expiry, algorithms and shapes', async () => {
      const good = await tokenFor(1)
      const [header, payload] = good.split('.')
      const bad = {
        'another secret': await makeToken(claims('1'), { secret: DEFAULT_SECRET }),
        'tampered payload': `${header}.${Buffer.from(JSON.stringify(claims('2'))).toString('base64url')}.${good.split('.')[2]}`,
        expired: await tokenFor(1, { exp: now() - 10 }),
        'no exp': await makeToken({ sub: '1', username: 'alice', iat: now() }, { secret: SECRET }),
        'exp as a string': await tokenFor(1, { exp: String(now() + 3600) }),
        'alg none': await makeToken(claims('1'), { alg: 'none' }),
        HS512: await makeToken(claims('1'), { secret: SECRET, alg: 'HS512' }),
        'two segments': `${header}.${payload}`,
        'not base64url': `${header}.${payload}.***`,
        'payload not JSON': `${header}.${Buffer.from('nope').toString('base64url')}.${good.split('.')[2]}`,
        'payload null': `${header}.${Buffer.from('null').toString('base64url')}.${good.split('.')[2]}`,
      }
      for (const [name, token] of Object.entries(bad)) {
        const res = await app.request('/posts', {
          method: 'POST',
          headers: { authorization: `Bearer ${token}` },
          body: '{"body":"x"}',
        })
        await expectError(res, 401, 'invalid or expired token').catch((err) => assert.fail(`${name}: ${err.message}`))
      }
    })

    test('is 401 invalid token payload when sub or username are not what the contract says', async () => {
      const payloads = [
        { sub: 1, username: 'alice' },
        { sub: '0', username: 'alice' },
        { sub: '01', username: 'alice' },
        { sub: '-1', username: 'alice' },
        { sub: 'abc', username: 'alice' },
        { sub: '99999999999999999999', username: 'alice' },
        { username: 'alice' },
        { sub: '1' },
        { sub: '1', username: 42 },
        { sub: '1', username: { name: 'alice' } },
      ]
      for (const p of payloads) {
        const token = await makeToken({ ...p, iat: now(), exp: now() + 60 }, { secret: SECRET })
        await expectError(await post('/posts', { token, ...json({ body: 'x' }) }), 401, 'invalid token payload')
      }
    })

    test('is 401 invalid token payload for a signed user id with no user row, and writes nothing', async () => {
      const before = db.prepare('SELECT count(*) AS n FROM posts').get()
      await expectError(
        await post('/posts', { token: await tokenFor(77), ...json({ body: 'x' }) }),
        401,
        'invalid token payload',
      )
      assert.deepEqual(db.prepare('SELECT count(*) AS n FROM posts').get(), before)
    })

    // The checks were hono/jwt's verify (on WebCrypto), with exp required on top; they are node:crypto's
    // HMAC now, on the event loop. Both judge every token here alike: the same answer, or the same user.
    test('judges tokens as hono/jwt verify did, exp required: 1,000 and more, signed and tampered', async () => {
      const before = (await import('hono/jwt')).verify
      const { authenticate } = await import('../app.ts')
      const judge = (run: () => unknown) => {
        try {
          return JSON.stringify(run())
        } catch (error) {
          return (error as Error).message
        }
      }
      const reference = async (token: string) => {
        let claims
        try {
          claims = await before(token, SECRET, 'HS256')
        } catch {
          return 'invalid or expired token'
        }
        if (typeof claims.exp !== 'number') return 'invalid or expired token'
        const { sub, username } = claims
        if (
          typeof sub !== 'string' ||
          !/^[1-9][0-9]*$/.test(sub) ||
          !Number.isSafeInteger(Number(sub)) ||
          typeof username !== 'string'
        )
          return 'invalid token payload'
        return JSON.stringify({ id: Number(sub), username })
      }
      const b64 = (text: string) => Buffer.from(text).toString('base64url')
      // A signature's last character with its unused bits changed: the same bytes, spelled otherwise.
      const BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
      const respelled = (last: string) => BASE64URL[BASE64URL.indexOf(last) ^ 1]
      const signed = (header: string, payload: string, secret = SECRET) =>
        `${header}.${payload}.${createHmac('sha256', secret).update(`${header}.${payload}`).digest('base64url')}`
      const t = now()
      const headers = [
        '{"alg":"HS256","typ":"JWT"}',
        '{"alg":"HS256"}',
        '{"typ":"JWT","alg":"HS256"}',
        '{"alg":"HS256","typ":"jwt"}',
        '{"alg":"HS256","typ":"application/JWT"}',
        '{"alg":"HS256","typ":"JOSE"}',
        '{"alg":"HS256","typ":5}',
        '{"alg":"HS256","crit":["x"]}',
        '{"alg":"HS384"}',
        '{"alg":"none"}',
        '{"alg":"hs256"}',
        '{}',
        '[]',
        'null',
        '1',
        '"HS256"',
        'not json',
      ]
      const payloads = [
        { sub: '1', username: 'alice', iat: t, exp: t + 60 },
        { sub: '2', username: 'bob', exp: t + 3600 },
        { sub: '3', username: 'c', exp: t },
        { sub: '1', username: 'a', exp: t - 1 },
        { sub: '1', username: 'a' },
        { sub: '1', username: 'a', exp: `${t + 60}` },
        { sub: '1', username: 'a', exp: t + 60.5 },
        { sub: '1', username: 'a', exp: 1e308 },
        { sub: '1', username: 'a', exp: t + 60, nbf: t + 30 },
        { sub: '1', username: 'a', exp: t + 60, nbf: t },
        { sub: '1', username: 'a', exp: t + 60, nbf: 'soon' },
        { sub: '1', username: 'a', exp: t + 60, iat: t + 30 },
        { sub: '1', username: 'a', exp: t + 60, iat: null },
        { sub: 1, username: 'a', exp: t + 60 },
        { sub: '01', username: 'a', exp: t + 60 },
        { sub: '9007199254740993', username: 'a', exp: t + 60 },
        { sub: '7', exp: t + 60 },
        { sub: '7', username: ['x'], exp: t + 60 },
        null,
        [],
        42,
        'text',
      ].map((p) => JSON.stringify(p))
      const tokens: string[] = []
      for (const header of headers) {
        for (const payload of payloads) {
          const good = signed(b64(header), b64(payload))
          const [h, p, sig] = good.split('.')
          tokens.push(
            good,
            `${good}=`,
            `${good}==`,
            signed(b64(header), b64(payload), 'another secret'),
            `${h}.${p}.${sig.slice(0, -1)}`,
            `${h}.${p}.${sig}A`,
            `${h}.${b64(payload.replace('a', 'b'))}.${sig}`,
            `${h}.${p}`,
            `${good}.x`,
            `${h}..${sig}`,
            `.${p}.${sig}`,
            `${h}.${p}.${sig.replace(/[A-Za-z]/, '*')}`,
            `${h}.${p}.${sig.slice(0, -1)}${respelled(sig.at(-1)!)}`,
          )
        }
      }
      tokens.push(
        '',
        '.',
        '..',
        'a.b.c',
        signed(b64('{"alg":"HS256"}'), Buffer.from([0xff, 0xfe, 0x7b]).toString('base64url')),
      )
      assert.ok(tokens.length > 1000, `${tokens.length} tokens`)
      // A good token's signature padded, or respelled, is refused.
      const [h, p, sig] = tokens[0].split('.')
      assert.equal(
        judge(() => authenticate(`Bearer ${tokens[0]}`)),
        '{"id":1,"username":"alice"}',
      )
      const respell = `${h}.${p}.${sig.slice(0, -1)}${respelled(sig.at(-1)!)}`
      assert.deepEqual(Buffer.from(respell.split('.')[2], 'base64url'), Buffer.from(sig, 'base64url'))
      for (const token of [`${tokens[0]}=`, respell]) {
        assert.equal(
          judge(() => authenticate(`Bearer ${token}`)),
          'invalid or expired token',
        )
      }
      for (const token of tokens) {
        assert.equal(
          judge(() => authenticate(`Bearer ${token}`)),
          await reference(token),
          `token ${token}`,
        )
      }
    })

    // hono/jwt decoded the first two parts with atob, which also takes standard base64 and spaces.
    test('refuses a signed token whose header or payload is not base64url, which hono/jwt took', async () => {
      const { authenticate } = await import('../app.ts')
      const payload = Buffer.from(JSON.stringify({ sub: '1', username: 'alice>?', exp: now() + 60 })).toString('base64')
      assert.match(payload, /[+/=]/)
      const header = Buffer.from('{"alg":"HS256"}').toString('base64url')
      const token = `${header}.${payload}.${createHmac('sha256', SECRET).update(`${header}.${payload}`).digest('base64url')}`
      assert.throws(() => authenticate(`Bearer ${token}`), /invalid or expired token/)
    })

    test('checks the token before the body', async () => {
      await expectError(await post('/posts', { body: 'not json' }), 401, 'missing bearer token')
    })
  })

  describe('request body', () => {
    test('is 400 malformed JSON body for invalid JSON or invalid UTF-8', async () => {
      const token = await tokenFor(1)
      for (const body of [
        '',
        '{',
        '{"body":"x"',
        "{'body':'x'}",
        'body=x',
        new Uint8Array([0x7b, 0x22, 0x62, 0x6f, 0x64, 0x79, 0x22, 0x3a, 0x22, 0xff, 0x22, 0x7d]),
      ]) {
        await expectError(await post('/posts', { token, body }), 400, 'malformed JSON body')
      }
    })

    test('is 400 body is required when body is missing, not a string, or blank', async () => {
      const token = await tokenFor(1)
      for (const value of [
        {},
        { body: null },
        { body: 5 },
        { body: ['x'] },
        { body: '' },
        { body: ' \n\t\u00a0\u3000 ' },
        null,
        [],
        'body',
        1,
      ]) {
        await expectError(await post('/posts', { token, ...json(value) }), 400, 'body is required')
      }
    })

    test('is 400 when longer than 500 code points after trimming', async () => {
      const token = await tokenFor(1)
      await expectError(
        await post('/posts', { token, ...json({ body: 'x'.repeat(501) }) }),
        400,
        'body must be at most 500 characters',
      )
      await expectError(
        await post('/posts', { token, ...json({ body: '😀'.repeat(501) }) }),
        400,
        'body must be at most 500 characters',
      )
    })

    test('is 413 with Connection: close for a body over 16 KB, declared or streamed', async () => {
      const token = await tokenFor(1)
      const big = JSON.stringify({ body: 'x'.repeat(17_000) })
      const declared = await post('/posts', { token, body: big, headers: { 'content-length': String(big.length) } })
      await expectError(declared, 413, 'request body must be at most 16 KB')
      assert.equal(declared.headers.get('connection'), 'close')

      const chunks = [new TextEncoder().encode(big.slice(0, 10_000)), new TextEncoder().encode(big.slice(10_000))]
      const stream = new ReadableStream({ pull: (c) => (chunks.length ? c.enqueue(chunks.shift()) : c.close()) })
      const streamed = await app.request('/posts', {
        method: 'POST',
        headers: { authorization: `Bearer ${token}` },
        body: stream,
        duplex: 'half',
      } as RequestInit)
      await expectError(streamed, 413, 'request body must be at most 16 KB')
    })
  })

  describe('success', () => {
    test('is 201 with the trimmed body, the token username as author and like_count 0', async () => {
      const before = Date.now()
      const res = await post('/posts', { token: await tokenFor(3), ...json({ body: '  \n hello, world \t ' }) })
      assert.equal(res.status, 201)
      const text = await res.text()
      const { post: created } = JSON.parse(text)
      assert.deepEqual(Object.keys(created), ['id', 'body', 'created_at', 'author', 'like_count'])
      assert.equal(created.body, 'hello, world')
      assert.equal(created.author, USERS[2].username)
      assert.equal(created.like_count, 0)
      assert.match(created.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
      assert.ok(Math.abs(Date.parse(created.created_at) - before) < 5_000)
      assert.equal(await (await app.request(`/posts/${created.id}`)).text(), text, 'reads back byte for byte')
    })

    test('takes the author from the token, never from the users table', async () => {
      const res = await post('/posts', {
        token: await makeToken(claims('1', 'not alice'), { secret: SECRET }),
        ...json({ body: 'x' }),
      })
      assert.equal((await res.json()).post.author, 'not alice')
    })

    test('accepts exactly 500 emoji (1,000 UTF-16 units)', async () => {
      const res = await post('/posts', { token: await tokenFor(2), ...json({ body: '😀'.repeat(500) }) })
      assert.equal(res.status, 201)
      assert.equal((await res.json()).post.body, '😀'.repeat(500))
    })

    test('puts the new post at the top of the feed', async () => {
      const res = await post('/posts', { token: await tokenFor(1), ...json({ body: 'newest' }) })
      const { post: created } = await res.json()
      const feed = await (await app.request('/feed')).json()
      assert.deepEqual(feed.posts[0], created)
      assert.equal(feed.posts.length, 20)
    })

    test('ignores fields other than body and any content type', async () => {
      const res = await post('/posts', {
        token: await tokenFor(1),
        body: '{"body":"plain","author":"mallory","like_count":99}',
        headers: { 'content-type': 'text/plain' },
      })
      const { post: created } = await res.json()
      assert.equal(res.status, 201)
      assert.equal(created.author, 'alice')
      assert.equal(created.like_count, 0)
    })
  })
})

describe('POST /posts/:id/like', () => {
  test('checks auth before the id', async () => {
    await expectError(await post('/posts/abc/like'), 401, 'missing bearer token')
    await expectError(await post('/posts/abc/like', { token: await tokenFor(1) }), 400, 'invalid post id')
  })

  test('is 404 post not found for a post that does not exist', async () => {
    const token = await tokenFor(1)
    await expectError(await post('/posts/99999/like', { token }), 404, 'post not found')
    await expectError(await post('/posts/99999999999999999999/like', { token }), 404, 'post not found')
  })

  test('is 201 the first time, 200 after, and like_count counts it at once', async () => {
    const token = await tokenFor(3)
    const first = await post('/posts/2/like', { token })
    assert.equal(first.status, 201)
    assert.equal(await first.text(), '{"liked":true,"already_liked":false,"post_id":2}')
    assert.equal((await (await app.request('/posts/2')).json()).post.like_count, 1)
    const again = await post('/posts/2/like', { token })
    assert.equal(again.status, 200)
    assert.equal(await again.text(), '{"liked":true,"already_liked":true,"post_id":2}')
    assert.equal((await (await app.request('/posts/2')).json()).post.like_count, 1)
  })

  test('is 401 invalid token payload for a signed user id with no user row', async () => {
    await expectError(await post('/posts/3/like', { token: await tokenFor(77) }), 401, 'invalid token payload')
  })

  test('is 413 with Connection: close for a body over 16 KB, declared or streamed, before the token is read', async () => {
    const over = await post('/posts/3/like', { headers: { 'content-length': '16385' }, body: 'x'.repeat(16_385) })
    await expectError(over, 413, 'request body must be at most 16 KB')
    assert.equal(over.headers.get('connection'), 'close')
    const within = await post('/posts/3/like', { headers: { 'content-length': '16384' }, body: 'x'.repeat(16_384) })
    await expectError(within, 401, 'missing bearer token')
    const chunks = [new Uint8Array(10_000), new Uint8Array(6_385)]
    const stream = new ReadableStream({ pull: (c) => (chunks.length ? c.enqueue(chunks.shift()) : c.close()) })
    const streamed = await app.request('/posts/3/like', { method: 'POST', body: stream, duplex: 'half' } as RequestInit)
    await expectError(streamed, 413, 'request body must be at most 16 KB')
  })
})

describe('unknown paths and methods', () => {
  test('is 404 not found for an unknown path', async () => {
    for (const path of ['/', '/nope', '/feed/', '/posts/', '/posts/1/likes', '/posts/1/like/x']) {
      await expectError(await app.request(path), 404, 'not found')
    }
  })

  test('is 405 with Allow for a known path and another method', async () => {
    const cases = [
      ['DELETE', '/feed', 'GET'],
      ['POST', '/health', 'GET'],
      ['PUT', '/posts/1', 'GET'],
      ['GET', '/posts/1/like', 'POST'],
      ['GET', '/posts', 'POST'],
    ]
    for (const [method, path, allow] of cases) {
      const res = await app.request(path, { method })
      await expectError(res, 405, 'method not allowed')
      assert.equal(res.headers.get('allow'), allow)
    }
  })
})

describe('every response', () => {
  test('is JSON that is not sniffed and not cached, success or error', async () => {
    for (const res of [
      await app.request('/feed'),
      await app.request('/posts/1'),
      await app.request('/posts/abc'),
      await app.request('/nope'),
    ]) {
      assert.equal(res.headers.get('content-type'), 'application/json')
      assert.equal(res.headers.get('x-content-type-options'), 'nosniff')
      assert.equal(res.headers.get('cache-control'), 'no-store')
    }
  })
})

describe('a database in trouble', () => {
  test('a write while another connection holds the lock waits, then is a 503 database is busy; reads still answer', async () => {
    const holder = new DatabaseSync(process.env.SQLITE_PATH!, { timeout: 0 })
    holder.exec('BEGIN IMMEDIATE')
    try {
      const started = performance.now()
      const write = post('/posts/3/like', { token: await tokenFor(1) })
      assert.equal((await app.request('/posts/3')).status, 200)
      await expectError(await write, 503, 'database is busy')
      assert.ok(performance.now() - started >= 190, 'the write waited for the busy timeout')
      const health = await app.request('/health')
      assert.equal(health.status, 503)
      assert.deepEqual(await health.json(), { status: 'degraded', db: 'unreachable', error: 'database is busy' })
    } finally {
      holder.exec('ROLLBACK')
      holder.close()
    }
    assert.equal((await app.request('/health')).status, 200)
    assert.equal((await post('/posts/3/like', { token: await tokenFor(1) })).status, 201)
  })

  // Asleep there, the whole event loop would wait: a write that meets the lock is retried on a timer
  // (above), and a read in WAL mode meets none.
  test("the connection never sleeps in SQLite's busy handler: its busy timeout is 0", () => {
    assert.equal(database().connection.prepare('PRAGMA busy_timeout').get()?.timeout, 0)
  })
})

describe('a COMMIT that fails', () => {
  // A 201 (or 200) is sent only after its transaction commits. Here the COMMIT itself fails, after every
  // statement of its batch succeeded: this test's own database (the product's schema stays as it is)
  // gets a table whose foreign key is DEFERRABLE INITIALLY DEFERRED, and triggers that give it a row with
  // no user for every post and like written. SQLite counts a deferred violation when a statement runs
  // and checks the count only at COMMIT: each INSERT succeeds, and the COMMIT fails.
  test('after its statements succeeded: no write of the batch is acknowledged and none is kept', async () => {
    const token = await tokenFor(1)
    const likedPosts = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    const likesKept = () =>
      (
        db.prepare(`SELECT count(*) AS n FROM likes WHERE user_id = 1 AND post_id IN (${likedPosts.join()})`).get() as {
          n: number
        }
      ).n
    const postsKept = () =>
      (db.prepare("SELECT count(*) AS n FROM posts WHERE body LIKE 'lost at commit %'").get() as { n: number }).n
    assert.equal(likesKept(), 0)
    db.exec(`
      CREATE TABLE unknown_users (user_id INTEGER REFERENCES users (id) DEFERRABLE INITIALLY DEFERRED);
      CREATE TRIGGER post_fails_at_commit AFTER INSERT ON posts BEGIN INSERT INTO unknown_users VALUES (0); END;
      CREATE TRIGGER like_fails_at_commit AFTER INSERT ON likes BEGIN INSERT INTO unknown_users VALUES (0); END;
    `)
    let answers: Response[]
    try {
      // Sent together, so that they share transactions (group commit).
      answers = await Promise.all(
        likedPosts.flatMap((postId, i) => [
          post(`/posts/${postId}/like`, { token }),
          post('/posts', { token, body: JSON.stringify({ body: `lost at commit ${i}` }) }),
        ]),
      )
    } finally {
      db.exec('DROP TRIGGER post_fails_at_commit; DROP TRIGGER like_fails_at_commit; DROP TABLE unknown_users')
    }
    for (const res of answers) {
      assert.ok(res.status >= 400, `a write that was not committed was answered ${res.status}`)
      assert.match(await res.text(), /^\{"error":"[^"]+"\}$/)
    }
    assert.equal(postsKept(), 0)
    assert.equal(likesKept(), 0)
    // The failed transaction was rolled back, not left open: the same writes go through now.
    assert.equal((await post(`/posts/${likedPosts[0]}/like`, { token })).status, 201)
    assert.equal((await post('/posts', { token, body: JSON.stringify({ body: 'kept after the fault' }) })).status, 201)
  })
})

describe('unexpected failures', () => {
  test('are 500 internal server error, with no stack or SQL in the body', async () => {
    const logged: unknown[] = []
    const original = console.error
    console.error = (...args) => logged.push(args)
    try {
      db.exec('DROP TABLE likes')
      await expectError(await app.request('/feed'), 500, 'internal server error')
      assert.equal(logged.length, 1, 'the error is logged on the server side')
    } finally {
      console.error = original
    }
  })
})
