// The seed: its content checksum, proved by the sqlite3 shell that defines it, and its guards.
import assert from 'node:assert/strict'
import { execFileSync, spawnSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { describe, test } from 'node:test'
import { verify } from 'hono/jwt'
import { DEFAULT_SECRET, freshSeededCopy } from '../harness/seed.ts'
import { ROOT } from '../harness/tools.ts'
import { skipUnless } from './helpers.ts'

const CHECKSUM = '738d11ab3164c13177e347f75038d1e80b43c64e754544a42d1c32bd8d7bcf1d'
const hasSqliteShell = spawnSync('sqlite3', ['--version']).status === 0

describe('the seeded database', () => {
  test(
    'has the challenge checksum, as the sqlite3 shell prints its rows',
    { skip: skipUnless(!hasSqliteShell && 'sqlite3 shell not installed (.ci/run installs it)') },
    () => {
      const db = freshSeededCopy()
      try {
        const rows = execFileSync(
          'sqlite3',
          [
            db.path,
            'SELECT * FROM users ORDER BY id; SELECT * FROM posts ORDER BY id; SELECT * FROM likes ORDER BY post_id, user_id;',
          ],
          { maxBuffer: 1 << 30 },
        )
        assert.equal(createHash('sha256').update(rows).digest('hex'), CHECKSUM)
        const pragmas = execFileSync('sqlite3', [
          db.path,
          'PRAGMA journal_mode; PRAGMA page_size; SELECT count(*) > 0 FROM sqlite_stat1;',
        ]).toString()
        assert.equal(pragmas, 'wal\n4096\n1\n')
      } finally {
        db.remove()
      }
    },
  )

  test('comes with tokens for users 1 to 20,000, HS256 with the default secret, valid for ten years', async () => {
    const { tokens } = freshSeededCopy()
    assert.equal(tokens.length, 20_000)
    assert.deepEqual(
      tokens.map((t) => t.id),
      Array.from({ length: 20_000 }, (_, i) => i + 1),
    )
    const [header, payload] = tokens[19_999].token.split('.').map((part) => Buffer.from(part, 'base64url').toString())
    assert.equal(header, '{"alg":"HS256","typ":"JWT"}')
    const claims = JSON.parse(payload)
    assert.deepEqual(Object.keys(claims), ['sub', 'username', 'iat', 'exp'])
    assert.equal(claims.sub, '20000')
    assert.equal(claims.username, tokens[19_999].username)
    assert.equal(claims.exp - claims.iat, 3650 * 86_400)
    assert.deepEqual(
      await verify(tokens[0].token, DEFAULT_SECRET, 'HS256'),
      JSON.parse(Buffer.from(tokens[0].token.split('.')[1], 'base64url').toString()),
    )
  })
})

describe('the seed command', () => {
  test('refuses to replace an existing database without --force, and leaves it alone', () => {
    const db = freshSeededCopy()
    try {
      const before = statSync(db.path).mtimeMs
      const run = spawnSync(process.execPath, [join(ROOT, 'dist/seed.js'), db.path], { encoding: 'utf8' })
      assert.equal(run.status, 1)
      assert.match(run.stderr, /exists; pass --force to replace it/)
      assert.equal(statSync(db.path).mtimeMs, before)
    } finally {
      db.remove()
    }
  })

  test('with --if-missing, leaves an existing database alone and succeeds', () => {
    const db = freshSeededCopy()
    try {
      const before = readFileSync(db.path).subarray(0, 100)
      const run = spawnSync(process.execPath, [join(ROOT, 'dist/seed.js'), '--if-missing'], {
        encoding: 'utf8',
        env: { ...process.env, SQLITE_PATH: db.path },
      })
      assert.equal(run.status, 0)
      assert.match(run.stderr, /exists, serving it as it is/)
      assert.deepEqual(readFileSync(db.path).subarray(0, 100), before)
    } finally {
      db.remove()
    }
  })
})
