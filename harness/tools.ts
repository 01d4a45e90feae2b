// Where things are, for the tests and the benchmark alike: the repository, and the tools they run
// beside the project (Litestream 0.5, k6), found the same way by both.
import { existsSync, statSync } from 'node:fs'
import { delimiter, join } from 'node:path'

export const ROOT = join(import.meta.dirname, '..')

// A tool is found by its setting, else in the workplace's folder of tools beside the clone
// (SHARED_TOOLS, else ../shared/tools), else on the PATH.
const SHARED_TOOLS = process.env.SHARED_TOOLS || join(ROOT, '..', 'shared', 'tools')
const found = (...paths: (string | undefined)[]) => paths.find((path) => path && existsSync(path))
const onPath = (name: string) =>
  (process.env.PATH ?? '')
    .split(delimiter)
    .filter(Boolean)
    .map((dir) => join(dir, name))
    .find((path) => existsSync(path) && statSync(path).isFile())

// Litestream 0.5.17 or later: LITESTREAM_BIN, else the shared tools' build, else `litestream` on the
// PATH. Undefined where there is none; NO_LITESTREAM is then why, for a test's skip.
export const LITESTREAM = found(process.env.LITESTREAM_BIN, join(SHARED_TOOLS, 'litestream')) ?? onPath('litestream')
export const NO_LITESTREAM =
  !LITESTREAM && 'no Litestream 0.5 binary: set LITESTREAM_BIN, put one on the PATH or at ../shared/tools/litestream'

// k6: K6, else the shared tools' build, else `k6` on the PATH.
export const K6_BIN = found(process.env.K6, join(SHARED_TOOLS, 'k6')) ?? onPath('k6')
