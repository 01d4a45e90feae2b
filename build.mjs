// Bundles app.ts, seed.ts and start.ts into dist/, one file each, that run on Node 24 with nothing beside them.
import { build } from 'esbuild'
import { rmSync, statSync } from 'node:fs'

const outputs = { 'dist/app.js': 'app.ts', 'dist/seed.js': 'seed.ts', 'dist/start.js': 'start.ts' }
// dist/ holds exactly these files: the container copies the folder whole.
rmSync('dist', { recursive: true, force: true })

for (const [outfile, entry] of Object.entries(outputs)) {
  await build({
    entryPoints: [entry],
    outfile,
    bundle: true,
    platform: 'node',
    target: 'node24',
    format: 'esm',
    // Not minified: the bundle is small either way, and stack traces keep their names.
    legalComments: 'none',
    logLevel: 'warning',
  })
  console.log(`${outfile}  ${(statSync(outfile).size / 1024).toFixed(1)} KB`)
}
