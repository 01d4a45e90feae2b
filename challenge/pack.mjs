// Assembles the challenge submission: this folder's scripts and README with the sources they build,
// self-contained, ready to copy into the challenge repository as submissions/<name>/.
//
//   node challenge/pack.mjs [outdir]     (default dist/challenge/typescript-hono-node-sqlite)
import { cpSync, mkdirSync, rmSync } from 'node:fs'
import { join } from 'node:path'

const root = join(import.meta.dirname, '..')
const outdir = process.argv[2] || join(root, 'dist', 'challenge', 'typescript-hono-node-sqlite')
const FILES = {
  challenge: ['install.sh', 'build.sh', 'start.sh', 'README.md'],
  '.': [
    'package.json',
    'package-lock.json',
    '.npmrc',
    'build.mjs',
    'app.ts',
    'server',
    'seed.ts',
    'random.ts',
    'start.ts',
    'schema.sql',
    'token.ts',
    'LICENSE',
  ],
}

rmSync(outdir, { recursive: true, force: true })
mkdirSync(outdir, { recursive: true })
for (const [dir, files] of Object.entries(FILES)) {
  for (const file of files) cpSync(join(root, dir, file), join(outdir, file), { recursive: true })
}
console.log(`challenge submission in ${outdir}`)
