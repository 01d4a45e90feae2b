// npm run profile -- <endpoint>: where a request's CPU goes, as a tree of shares.
//
//   npm run profile -- post [--seconds 10] [--flags=<node flags>] [--top 6]
//
// Builds a source-mapped copy of the bundle (build.mjs --sourcemap), starts it on the server core with
// the inspector on, loads it with wrk, and records a CPU profile of the measured window only (the
// inspector's Profiler, started after the warm-up). Each sample is put in a category by its source
// (the source map says which of hono, @hono/node-server, app.ts and server/ a bundle line came from) or by the
// native function it is in; kernel time comes from /proc. Writes the .cpuprofile (open it in Chrome's
// DevTools) and the summary to bench/results/.
import { execFileSync } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { SourceMap } from 'node:module'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { CACHE, cpuTicks, ensureTools, log, openInspector, RESULTS, ROOT, seededDatabase, startServer, TICK_US, wrk } from './lib.ts'

const { values: args, positionals } = parseArgs({
  allowPositionals: true,
  options: { seconds: { type: 'string', default: '10' }, flags: { type: 'string', default: '' }, top: { type: 'string', default: '6' } },
})
const endpoint = positionals[0] ?? 'mix'
const SECONDS = Number(args.seconds)

type CallFrame = { functionName: string; url: string; lineNumber: number; columnNumber: number }
type ProfileNode = { id: number; callFrame: CallFrame; children?: number[] }
type Profile = { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] }

const SQLITE_METHODS = new Set(['get', 'all', 'run', 'iterate', 'prepare', 'exec'])

// The category of a profile node, from where its code came from, or from its native function's name.
function categorize(frame: CallFrame, parent: string, map: SourceMap, bundle: string): string {
  const { functionName: name, url } = frame
  if (name === '(garbage collector)') return 'GC'
  if (name === '(idle)') return 'idle'
  if (name === '(program)') return 'native, not attributed'
  if (name === '(root)') return 'root'
  if (url === '') {
    if (name === 'parse' || name === 'stringify') return 'JSON'
    if (SQLITE_METHODS.has(name) && parent === 'app.ts') return 'node:sqlite'
    return parent === 'root' ? 'native, not attributed' : parent
  }
  if (url.endsWith(bundle)) {
    const source = (map.findEntry(frame.lineNumber, frame.columnNumber) as { originalSource?: string }).originalSource ?? ''
    if (source.includes('/hono/dist/utils/jwt/')) return 'hono/jwt'
    if (source.includes('/@hono/node-server/')) return '@hono/node-server'
    if (source.includes('/hono/')) return 'hono'
    if (source.endsWith('app.ts')) return 'app.ts'
    if (source.includes('server/')) return 'server/'
    return `bundle: ${source}`
  }
  if (/node:_http_|node:internal\/http/.test(url)) return 'node:http'
  if (/node:net|node:internal\/stream_base|node:internal\/streams|node:stream|node:internal\/net/.test(url)) return 'sockets and streams'
  if (/node:internal\/crypto/.test(url)) return 'WebCrypto (node:crypto)'
  if (/node:internal\/timers|node:timers/.test(url)) return 'timers'
  if (/node:internal\/process\/task_queues/.test(url)) return 'microtasks'
  if (/node:internal\/webstreams|node:internal\/deps\/undici|node:internal\/abort_controller|node:internal\/event_target/.test(url)) return 'web streams, Request, AbortController'
  return url.startsWith('node:') ? `node: ${url.replace(/^node:(internal\/)?/, '')}` : url
}

