// docs/deploy.md's files, as a box would run them: the systemd unit checked by systemd-analyze, and its
// command on the database step 2 makes; nginx, the real one, with docs/deploy/nginx.conf and a
// certificate made here, in front of the built server on a fresh seed: the contract over HTTPS through
// it, its own refusals in the API's shape, and never a 502.
import assert from 'node:assert/strict'
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { connect as tlsConnect } from 'node:tls'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { sleep, within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { DRAIN_MS, KEEP_ALIVE_MS } from '../server/api-server.ts'
import { contractTests } from './contract.ts'
import { describeNeeding, freePort, post } from './helpers.ts'

const DEPLOY = join(ROOT, 'docs', 'deploy')
const UNIT = readFileSync(join(DEPLOY, 'twelve-dollar-feed.service'), 'utf8')
const GUIDE = readFileSync(join(ROOT, 'docs', 'deploy.md'), 'utf8')
const SITE = readFileSync(join(DEPLOY, 'nginx.conf'), 'utf8')
const which = (tool: string) => spawnSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).stdout.trim()
const seconds = (text: string, setting: RegExp) => Number(setting.exec(text)?.[1])

describeNeeding(!which('systemd-analyze') && 'no systemd-analyze here', 'the systemd unit', {}, () => {
  test('passes systemd-analyze verify, with nothing to warn of', () => {
    const dir = mkdtempSync(join(tmpdir(), 'unit-'))
    // Installed where this checkout is, so that its ExecStart's Node is there to check.
    const unit = join(dir, 'twelve-dollar-feed.service')
    writeFileSync(unit, UNIT.replaceAll('/opt/twelve-dollar-feed', ROOT))
    const verify = spawnSync('systemd-analyze', ['verify', unit], { encoding: 'utf8' })
    rmSync(dir, { recursive: true, force: true })
    assert.equal(verify.status, 0, verify.stderr)
    assert.equal(verify.stderr.trim(), '')
  })

  test("holds the box's files, and gives the drain its time", () => {
    assert.match(UNIT, /^LimitNOFILE=65535$/m)
    assert.match(UNIT, /^User=feed$/m)
    assert.match(UNIT, /^EnvironmentFile=\/etc\/twelve-dollar-feed\.env$/m)
    assert.ok(seconds(UNIT, /^TimeoutStopSec=(\d+)$/m) >= DRAIN_MS / 1000 + 10, 'the drain and a last sync fit')
  })
})

// Step 2 as docs/deploy.md has it: token.ts, run before the first start, makes the database and its
// first user; the unit's command then serves that database as it is, with no seed, and the token posts.
describe("the first start on the database docs/deploy.md's step 2 makes", { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'first-start-'))
  const env = { SQLITE_PATH: join(dir, 'feed.db'), JWT_SECRET: 'a secret of this run' }
  let api: Server
  let token = ''

  before(async () => {
    const step =
      / SQLITE_PATH=\/var\/lib\/twelve-dollar-feed\/feed\.db node_modules\/\.bin\/node (.*token\.ts alice)'$/m.exec(
        GUIDE,
      )
    assert.ok(step, "docs/deploy.md's step 2 runs token.ts as the service's user, on the service's database")
    const [made, started] = [step[0], 'systemctl enable --now'].map((line) => GUIDE.indexOf(line))
    assert.ok(made < started, 'step 2 makes the database before the service first starts')
    const run = spawnSync(process.execPath, step[1].split(' '), {
      cwd: ROOT,
      env: { PATH: process.env.PATH, ...env },
      encoding: 'utf8',
      timeout: 30_000,
    })
    assert.equal(run.status, 0, run.stderr)
    token = run.stdout.trim()
    const exec = /^ExecStart=\/opt\/twelve-dollar-feed\/node_modules\/\.bin\/node (.*)$/m.exec(UNIT)
    assert.ok(exec, "the unit runs the checkout's Node")
    api = await startServer(process.execPath, exec[1].split(' '), { env })
  })

  after(async () => {
    if (api) await within(api.stop(), 15_000, 'the server to exit on SIGTERM')
    rmSync(dir, { recursive: true, force: true })
  })

  test('is served as it is, not seeded, and the token step 2 printed posts with a 201', async () => {
    assert.match(api.output(), /seed: .* exists, serving it as it is/)
    const res = await post(api.url, '/posts', token, { body: 'hello' })
    assert.equal(res.status, 201)
    assert.equal((await res.json()).post.author, 'alice')
    assert.equal((await (await fetch(`${api.url}/feed`)).json()).posts.length, 1)
  })
})

