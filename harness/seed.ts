// The challenge's seeded database, for the tests and the benchmark alike: seeded once per version of
// the seed into bench/.cache, and copied fresh for every server that runs on it.
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { isRunning } from './proc.ts'
import { ROOT } from './tools.ts'

// The cache the seed and the benchmark's runs keep their files in (git ignores it).
export const CACHE = join(ROOT, 'bench', '.cache')

// The secret seed.ts signs tokens.json with when JWT_SECRET is unset, which app.ts defaults to as well
// (the challenge's public default): a server given it accepts the seed's tokens.
export const DEFAULT_SECRET = 'twelve-dollar-challenge'

export type Seed = { db: string; tokens: string }
export type Token = { id: number; username: string; token: string }

// One seeded database per version of the seed, kept in bench/.cache: the tests and the benchmarks copy it
// for every server they start. The version is the seed's bundle (dist/seed.js: everything the seed runs,
// the signing of its tokens included), so a change to any of it seeds again. The seed is built in a folder
// of its own and renamed into place whole: a run stopped halfway, or two runs at once, leave no half of one.
export function seededDatabase({ quiet = false } = {}): Seed {
  const hash = createHash('sha256')
    .update(readFileSync(join(ROOT, 'dist', 'seed.js')))
    .digest('hex')
    .slice(0, 12)
  const dir = join(CACHE, `seed-${hash}`)
  const seed = { db: join(dir, 'feed.db'), tokens: join(dir, 'tokens.txt') }
  if (existsSync(dir)) return seed
  console.error('seeding the challenge database once for this version of the seed, into bench/.cache (about 30 s)')
  const partial = `${dir}.${process.pid}`
  mkdirSync(CACHE, { recursive: true })
  for (const name of readdirSync(CACHE)) {
    // what runs stopped halfway left behind
    const pid = Number(/^seed-[0-9a-f]+\.(\d+)$/.exec(name)?.[1])
    if (pid && !isRunning(pid)) rmSync(join(CACHE, name), { recursive: true, force: true })
  }
  try {
    execFileSync(process.execPath, [join(ROOT, 'dist', 'seed.js'), join(partial, 'feed.db')], {
      stdio: ['ignore', 'ignore', quiet ? 'pipe' : 'inherit'],
    })
  } catch (error) {
    if (quiet) console.error(String((error as { stderr?: Buffer }).stderr ?? ''))
    throw error
  }
  const list = JSON.parse(readFileSync(join(partial, 'tokens.json'), 'utf8')) as { token: string }[]
  writeFileSync(join(partial, 'tokens.txt'), list.map((t) => t.token).join('\n') + '\n')
  try {
    renameSync(partial, dir)
  } catch (error) {
    if (!existsSync(dir)) throw error
    rmSync(partial, { recursive: true, force: true }) // another run finished the same seed first
  }
  return seed
}

// A fresh copy of the run's seeded database (TEST_SEED_DB, which test/setup.ts sets), in a folder of its
// own, with its tokens.
export function freshSeededCopy() {
  const seed = process.env.TEST_SEED_DB
  if (!seed) throw new Error('TEST_SEED_DB is not set: run the tests with `npm test`')
  const dir = mkdtempSync(join(tmpdir(), 'feed-db-'))
  const path = join(dir, 'feed.db')
  copyFileSync(seed, path)
  const tokens: Token[] = JSON.parse(readFileSync(join(dirname(seed), 'tokens.json'), 'utf8'))
  return { dir, path, tokens, remove: () => rmSync(dir, { recursive: true, force: true }) }
}