function summarize(profile: Profile, map: SourceMap, bundle: string, top: number) {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]))
  const category = new Map<number, string>()
  const walk = (node: ProfileNode, parent: string) => {
    const own = categorize(node.callFrame, parent, map, bundle)
    category.set(node.id, own)
    for (const child of node.children ?? []) walk(byId.get(child)!, own === 'root' ? 'root' : own)
  }
  walk(profile.nodes[0], 'root')

  const selfUs = new Map<number, number>()
  profile.samples.forEach((id, i) => selfUs.set(id, (selfUs.get(id) ?? 0) + profile.timeDeltas[i]))
  const total = [...selfUs].filter(([id]) => category.get(id) !== 'idle').reduce((sum, [, us]) => sum + us, 0)
  const categories = new Map<string, { us: number; functions: Map<string, number> }>()
  for (const [id, us] of selfUs) {
    const name = category.get(id)!
    if (name === 'idle') continue
    const entry = categories.get(name) ?? { us: 0, functions: new Map() }
    const frame = byId.get(id)!.callFrame
    const where = frame.url.endsWith(bundle)
      ? `${(map.findEntry(frame.lineNumber, frame.columnNumber) as { originalSource?: string; originalLine?: number }).originalSource?.replace(/.*node_modules\//, '')}:${((map.findEntry(frame.lineNumber, frame.columnNumber) as { originalLine?: number }).originalLine ?? 0) + 1}`
      : frame.url.replace(/^node:/, '')
    const fn = `${frame.functionName || '(anonymous)'}${where ? ` ${where}` : ''}`
    entry.us += us
    entry.functions.set(fn, (entry.functions.get(fn) ?? 0) + us)
    categories.set(name, entry)
  }
  return [...categories]
    .sort((a, b) => b[1].us - a[1].us)
    .map(([name, { us, functions }]) => ({
      category: name,
      share: us / total,
      functions: [...functions].sort((a, b) => b[1] - a[1]).slice(0, top).map(([fn, fus]) => ({ fn, share: fus / total })),
    }))
}

async function main() {
  ensureTools()
  const outdir = join(CACHE, 'profile-build')
  execFileSync(process.execPath, ['build.mjs', '--outdir', outdir, '--sourcemap'], { cwd: ROOT, stdio: 'ignore' })
  execFileSync(process.execPath, ['build.mjs'], { cwd: ROOT, stdio: 'ignore' })
  const seed = seededDatabase()
  // The ceiling is profiled the same way, for comparison; it has no source map to read.
  const bundle = endpoint === 'ceiling' ? join(ROOT, 'bench', 'ceiling.ts') : join(outdir, 'app.js')
  const map = new SourceMap(endpoint === 'ceiling' ? { version: 3, sources: [], names: [], mappings: '' } : JSON.parse(readFileSync(`${bundle}.map`, 'utf8')))
  const flags = ['--inspect=127.0.0.1:0', ...args.flags.split(' ').filter(Boolean)]
  const server = await startServer(bundle, { flags, seed: endpoint === 'ceiling' ? undefined : seed })
  try {
    const session = await openInspector(server.stderr)
    await session.send('Profiler.enable')
    await session.send('Profiler.setSamplingInterval', { interval: 100 })
    log(`profile: warming up ${endpoint}`)
    await wrk(server.url, endpoint, 2, seed.tokens)
    const before = cpuTicks(server.pid)
    await session.send('Profiler.start')
    log(`profile: ${SECONDS} s of ${endpoint} under wrk`)
    const result = await wrk(server.url, endpoint, SECONDS, seed.tokens)
    const { profile } = (await session.send('Profiler.stop')) as { profile: Profile }
    const after = cpuTicks(server.pid)
    session.close()
    if (result.bad + result.socket_errors > 0) throw new Error(`${result.bad} bad responses, e.g. ${result.bad_example}`)

    const userUs = (after.user - before.user) * TICK_US
    const systemUs = (after.system - before.system) * TICK_US
    const perRequest = (userUs + systemUs) / result.requests
    const tree = summarize(profile, map, bundle.split('/').at(-1)!, Number(args.top))
    console.log(`${endpoint}: ${result.requests.toLocaleString('en')} requests in ${SECONDS} s, ${perRequest.toFixed(1)} us CPU each ` +
      `(user ${((100 * userUs) / (userUs + systemUs)).toFixed(0)}%, kernel ${((100 * systemUs) / (userUs + systemUs)).toFixed(0)}% of the process's CPU)`)
    console.log('share of the JS thread\'s samples (not idle), by where the code came from:')
    for (const c of tree) {
      console.log(`  ${(100 * c.share).toFixed(1).padStart(5)}%  ${c.category}   ~${(c.share * perRequest).toFixed(1)} us/req`)
      for (const f of c.functions) if (f.share >= 0.003) console.log(`           ${(100 * f.share).toFixed(1).padStart(5)}%  ${f.fn}`)
    }
    mkdirSync(RESULTS, { recursive: true })
    const stamp = new Date().toISOString().replace(/[:.]/g, '-')
    writeFileSync(join(RESULTS, `profile-${endpoint}-${stamp}.cpuprofile`), JSON.stringify(profile))
    writeFileSync(join(RESULTS, `profile-${endpoint}-${stamp}.json`), JSON.stringify({ endpoint, requests: result.requests, perRequest, userUs, systemUs, tree }, null, 2))
    console.log(`\nprofile: bench/results/profile-${endpoint}-${stamp}.cpuprofile`)
  } finally {
    await server.stop()
  }
}

await main()
