// CORS_ORIGIN and ACCESS_LOG, on the built server, on each of its HTTP servers (test/servers.ts: ours on
// node:net, and node:http): a browser's preflight answered and its origin named, the 405 rule kept
// for other methods, one log line a request and never a token; and, unset, neither.
import assert from 'node:assert/strict'
import { after, before } from 'node:test'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { smallDatabase } from './helpers.ts'
import { forEachServer, test } from './servers.ts'

const ORIGIN = 'https://app.example.com'

forEachServer('CORS_ORIGIN and ACCESS_LOG', (server) => {
  const db = smallDatabase()
  let on: Server
  let off: Server
  before(async () => {
    const env = { SQLITE_PATH: db.path, HTTP_SERVER: server }
    on = await startServer(process.execPath, ['dist/app.js'], {
      env: { ...env, CORS_ORIGIN: `${ORIGIN}, https://other.example.com`, ACCESS_LOG: '1' },
    })
    off = await startServer(process.execPath, ['dist/app.js'], { env })
  })
  after(async () => {
    await within(Promise.all([on.stop(), off.stop()]), 15_000, 'the servers to exit on SIGTERM')
    db.remove()
  })

  test("a preflight is answered, naming the origin, the methods and the headers; a request's answer names the origin", async () => {
    const preflight = await fetch(`${on.url}/posts`, {
      method: 'OPTIONS',
      headers: {
        origin: ORIGIN,
        'access-control-request-method': 'POST',
        'access-control-request-headers': 'authorization, content-type',
      },
    })
    assert.equal(preflight.status, 204)
    assert.equal(preflight.headers.get('access-control-allow-origin'), ORIGIN)
    assert.equal(preflight.headers.get('access-control-allow-methods'), 'GET,POST')
    assert.equal(preflight.headers.get('access-control-allow-headers'), 'Authorization,Content-Type')
    const feed = await fetch(`${on.url}/feed`, { headers: { origin: ORIGIN } })
    assert.equal(feed.status, 200)
    assert.equal(feed.headers.get('access-control-allow-origin'), ORIGIN)
    const stranger = await fetch(`${on.url}/feed`, { headers: { origin: 'https://evil.example.com' } })
    assert.equal(stranger.headers.get('access-control-allow-origin'), null)
  })

  test('other methods are still a 405 that names the methods, and an unknown path a 404', async () => {
    const put = await fetch(`${on.url}/posts`, { method: 'PUT', headers: { origin: ORIGIN } })
    assert.equal(put.status, 405)
    assert.equal(put.headers.get('allow'), 'POST')
    assert.equal(await put.text(), '{"error":"method not allowed"}')
    const nowhere = await fetch(`${on.url}/nowhere`, { headers: { origin: ORIGIN } })
    assert.equal(nowhere.status, 404)
  })

  test('one line a request on stdout: method, path as sent, status, milliseconds; never the token', async () => {
    const token = await db.tokenFor(7)
    const like = await fetch(`${on.url}/posts/5/like?from=test`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}` },
    })
    assert.equal(like.status, 201)
    await fetch(`${on.url}/posts/%0Aabc`)
    const lines = on.stdout().split('\n')
    assert.ok(
      lines.some((line) => /^POST \/posts\/5\/like 201 \d+\.\dms$/.test(line)),
      on.stdout(),
    )
    assert.ok(
      lines.some((line) => /^GET \/posts\/%0Aabc 400 \d+\.\dms$/.test(line)),
      on.stdout(),
    )
    assert.ok(!on.output().includes(token.split('.')[2]), 'no token in the log')
  })

  test('unset: no CORS headers, a preflight is a 405, and nothing is logged a request', async () => {
    const preflight = await fetch(`${off.url}/posts`, {
      method: 'OPTIONS',
      headers: { origin: ORIGIN, 'access-control-request-method': 'POST' },
    })
    assert.equal(preflight.status, 405)
    assert.equal(preflight.headers.get('access-control-allow-origin'), null)
    const feed = await fetch(`${off.url}/feed`, { headers: { origin: ORIGIN } })
    assert.equal(feed.headers.get('access-control-allow-origin'), null)
    assert.doesNotMatch(off.stdout(), /^GET \/feed/m)
  })
})
