// npm run profile -- <endpoint>: where a request's CPU goes, or what it allocates, as a tree of shares.
//
//   npm run profile -- post [--seconds 10] [--flags=<node flags>] [--top 6] [--alloc] [--floor]
//
// Builds a source-mapped copy of the bundle (build.mjs --sourcemap), starts it on the server core with
// the inspector on, loads it with wrk, and records a CPU profile of the measured window only (the
// inspector's Profiler, started after the warm-up). Each sample is put in a category by its source
// (the source map says which of hono, @hono/node-server, app.ts and server/ a bundle line came from) or by the
// native function it is in; kernel time comes from /proc. Writes the .cpuprofile (open it in Chrome's
// DevTools) and the summary to bench/results/.
//
// --alloc records V8's sampling heap profile instead, the garbage included (objects a scavenge or a
// full GC took are kept in it): the bytes a request allocates, by the same categories. --floor profiles
// bench/floor.ts, the stack with nothing of ours, for comparison.
import { execFileSync } from 'node:child_process'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { SourceMap } from 'node:module'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { cpuTicks, TICK_US } from '../harness/proc.ts'
import { CACHE, seededDatabase } from '../harness/seed.ts'
import { openInspector } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { benchServer, ensureTools, log, RESULTS, wrk } from './lib.ts'

const { values: args, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    seconds: { type: 'string', default: '10' },
    flags: { type: 'string', default: '' },
    top: { type: 'string', default: '6' },
    alloc: { type: 'boolean', default: false },
    floor: { type: 'boolean', default: false },
  },
})
const endpoint = positionals[0] ?? 'mix'
const SECONDS = Number(args.seconds)

type CallFrame = { functionName: string; url: string; lineNumber: number; columnNumber: number }
type ProfileNode = { id: number; callFrame: CallFrame; children?: number[] }
type Profile = { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] }
type HeapNode = { id: number; callFrame: CallFrame; selfSize: number; children: HeapNode[] }

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
    const source =
      (map.findEntry(frame.lineNumber, frame.columnNumber) as { originalSource?: string }).originalSource ?? ''
    if (source.includes('/hono/dist/utils/jwt/')) return 'hono/jwt'
    if (source.includes('/@hono/node-server/')) return '@hono/node-server'
    if (source.includes('/hono/')) return 'hono'
    if (source.endsWith('app.ts')) return 'app.ts'
    if (source.includes('server/')) return 'server/'
    return source ? `bundle: ${source}` : bundle // a file without a source map: the ceiling, the floor
  }
  if (/node:_http_|node:internal\/http/.test(url)) return 'node:http'
  if (/node:net|node:internal\/stream_base|node:internal\/streams|node:stream|node:internal\/net/.test(url))
    return 'sockets and streams'
  if (/node:internal\/crypto/.test(url)) return 'WebCrypto (node:crypto)'
  if (/node:internal\/timers|node:timers/.test(url)) return 'timers'
  if (/node:internal\/process\/task_queues/.test(url)) return 'microtasks'
  if (
    /node:internal\/webstreams|node:internal\/deps\/undici|node:internal\/abort_controller|node:internal\/event_target/.test(
      url,
    )
  )
    return 'web streams, Request, AbortController'
  return url.startsWith('node:') ? `node: ${url.replace(/^node:(internal\/)?/, '')}` : url
}

