// Runs once per `npm test`: builds the bundles and seeds one database that every
// contract test copies fresh for each server it starts.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const root = join(import.meta.dirname, '..')
let dir = ''

export async function globalSetup() {
  execFileSync(process.execPath, ['build.mjs'], { cwd: root, stdio: 'inherit' })
  dir = mkdtempSync(join(tmpdir(), 'feed-test-'))
  const started = performance.now()
  const seedDb = join(dir, 'seed.db')
  try {
    execFileSync(process.execPath, ['dist/seed.js', seedDb], { cwd: root, stdio: 'pipe' })
  } catch (err) {
    console.error((err as { stderr?: Buffer }).stderr?.toString())
    throw err
  }
  console.log(`seeded ${seedDb} in ${((performance.now() - started) / 1000).toFixed(1)} s`)
  process.env.TEST_SEED_DB = seedDb
}

export async function globalTeardown() {
  if (dir) rmSync(dir, { recursive: true, force: true })
}
