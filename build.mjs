// Bundles the server (app.ts served by server/), seed.ts and start.ts into dist/, one file each, that run
// on the pinned Node with nothing beside them.
//
//   node build.mjs [--outdir dist] [--sourcemap]     (the profiler builds a source-mapped copy elsewhere)
import { build } from 'esbuild'
import { rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from 'node:util'

const { values: options } = parseArgs({
  options: { outdir: { type: 'string', default: 'dist' }, sourcemap: { type: 'boolean', default: false } },
})
const entries = { 'app.js': 'server/main.ts', 'seed.js': 'seed.ts', 'start.js': 'start.ts' }

// The folder holds exactly these bundles: the container copies it whole.
rmSync(options.outdir, { recursive: true, force: true })

for (const [bundle, entry] of Object.entries(entries)) {
  const outfile = join(options.outdir, bundle)
  await build({
    entryPoints: [entry],
    outfile,
    bundle: true,
    platform: 'node',
    target: 'node26',
    format: 'esm',
    // Not minified: the bundle is small either way, and stack traces keep their names.
    sourcemap: options.sourcemap,
    legalComments: 'none',
    // app.ts serves itself when it is the script run (`node app.ts`); in the bundle, server/main.ts does.
    define: { 'import.meta.main': 'false' },
    logLevel: 'warning',
  })
  console.log(`${outfile}  ${(statSync(outfile).size / 1024).toFixed(1)} KB`)
}