// The shares of `self` (a node's own microseconds, or bytes) by category, and each category's largest
// functions.
function summarize(nodes: ProfileNode[], self: Map<number, number>, map: SourceMap, bundle: string, top: number) {
  const byId = new Map(nodes.map((n) => [n.id, n]))
  const category = new Map<number, string>()
  const walk = (node: ProfileNode, parent: string) => {
    const own = categorize(node.callFrame, parent, map, bundle)
    category.set(node.id, own)
    for (const child of node.children ?? []) walk(byId.get(child)!, own === 'root' ? 'root' : own)
  }
  walk(nodes[0], 'root')

  const total = [...self].filter(([id]) => category.get(id) !== 'idle').reduce((sum, [, amount]) => sum + amount, 0)
  const categories = new Map<string, { amount: number; functions: Map<string, number> }>()
  for (const [id, amount] of self) {
    const name = category.get(id)!
    if (name === 'idle') continue
    const entry = categories.get(name) ?? { amount: 0, functions: new Map() }
    const frame = byId.get(id)!.callFrame
    const mapped = frame.url.endsWith(bundle)
      ? (map.findEntry(frame.lineNumber, frame.columnNumber) as { originalSource?: string; originalLine?: number })
      : {}
    const where = mapped.originalSource
      ? `${mapped.originalSource.replace(/.*node_modules\//, '')}:${(mapped.originalLine ?? 0) + 1}`
      : frame.url && `${frame.url.replace(/^node:/, '').replace(/^file:.*\//, '')}:${frame.lineNumber + 1}`
    const fn = `${frame.functionName || '(anonymous)'}${where ? ` ${where}` : ''}`
    entry.amount += amount
    entry.functions.set(fn, (entry.functions.get(fn) ?? 0) + amount)
    categories.set(name, entry)
  }
  return [...categories]
    .sort((a, b) => b[1].amount - a[1].amount)
    .map(([name, { amount, functions }]) => ({
      category: name,
      share: amount / total,
      functions: [...functions]
        .sort((a, b) => b[1] - a[1])
        .slice(0, top)
        .map(([fn, own]) => ({ fn, share: own / total })),
    }))
}

// A CPU profile's nodes, and each one's own microseconds.
function cpuSelf(profile: Profile) {
  const self = new Map<number, number>()
  profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + profile.timeDeltas[i]))
  return { nodes: profile.nodes, self }
}

// A heap profile's tree as a CPU profile's nodes, and each one's own bytes.
function heapSelf(head: HeapNode) {
  const nodes: ProfileNode[] = []
  const self = new Map<number, number>()
  const walk = (node: HeapNode) => {
    nodes.push({ id: node.id, callFrame: node.callFrame, children: node.children.map((child) => child.id) })
    self.set(node.id, node.selfSize)
    node.children.forEach(walk)
  }
  walk(head)
  return { nodes, self }
}

type Cost = { requests: number; userUs: number; systemUs: number; allocated?: Map<number, number> }

// The profile's shares by where the code came from, each with its cost a request: CPU time, or with
// --alloc the bytes allocated (sampled).
function printShares(
  what: string,
  tree: ReturnType<typeof summarize>,
  { requests, userUs, systemUs, allocated }: Cost,
) {
  const perRequest = (userUs + systemUs) / requests
  let unit = 'us'
  let each = perRequest
  if (allocated) {
    unit = 'B'
    each = [...allocated.values()].reduce((sum, bytes) => sum + bytes, 0) / requests
    console.log(`${what}, ${each.toFixed(0)} bytes allocated by V8 each (sampled)`)
    console.log('share of the bytes, by where the allocating code came from:')
  } else {
    const share = (us: number) => ((100 * us) / (userUs + systemUs)).toFixed(0)
    console.log(
      `${what}, ${perRequest.toFixed(1)} us CPU each ` +
        `(user ${share(userUs)}%, kernel ${share(systemUs)}% of the process's CPU)`,
    )
    console.log("share of the JS thread's samples (not idle), by where the code came from:")
  }
  for (const c of tree) {
    console.log(
      `  ${(100 * c.share).toFixed(1).padStart(5)}%  ${c.category}   ~${(c.share * each).toFixed(allocated ? 0 : 1)} ${unit}/req`,
    )
    for (const f of c.functions)
      if (f.share >= 0.003) console.log(`           ${(100 * f.share).toFixed(1).padStart(5)}%  ${f.fn}`)
  }
}

