// What the replication tests share: streams of acknowledged writes, what a database holds of them,
// and Litestream's own restore, run by hand as docs/litestream.md tells.
import { spawnSync } from 'node:child_process'
import { existsSync, readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { DatabaseSync } from 'node:sqlite'
import { processTree } from '../harness/proc.ts'
import type { Token } from '../harness/seed.ts'
import { sleep, within } from '../harness/time.ts'
import { LITESTREAM } from '../harness/tools.ts'

// Litestream 0.5.17 or later (harness/tools.ts finds it); start.ts is given the same one. Without it
// the tests that need it skip, saying so (NO_LITESTREAM). A Litestream process here gets PATH and what
// it is given, never the machine's AWS_CA_BUNDLE: with it set, Litestream's S3 client fails to start.
export const LITESTREAM_ENV = { LITESTREAM_BIN: LITESTREAM ?? 'litestream' }

// Litestream 0.3.13 (a test-only dependency: test/litestream-0.3), which wrote the replicas of the
// project's earlier releases. Undefined where npm could not install it (it is for linux-x64 only).
export const OLD_LITESTREAM = (() => {
  try {
    return createRequire(import.meta.url).resolve('@flydotio/litestream-linux-x64/litestream')
  } catch {}
})()

// SIGKILL to Litestream and the server under it, at once: nothing gets to send a last frame. Each is
// stopped (SIGSTOP) before any is killed: the kills go one process after another, and a server that
// outlived Litestream by a moment (this process preempted between two kills, on a busy machine) would
// answer a write waiting on the control socket that Litestream's death closed. A stopped process keeps
// its sockets and runs nothing. Resolves once every one of them is gone (a zombie counts as gone), or
// fails after 10 s.
export async function killEverything(pid: number) {
  const tree = processTree(pid)
  for (const p of tree) process.kill(p, 'SIGSTOP')
  for (const p of tree) process.kill(p, 'SIGKILL')
  const alive = (p: number) => existsSync(`/proc/${p}`) && !/\) Z /.test(readFileSync(`/proc/${p}/stat`, 'utf8'))
  for (const deadline = performance.now() + 10_000; tree.some(alive); await sleep(10)) {
    if (performance.now() > deadline)
      throw new Error(`processes ${tree.filter(alive).join(', ')} still there 10 s after SIGKILL`)
  }
}

// Litestream's default: how often a replica is sent what is new (start.ts changes none of its settings).
export const SYNC_INTERVAL_MS = 1_000

export type Write = { at: number; ms: number } & (
  { kind: 'post'; id: number; body: string } | { kind: 'like'; userId: number; postId: number }
)

// Lanes of concurrent writes until stop(), each creating a post and then liking it as another user,
// so the group commit always has company, pausing pauseMs after each pair. Every 201 is kept with the
// time it arrived and how long it took; any other answer is an error. A lane ends when the server is
// gone; stop() fails when the lanes have not ended 30 s after it.
export function writeStream(url: string, tokens: Token[], label: string, { lanes = 16, pauseMs = 0 } = {}) {
  const acknowledged: Write[] = []
  const errors: string[] = []
  let running = true
  const send = async (path: string, token: string, body?: string) => {
    const sent = performance.now()
    const res = await fetch(url + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body,
    })
    const text = await res.text()
    if (res.status !== 201) throw new Error(`${res.status} ${text}`)
    return { at: performance.now(), ms: performance.now() - sent, answer: JSON.parse(text) }
  }
  const lane = async (n: number) => {
    for (let i = 0; running; i++) {
      const author = tokens[(n * 7 + i) % tokens.length]
      const liker = tokens[(n * 7 + i + 1) % tokens.length]
      const body = `${label}, lane ${n}, write ${i}`
      try {
        const post = await send('/posts', author.token, JSON.stringify({ body }))
        acknowledged.push({ kind: 'post', id: post.answer.post.id, body, at: post.at, ms: post.ms })
        const like = await send(`/posts/${post.answer.post.id}/like`, liker.token)
        acknowledged.push({ kind: 'like', userId: liker.id, postId: post.answer.post.id, at: like.at, ms: like.ms })
        if (pauseMs) await sleep(pauseMs)
      } catch (error) {
        if (error instanceof TypeError) return // fetch failed: the server is gone
        errors.push(String((error as Error).message))
      }
    }
  }
  const done = Promise.all(Array.from({ length: lanes }, (_, n) => lane(n)))
  return {
    acknowledged,
    errors,
    done,
    stop: () => {
      running = false
      return within(done, 30_000, `the writes of ${label} to end`)
    },
  }
}

// The acknowledged writes that the database at path does not hold, and its integrity_check.
export function notIn(path: string, writes: Write[]) {
  const db = new DatabaseSync(path, { readOnly: true })
  try {
    const integrity = (db.prepare('PRAGMA integrity_check').get() as { integrity_check: string }).integrity_check
    const post = db.prepare('SELECT body FROM posts WHERE id = ?')
    const like = db.prepare('SELECT 1 AS found FROM likes WHERE user_id = ? AND post_id = ?')
    const missing = writes.filter((w) =>
      w.kind === 'post'
        ? (post.get(w.id) as { body?: string } | undefined)?.body !== w.body
        : !like.get(w.userId, w.postId),
    )
    return { integrity, missing }
  } finally {
    db.close()
  }
}

// `litestream restore -o <path> <replica URL>`, by hand as docs/litestream.md tells.
export function restoreByHand(url: string, path: string, env: Record<string, string> = {}) {
  const run = spawnSync(LITESTREAM!, ['restore', '-o', path, url], {
    encoding: 'utf8',
    env: { PATH: process.env.PATH, ...env },
  })
  if (run.status !== 0) throw new Error(`litestream restore: ${run.stdout}${run.stderr}`)
}

// Milliseconds at the given percentile of the writes' durations.
export function percentile(writes: Write[], p: number) {
  const ms = writes.map((w) => w.ms).sort((a, b) => a - b)
  return ms[Math.min(ms.length - 1, Math.floor((p / 100) * ms.length))] ?? 0
}
