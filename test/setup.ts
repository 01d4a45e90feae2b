// Runs once per `npm test`: builds the bundles and finds the seeded database that every contract test
// copies fresh for each server it starts: the benchmarks' (bench/.cache), seeded once for each version
// of the seed's bundle, so that `npm test`, `npm run test:faults` and `npm run bench` seed it once.
import { execFileSync } from 'node:child_process'
import { join } from 'node:path'
import { seededDatabase } from '../harness/seed.ts'

export async function globalSetup() {
  execFileSync(process.execPath, ['build.mjs'], { cwd: join(import.meta.dirname, '..'), stdio: 'inherit' })
  const started = performance.now()
  const { db } = seededDatabase({ quiet: true })
  console.log(`seeded database: ${db} (${((performance.now() - started) / 1000).toFixed(1)} s)`)
  process.env.TEST_SEED_DB = db
}