// The sampling started: CPU, or with --alloc a sample every 1 KB allocated on average, kept though
// the object is garbage by the end.
async function startSampling(session: Awaited<ReturnType<typeof openInspector>>) {
  if (!args.alloc) return session.send('Profiler.start')
  await session.send('HeapProfiler.startSampling', {
    samplingInterval: 1024,
    includeObjectsCollectedByMajorGC: true,
    includeObjectsCollectedByMinorGC: true,
  })
}

// The profile, for DevTools, and its summary, in bench/results; gives the profile's file name.
function saveProfile(name: string, profile: unknown, summary: object) {
  mkdirSync(RESULTS, { recursive: true })
  const stamp = new Date().toISOString().replace(/[:.]/g, '-')
  const file = `${name}-${stamp}.${args.alloc ? 'heapprofile' : 'cpuprofile'}`
  writeFileSync(join(RESULTS, file), JSON.stringify(profile))
  writeFileSync(join(RESULTS, `${name}-${stamp}.json`), JSON.stringify(summary, null, 2))
  return file
}

async function main() {
  ensureTools()
  const outdir = join(CACHE, 'profile-build')
  execFileSync(process.execPath, ['build.mjs', '--outdir', outdir, '--sourcemap'], { cwd: ROOT, stdio: 'ignore' })
  execFileSync(process.execPath, ['build.mjs'], { cwd: ROOT, stdio: 'ignore' })
  const seed = seededDatabase()
  // The ceiling and the floor are profiled the same way, for comparison; they have no source map to read.
  const plain = endpoint === 'ceiling' ? 'ceiling.ts' : args.floor ? 'floor.ts' : undefined
  const bundle = plain ? join(ROOT, 'bench', plain) : join(outdir, 'app.js')
  const map = new SourceMap(
    plain ? { version: 3, sources: [], names: [], mappings: '' } : JSON.parse(readFileSync(`${bundle}.map`, 'utf8')),
  )
  const flags = ['--inspect=127.0.0.1:0', ...args.flags.split(' ').filter(Boolean)]
  const server = await benchServer(bundle, { flags, seed: endpoint === 'ceiling' ? undefined : seed })
  const name = `${args.alloc ? 'alloc' : 'profile'}-${endpoint}${args.floor ? '-floor' : ''}`
  try {
    const session = await openInspector(server.stderr)
    await session.send(args.alloc ? 'HeapProfiler.enable' : 'Profiler.enable')
    if (!args.alloc) await session.send('Profiler.setSamplingInterval', { interval: 100 })
    log(`profile: warming up ${endpoint}`)
    await wrk(server.url, endpoint, 2, seed.tokens)
    const before = cpuTicks(server.pid)
    await startSampling(session)
    log(`profile: ${SECONDS} s of ${endpoint} under wrk`)
    const result = await wrk(server.url, endpoint, SECONDS, seed.tokens)
    const { profile } = await session.send(args.alloc ? 'HeapProfiler.stopSampling' : 'Profiler.stop')
    const after = cpuTicks(server.pid)
    session.close()
    if (result.bad + result.socket_errors > 0)
      throw new Error(`${result.bad} bad responses, e.g. ${result.bad_example}`)

    const userUs = (after.user - before.user) * TICK_US
    const systemUs = (after.system - before.system) * TICK_US
    const perRequest = (userUs + systemUs) / result.requests
    const { nodes, self } = args.alloc ? heapSelf((profile as { head: HeapNode }).head) : cpuSelf(profile as Profile)
    const tree = summarize(nodes, self, map, bundle.split('/').at(-1)!, Number(args.top))
    const what = `${endpoint}${args.floor ? ' (the floor)' : ''}: ${result.requests.toLocaleString('en')} requests in ${SECONDS} s`
    printShares(what, tree, { requests: result.requests, userUs, systemUs, allocated: args.alloc ? self : undefined })
    const file = saveProfile(name, profile, {
      endpoint,
      floor: args.floor,
      alloc: args.alloc,
      requests: result.requests,
      perRequest,
      userUs,
      systemUs,
      tree,
    })
    console.log(`\nprofile: bench/results/${file}`)
  } finally {
    await server.stop()
  }
}

await main()
