// Where things are, for the tests and the benchmark alike: the repository, and the tools they run
// beside the project (Litestream 0.5, k6), found the same way by both.
import { existsSync } from 'node:fs'
import { join } from 'node:path'

export const ROOT = join(import.meta.dirname, '..')

// The workplace keeps its tools in a folder beside the clone: SHARED_TOOLS, else ../shared/tools.
const SHARED_TOOLS = process.env.SHARED_TOOLS || join(ROOT, '..', 'shared', 'tools')
const found = (...paths: (string | undefined)[]) => paths.find((path) => path && existsSync(path))

// Litestream 0.5.17 or later: LITESTREAM_BIN, else the shared tools' build. Undefined where there is
// none; NO_LITESTREAM is then why, for a test's skip.
export const LITESTREAM = found(process.env.LITESTREAM_BIN, join(SHARED_TOOLS, 'litestream'))
export const NO_LITESTREAM =
  !LITESTREAM && 'no Litestream 0.5 binary: set LITESTREAM_BIN, or put one at ../shared/tools/litestream'

// k6: K6, else the shared tools' build. Undefined where there is none (then look on the PATH).
export const K6_BIN = found(process.env.K6, join(SHARED_TOOLS, 'k6'))