describeNeeding(
  (!which('nginx') && 'no nginx here (Debian: nginx-light)') || (!which('openssl') && 'no openssl here'),
  'nginx with TLS in front, as docs/deploy/nginx.conf has it',
  { timeout: 120_000 },
  () => {
    const dir = mkdtempSync(join(tmpdir(), 'proxy-'))
    const db = freshSeededCopy()
    let api: Server
    let nginx: ChildProcess
    let https = ''
    let plainPort = 0
    const nginxLog = () => {
      try {
        return readFileSync(join(dir, 'error.log'), 'utf8')
      } catch {
        return '(no log)'
      }
    }

    before(async () => {
      execFileSync(
        'openssl',
        [
          'req',
          '-x509',
          '-newkey',
          'ec',
          '-pkeyopt',
          'ec_paramgen_curve:prime256v1',
          '-nodes',
          '-days',
          '1',
          '-subj',
          '/CN=localhost',
          '-addext',
          'subjectAltName=DNS:localhost',
          '-keyout',
          join(dir, 'key.pem'),
          '-out',
          join(dir, 'cert.pem'),
        ],
        { stdio: 'ignore' },
      )
      api = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
      const [tlsPort, port] = [await freePort(), await freePort()]
      plainPort = port
      // The site as the repository has it, but for where this run listens and keeps its certificate.
      const site = SITE.replace('server 127.0.0.1:3000;', `server ${new URL(api.url).host};`)
        .replace('listen 80;', `listen 127.0.0.1:${port};`)
        .replace('listen 443 ssl;', `listen 127.0.0.1:${tlsPort} ssl;`)
        .replaceAll('/etc/letsencrypt/live/feed.example.com/fullchain.pem', join(dir, 'cert.pem'))
        .replaceAll('/etc/letsencrypt/live/feed.example.com/privkey.pem', join(dir, 'key.pem'))
        .replaceAll('feed.example.com', 'localhost')
      writeFileSync(join(dir, 'site.conf'), site)
      for (const temp of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi']) mkdirSync(join(dir, temp))
      writeFileSync(
        join(dir, 'nginx.conf'),
        `daemon off; worker_processes 1; pid ${dir}/nginx.pid; error_log ${dir}/error.log;
events { worker_connections 256; }
http {
  access_log off;
  ${['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((t) => `${t === 'body' ? 'client_body' : t}_temp_path ${dir}/${t};`).join(' ')}
  include ${dir}/site.conf;
}
`,
      )
      nginx = spawn(which('nginx'), ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: 'ignore' })
      https = `https://localhost:${tlsPort}`
      // The certificate it presents is the one made here, for localhost; the fetches below then skip
      // the check, which a certificate of no authority would fail.
      for (
        const deadline = performance.now() + 10_000;
        !(await presents(tlsPort, readFileSync(join(dir, 'cert.pem'))));
      ) {
        if (performance.now() > deadline) throw new Error(`nginx did not serve TLS within 10 s: ${nginxLog()}`)
        await sleep(100)
      }
      process.env.NODE_TLS_REJECT_UNAUTHORIZED = '0'
    })

    after(async () => {
      nginx?.kill('SIGQUIT')
      if (nginx) await within(new Promise((resolve) => nginx.once('exit', resolve)), 10_000, 'nginx to stop')
      if (api) await within(api.stop(), 15_000, 'the server to exit on SIGTERM')
      db.remove()
      rmSync(dir, { recursive: true, force: true })
    })

    contractTests(() => ({ url: https, tokens: db.tokens }))

    test('a body past 16 KB is refused by nginx as the API refuses it: 413, the same JSON, closed', async () => {
      const res = await fetch(`${https}/posts`, {
        method: 'POST',
        headers: { authorization: `Bearer ${db.tokens[3].token}`, 'content-type': 'application/json' },
        body: JSON.stringify({ body: 'x'.repeat(17_000) }),
      })
      assert.equal(res.status, 413)
      assert.equal(await res.text(), '{"error":"request body must be at most 16 KB"}')
      assert.match(res.headers.get('content-type') ?? '', /^application\/json/)
      assert.equal(res.headers.get('x-content-type-options'), 'nosniff')
      assert.equal(res.headers.get('cache-control'), 'no-store')
      assert.equal(res.headers.get('connection'), 'close')
    })

    test('a header past 16 KB is a 431 in the JSON shape; one of 10 KB reaches the API', async () => {
      const big = await fetch(`${https}/posts/1`, { headers: { 'x-pad': 'p'.repeat(20_000) } })
      assert.equal(big.status, 431)
      assert.equal(await big.text(), '{"error":"request headers too large"}')
      const fits = await fetch(`${https}/posts/1`, { headers: { 'x-pad': 'p'.repeat(10_000) } })
      assert.equal(fits.status, 200)
      assert.match(await fits.text(), /^\{"post":\{"id":1,/)
    })

    test("idle connections to the API are closed by nginx first, so never a 502 for the API's close", () => {
      assert.ok(seconds(SITE, /keepalive_timeout (\d+)s;\n\}/) < KEEP_ALIVE_MS / 1000)
    })

    test('plain HTTP is sent to HTTPS', async () => {
      const res = await fetch(`http://localhost:${plainPort}/feed?x=1`, { redirect: 'manual' })
      assert.equal(res.status, 308)
      assert.equal(res.headers.get('location'), `https://localhost/feed?x=1`)
    })

    test('with the API down, nginx answers 503 in the JSON shape, not a 502', async () => {
      await within(api.stop(), 15_000, 'the server to exit on SIGTERM')
      const res = await fetch(`${https}/feed`)
      assert.equal(res.status, 503)
      assert.equal(res.headers.get('retry-after'), '1')
      assert.equal(await res.text(), '{"error":"server unavailable"}')
    })
  },
)

// Whether a TLS server on the port presents this certificate for localhost, checked against it.
function presents(port: number, cert: Buffer): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tlsConnect({ port, host: '127.0.0.1', servername: 'localhost', ca: cert }, () => {
      resolve(socket.authorized)
      socket.end()
    })
    socket.on('error', () => resolve(false))
    socket.setTimeout(2_000, () => (socket.destroy(), resolve(false)))
  })
}
