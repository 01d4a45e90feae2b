// What the tests that run the built server as a real process share, beyond what the benchmark shares
// with them (harness/): health probes, attackers, tokens, requests, load on a cluster, small databases,
// and the user a server runs as.
import assert from 'node:assert/strict'
import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { chmodSync, copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { DatabaseSync } from 'node:sqlite'
import { describe, test, type TestOptions } from 'node:test'
import { sign } from 'hono/jwt'
import { exchange } from '../harness/client.ts'
import { cpuTicks, memoryKb, TICK_US } from '../harness/proc.ts'
import { DEFAULT_SECRET, type Token } from '../harness/seed.ts'
import { holdsWithin, sleep, within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'

// A describe whose tests need what this machine may lack (Litestream, Docker, k6, sqlite3, a corpus):
// where `missing` says why it is not here, a skipped test of the same name stands in for the whole, so
// that the run's summary counts it among the skipped, with the reason (node:test counts no skipped
// describe). With REQUIRE_TOOLS set (CI, which installs every tool) it fails instead.
export function describeNeeding(
  missing: string | false,
  name: string,
  options: Omit<TestOptions, 'skip'>,
  tests: () => void,
) {
  if (!missing) describe(name, options, tests)
  else if (process.env.REQUIRE_TOOLS) test(name, () => assert.fail(`REQUIRE_TOOLS is set, and ${missing}`))
  else test(name, { skip: missing })
}

// A test's `skip` for what this machine may lack, as describeNeeding's.
export const skipUnless = (missing: string | false) => (missing && process.env.REQUIRE_TOOLS ? false : missing)

// Polls /health the way a load balancer or the challenge does; resolves with the seconds it took.
export async function waitHealthy(url: string, timeoutMs: number): Promise<number> {
  const started = performance.now()
  while (performance.now() - started < timeoutMs) {
    const ok = await fetch(`${url}/health`).then(
      (r) => r.ok,
      () => false,
    )
    if (ok) return (performance.now() - started) / 1000
    await sleep(100)
  }
  throw new Error(`${url}/health was not 200 within ${timeoutMs / 1000} s`)
}

// /health asked every everyMs until stop(), on a connection of its own each time, as a load balancer
// does: how long each answer took (2 s when none came), and every answer that was not a 200.
export function probeHealth(port: number, everyMs = 20) {
  const latencies: number[] = []
  const failures: string[] = []
  let stopped = false
  const probing = (async () => {
    while (!stopped) {
      const sent = performance.now()
      const answer = await exchange(port, 'GET /health HTTP/1.1\r\nHost: probe\r\n\r\n', { timeoutMs: 2_000 })
      latencies.push(performance.now() - sent)
      if (answer.status !== 200) failures.push(`${answer.status ?? 'no answer'} ${answer.body}`)
      await sleep(everyMs)
    }
  })()
  return {
    stop: async () => {
      stopped = true
      await probing
      return { latencies, failures, max: Math.max(...latencies) }
    },
  }
}

type Attack = { connections: number; depth?: number; every?: number; seconds: number }

// test/pipelining-attacker.ts in a process of its own, its connections open: go() starts the attack and
// resolves with the attacker's "done" line; it rejects when none came within the attack's seconds and
// 30 s more, or when the attacker did not connect within 30 s.
export async function pipeliningAttacker(port: number, attack: Attack) {
  const args = Object.entries(attack).flatMap(([name, value]) => [`--${name}`, String(value)])
  const child = spawn(
    'nice',
    ['-n', '19', process.execPath, join(ROOT, 'test', 'pipelining-attacker.ts'), '--port', String(port), ...args],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  const events: Record<string, any>[] = []
  let buffered = ''
  child.stdout.on('data', (chunk) => {
    const lines = (buffered += chunk).split('\n')
    buffered = lines.pop()!
    events.push(...lines.map((line) => JSON.parse(line)))
  })
  const exited = once(child, 'exit')
  const event = async (name: string, timeoutMs: number) => {
    const said = () => events.find((e) => e.event === name)
    await holdsWithin(() => said() !== undefined || child.exitCode !== null, timeoutMs)
    if (said()) return said()!
    child.kill('SIGKILL')
    throw new Error(
      `the attacker did not say "${name}" within ${timeoutMs / 1000} s (exit ${child.exitCode}): ${JSON.stringify(events)}`,
    )
  }
  await event('connected', 30_000)
  return {
    go: async (): Promise<{ connections: number; open: number; requests: number }> => {
      child.stdin.end('go\n')
      const done = await event('done', (attack.seconds + 30) * 1000)
      await within(exited, 10_000, 'the attacker to exit after its report')
      return done as any
    },
  }
}

// A port nothing listens on right now, for a server that starts later. Below the kernel's ephemeral
// range (32768 up): a port from there could go to any outgoing connection meanwhile, or to a server
// listening on port 0 (CI once failed so, EADDRINUSE). Never the same one twice in a process.
const handedOut = new Set<number>()
export async function freePort(): Promise<number> {
  for (;;) {
    const port = 10_000 + Math.floor(Math.random() * 22_000)
    if (handedOut.has(port)) continue
    const server = createServer().listen(port, '127.0.0.1')
    const bound = await Promise.race([
      once(server, 'listening').then(() => true),
      once(server, 'error').then(() => false),
    ])
    if (!bound) continue
    server.close()
    handedOut.add(port)
    return port
  }
}

const base64url = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

// A token for the tests' own claims, signed with HS256 (or left unsigned for alg "none").
export async function makeToken(
  payload: Record<string, unknown>,
  { secret = DEFAULT_SECRET, alg = 'HS256' }: { secret?: string; alg?: string } = {},
) {
  if (alg === 'none') return `${base64url({ alg: 'none', typ: 'JWT' })}.${base64url(payload)}.`
  return sign(payload, secret, alg as 'HS256')
}

export const now = () => Math.floor(Date.now() / 1000)
export const claims = (sub: unknown, username: unknown = `user_${sub}`) => ({
  sub,
  username,
  iat: now(),
  exp: now() + 3600,
})

// A POST as a client sends it: the user's token, a JSON body when there is one.
export const post = (base: string, path: string, token: string, body?: unknown, signal?: AbortSignal) =>
  fetch(base + path, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  })

// Load on a cluster until stop(): a writer creating posts on each node of `writers`, two readers of
// posts on node `readsOn`. Every 201 is kept; every other answer is wrong unless `allowed` excuses it
// on that node. A request that cannot connect or times out is neither: its node may be gone.
export function clusterLoad(
  url: (node: number) => string,
  tokens: Token[],
  {
    writers,
    readsOn,
    timeoutMs,
    allowed = () => false,
  }: {
    writers: number[]
    readsOn: number
    timeoutMs: number
    allowed?: (status: number, node: number) => boolean
  },
) {
  const acknowledged: { id: number; text: string }[] = []
  const wrong: string[] = []
  let running = true
  let n = 0
  const writer = async (node: number) => {
    while (running) {
      const k = n++
      const res = await post(
        url(node),
        '/posts',
        tokens[10_000 + (k % 5000)].token,
        { body: `under load ${k}` },
        AbortSignal.timeout(timeoutMs),
      ).catch(() => undefined)
      const text = await res?.text().catch(() => undefined)
      if (!res || text === undefined) continue
      if (res.status === 201) acknowledged.push({ id: JSON.parse(text).post.id, text })
      else if (!allowed(res.status, node)) wrong.push(`${res.status} ${text}`)
    }
  }
  const reader = async () => {
    while (running) {
      const res = await fetch(`${url(readsOn)}/posts/${1 + (n % 500_000)}`, {
        signal: AbortSignal.timeout(5_000),
      }).catch(() => undefined)
      const text = await res?.text().catch(() => undefined)
      if (!res || text === undefined || (res.status === 200 && text.startsWith('{"post":{'))) continue
      if (!allowed(res.status, readsOn)) wrong.push(`${res.status} ${text}`)
    }
  }
  const load = [...writers.map(writer), reader(), reader()]
  return {
    acknowledged,
    wrong,
    stop: async () => {
      running = false
      await Promise.all(load)
    },
  }
}

// A small database of the challenge's schema, made in a moment: 50 users, 100 posts, a few likes.
export function smallDatabase() {
  const dir = mkdtempSync(join(tmpdir(), 'feed-small-'))
  const path = join(dir, 'feed.db')
  const db = new DatabaseSync(path)
  db.exec(readFileSync(join(ROOT, 'schema.sql'), 'utf8'))
  db.exec('PRAGMA journal_mode = WAL')
  const user = db.prepare('INSERT INTO users (id, username) VALUES (?, ?)')
  const post = db.prepare('INSERT INTO posts (id, user_id, body, created_at) VALUES (?, ?, ?, ?)')
  for (let id = 1; id <= 50; id++) user.run(id, `user_${id}`)
  for (let id = 1; id <= 100; id++)
    post.run(id, 1 + (id % 50), `post ${id}`, new Date(Date.UTC(2025, 0, 1, 0, 0, id)).toISOString())
  db.exec('INSERT INTO likes (user_id, post_id) VALUES (1, 1), (2, 1), (3, 2)')
  db.close()
  const tokenFor = (id: number) => makeToken(claims(String(id), `user_${id}`))
  return { dir, path, tokenFor, remove: () => rmSync(dir, { recursive: true, force: true }) }
}

// Hands a folder and what is in it to the user a test runs a server as (see asUser).
export function giveTo(user: { uid?: number; gid?: number }, ...paths: string[]) {
  if (user.uid === undefined) return
  for (const path of paths) execFileSync('chown', ['-R', `${user.uid}:${user.gid}`, path])
}

// When the tests run as root, servers run as uid 1000, as the image does: root ignores file modes.
export const asUser: { uid?: number; gid?: number } = process.getuid?.() === 0 ? { uid: 1000, gid: 1000 } : {}

// Node and the bundle where asUser can run them: a checkout in a private folder (`mktemp -d` makes
// one) hides its node_modules/.bin/node and dist/ from every other user, so that user gets copies.
let runnable: { dir: string; node: string; app: string } | undefined
export function runnableByUser() {
  if (asUser.uid === undefined)
    return { dir: dirname(process.execPath), node: process.execPath, app: join(ROOT, 'dist', 'app.js') }
  if (!runnable) {
    const dir = mkdtempSync(join(tmpdir(), 'feed-runnable-'))
    chmodSync(dir, 0o755)
    runnable = { dir, node: join(dir, 'node'), app: join(dir, 'app.js') }
    copyFileSync(process.execPath, runnable.node)
    copyFileSync(join(ROOT, 'dist', 'app.js'), runnable.app)
    chmodSync(runnable.node, 0o755)
    chmodSync(runnable.app, 0o644)
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }))
  }
  return runnable
}

// What a server's process spends from now to stop(): its CPU (utime + stime, every thread), its RSS
// now, and its peak RSS above that: by VmHWM once reset (/proc/<pid>/clear_refs), where this process may
// reset it, and by VmRSS read every `everyMs`.
export function meterProcess(pid: number, everyMs = 20) {
  const cpu = cpuTicks(pid).total
  const restKb = memoryKb(pid, 'VmRSS')
  let peakKb = restKb
  let peakReset = true
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5')
  } catch {
    peakReset = false // not this process's to reset: the samples alone
  }
  const sampling = setInterval(() => {
    try {
      peakKb = Math.max(peakKb, memoryKb(pid, 'VmRSS'))
    } catch {} // the process has gone: the test's own checks say so
  }, everyMs)
  return {
    stop: () => {
      clearInterval(sampling)
      peakKb = Math.max(peakKb, memoryKb(pid, peakReset ? 'VmHWM' : 'VmRSS'))
      return { cpuMs: ((cpuTicks(pid).total - cpu) * TICK_US) / 1000, restKb, growthKb: peakKb - restKb }
    },
  }
}
