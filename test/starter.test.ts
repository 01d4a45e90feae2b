// app.ts as a starter: what the README's "Use app.ts as a starter" tells a copier to run, run as it is
// written there, in an empty folder beside this checkout, on a machine whose own `node` is too old (the
// README's lines put the Node the checkout brought first); then the contract on a fresh seed.
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { basename, join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { DEFAULT_SECRET, freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { contractTests } from './contract.ts'
import { post } from './helpers.ts'

// The section's blocks: its sh blocks' lines, as written, and the output it shows.
function starterSection(): { commands: string[]; write: string[]; shown: string } {
  const section = readFileSync(join(ROOT, 'README.md'), 'utf8').split('\n## Use `app.ts` as a starter\n')[1] ?? ''
  const blocks = [...section.split('\n## ')[0].matchAll(/```(sh|json)\n([\s\S]*?)```/g)].map(([, , text]) =>
    text.trim().split('\n'),
  )
  assert.equal(blocks.length, 3, 'README.md has the section: its commands, the write, and its answer')
  return { commands: blocks[0], write: blocks[1], shown: blocks[2].join('\n') }
}

// The files the section's cp line copies into the folder.
function copiedFiles(commands: string[]): string[] {
  const cp = commands.find((line) => line.startsWith('cp '))
  assert.ok(cp, 'the commands copy the files with cp')
  return cp
    .split(' ')
    .slice(1, -1)
    .map((path) => basename(path))
}

describe('app.ts as a starter, copied as the README says', { timeout: 180_000 }, () => {
  // The folder the README's commands run in, with this checkout beside it by the name they use.
  const folder = mkdtempSync(join(tmpdir(), 'starter-'))
  symlinkSync(ROOT, join(folder, 'twelve-dollar-feed'))
  // A machine whose own node is older than the pin: a stand-in that stops at the flag Node 20 does not
  // know, as Node 20 does, and runs anything else (npm) on this Node.
  const old = join(folder, 'old-node')
  mkdirSync(old)
  writeFileSync(
    join(old, 'node'),
    `#!/bin/sh
for arg; do [ "$arg" = --experimental-import-text ] && { echo "node: bad option: $arg" >&2; exit 9; }; done
exec '${process.execPath}' "$@"
`,
  )
  chmodSync(join(old, 'node'), 0o755)
  const db = freshSeededCopy()
  // That node first on the PATH, and a home of its own.
  const env = {
    PATH: `${old}:${process.env.PATH}`,
    HOME: folder,
    npm_config_prefer_offline: 'true',
    npm_config_audit: 'false',
    npm_config_fund: 'false',
    npm_config_update_notifier: 'false',
  }
  const { commands, write, shown } = starterSection()
  let server: Server

  before(async () => {
    const setup = commands.slice(0, -1)
    // npm with the machine's environment (its registry and CA settings: it asks the registry for the
    // packages' metadata, which npm ci never cached); the server below without it.
    const run = spawnSync('bash', ['-euxc', setup.join('\n')], {
      cwd: folder,
      env: { ...process.env, ...env, npm_config_cache: join(process.env.HOME ?? '/root', '.npm') },
      stdio: ['ignore', 'pipe', 'pipe'],
      encoding: 'utf8',
      timeout: 120_000,
    })
    assert.equal(
      run.status,
      0,
      `the README's commands (${run.error?.message ?? `exit ${run.status}`}):\n${run.stdout}${run.stderr}`,
    )
    const cd = /^mkdir (\S+) && cd \1$/.exec(setup[0])?.[1]
    assert.ok(cd, `the first command makes the folder and enters it: ${setup[0]}`)
    // The last command in the same terminal: what the lines before it exported, then the server.
    const exported = setup.filter((line) => line.startsWith('export '))
    server = await startServer('bash', ['-euc', [...exported, `exec ${commands.at(-1)}`].join('\n')], {
      cwd: join(folder, cd),
      env: { ...env, SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET },
    })
  })

  after(async () => {
    if (server) await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
    // The link to this checkout first, so that nothing removes what it points to.
    unlinkSync(join(folder, 'twelve-dollar-feed'))
    rmSync(folder, { recursive: true, force: true })
  })

  test('the folder holds only what the README copied and installed', () => {
    const dir = join(folder, commands[0].split(' ')[1])
    const { dependencies } = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'))
    const ours = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).dependencies
    assert.deepEqual(dependencies, { hono: ours.hono, '@hono/node-server': ours['@hono/node-server'] })
    const copied = copiedFiles(commands)
    assert.deepEqual(readdirSync(dir).sort(), [...copied, 'node_modules', 'package-lock.json', 'package.json'].sort())
    // What app.ts names beside itself: the files it imports, and the types it references for an editor.
    const source = readFileSync(join(ROOT, 'app.ts'), 'utf8')
    const named = [...source.matchAll(/^import .* from '\.\/([^']+)'|^\/\/\/ <reference path="([^"]+)"/gm)].map(
      ([, file, types]) => file ?? types,
    )
    assert.ok(named.includes('schema.sql') && named.includes('types.d.ts'), `app.ts names ${named.join(', ')}`)
    for (const file of named) assert.ok(copied.includes(file), `the README copies ${file}, which app.ts names`)
  })

  test('a like is a 201 the first time', async () => {
    const res = await post(server.url, '/posts/77/like', db.tokens[41].token)
    assert.equal(res.status, 201)
    assert.equal(await res.text(), '{"liked":true,"already_liked":false,"post_id":77}')
  })

  contractTests(() => ({ url: server.url, tokens: db.tokens }))

  // After the contract's tests, whose goldens are the seed's feed.
  test("token.ts makes a user and a token, and the README's curl posts with it", () => {
    // The section's second block as written, with the server's port for 3000.
    const run = spawnSync('bash', ['-euc', write.join('\n').replaceAll('localhost:3000', server.url.slice(7))], {
      cwd: join(folder, commands[0].split(' ')[1]),
      env: { ...env, SQLITE_PATH: db.path, JWT_SECRET: DEFAULT_SECRET },
      encoding: 'utf8',
      timeout: 30_000,
    })
    assert.equal(run.status, 0, run.stderr)
    // The answer shown, but for the id and the time, which differ on a seeded database.
    const [post, answer] = [shown, run.stdout].map((text) => JSON.parse(text).post)
    assert.ok(Number.isSafeInteger(answer.id) && answer.id > 0 && !Number.isNaN(Date.parse(answer.created_at)))
    assert.deepEqual({ ...answer, id: 0, created_at: '' }, { ...post, id: 0, created_at: '' })
  })

  test('SIGTERM stops it with exit 0', async () => {
    assert.equal(await within(server.stop('SIGTERM'), 15_000, 'the server to exit on SIGTERM'), 0)
  })
})
