// npm run bench: the benchmark's modes, each a module with its own options (bench/README.md):
//
//   npm run bench [-- <options>]              the users holds and each endpoint at saturation, ours against
//                                             the floors and whatever the options add (bench/compare.ts);
//                                             --box: one process on one core against WORKERS=2 on both
//   npm run bench -- --cluster [--quick]      Litestream followers: a primary and a follower (bench/cluster.ts)
//   npm run bench -- --score [--full]         the challenge's score in the box's limits (bench/score.ts)
//   npm run bench -- --score --full --confirm-from <users>   only its warm-up and confirmation, from there down
//   npm run bench -- --score --full --resume <log>          a stopped run, on from its last level
//   npm run bench -- --score --k6 <k6 binary> its users generator against the real k6, at 10,000 users
//   npm run bench -- --instructions [--check | --record]     instructions a request, counted (bench/instructions.ts)
//   npm run bench -- --caches [--connections 4000]          a request in the caches, simulated (bench/caches.ts)
//
// The mode's flag picks the module; the rest of the arguments are its options.
const MODES = {
  '--cluster': './cluster.ts',
  '--score': './score.ts',
  '--instructions': './instructions.ts',
  '--caches': './caches.ts',
} as const

const argv = process.argv.slice(2)
const modes = Object.keys(MODES).filter((flag) => argv.includes(flag)) as (keyof typeof MODES)[]
if (modes.length > 1) throw new Error(`one mode at a time: ${modes.join(', ')}`)
const [mode] = modes
const { main }: { main: (argv: string[]) => Promise<void> } = await import(mode ? MODES[mode] : './compare.ts')
await main(argv.filter((arg) => arg !== mode))
