// Where an idle connection's memory is: a server opened by N idle keep-alive connections (each after one
// `GET /posts/1`, harness/idle-flood.ts), measured before and after, each figure a connection.
//
//   node bench/memory.ts [--connections 15000] [--snapshot] [--env "LD_PRELOAD=... MALLOC_CONF=..."]
//
// Servers, one after the other, each fresh in the bench's memory cgroup: ours (dist/app.js, on node:net),
// ours on node:http (HTTP_SERVER=node-server), the floor on node:http (bench/floor.ts) and on node:net
// (bench/floor-net.ts), bare node:http (bench/ceiling.ts), and ours with --env's environment. A probe loaded
// with --import answers SIGUSR2: two full GCs, then process.memoryUsage(), V8's heap statistics and
// /proc/self/smaps (glibc's brk heap apart from the other anonymous maps, where mimalloc's are); with
// --snapshot, a heap snapshot too, whose objects are counted by constructor. The kernel's share is the
// cgroup's kmem. Each server runs as the benchmark's do, with the image's allocator (lib.ts).
import { once } from 'node:events'
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseArgs } from 'node:util'
import { type Seed, seededDatabase } from '../harness/seed.ts'
import { shippedNodeFlags } from '../harness/server.ts'
import { ROOT } from '../harness/tools.ts'
import { benchServer, log, memoryCgroup, onLoadCore, WORKDIR } from './lib.ts'

const { values: args } = parseArgs({
  options: {
    connections: { type: 'string', default: '15000' },
    snapshot: { type: 'boolean', default: false },
    env: { type: 'string' },
  },
})
const CONNECTIONS = Number(args.connections)
const PROBE = join(WORKDIR, 'probe.mjs')
const PROBED = join(WORKDIR, 'probed.json')
const SNAPSHOT = join(WORKDIR, 'heap.heapsnapshot')

const probe = `import { getHeapStatistics, writeHeapSnapshot } from 'node:v8'
import { readFileSync, writeFileSync } from 'node:fs'
process.on('SIGUSR2', () => {
  globalThis.gc(); globalThis.gc()
  let brk = 0, anon = 0, current = ''
  for (const line of readFileSync('/proc/self/smaps', 'utf8').split('\\n')) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) current = line.split(/\\s+/)[5] ?? ''
    else if (line.startsWith('Rss:')) { const kb = Number(line.split(/\\s+/)[1]); if (current === '[heap]') brk += kb; else if (current === '') anon += kb }
  }
  const probed = JSON.stringify({ usage: process.memoryUsage(), heap: getHeapStatistics(), brkKb: brk, anonKb: anon })
  if (process.env.PROBE_SNAPSHOT === '1') writeHeapSnapshot(${JSON.stringify(SNAPSHOT)})
  writeFileSync(${JSON.stringify(PROBED)}, probed)
})
`

type Probed = {
  usage: NodeJS.MemoryUsage
  heap: { used_heap_size: number; total_heap_size: number }
  brkKb: number
  anonKb: number
  kmem: number
  tcp: number
  objects?: Map<string, { count: number; bytes: number }>
}

async function measure(pid: number, cgroup: string | undefined, snapshot: boolean): Promise<Probed> {
  rmSync(PROBED, { force: true })
  process.kill(pid, 'SIGUSR2')
  const deadline = Date.now() + 120_000
  while (!existsSync(PROBED)) {
    if (Date.now() > deadline) throw new Error('the probe did not answer within 120 s')
    await sleep(100)
  }
  await sleep(100)
  const probed = JSON.parse(readFileSync(PROBED, 'utf8')) as Probed
  const read = (file: string) =>
    cgroup && existsSync(join(cgroup, file)) ? Number(readFileSync(join(cgroup, file), 'utf8')) : NaN
  probed.kmem = read('memory.kmem.usage_in_bytes')
  probed.tcp = read('memory.kmem.tcp.usage_in_bytes')
  if (snapshot) probed.objects = countObjects(JSON.parse(readFileSync(SNAPSHOT, 'utf8')))
  return probed
}

// A heap snapshot's objects by type and name (a constructor, or a native's name), counted and summed.
function countObjects(snap: {
  snapshot: { meta: { node_fields: string[]; node_types: [string[]] } }
  nodes: number[]
  strings: string[]
}) {
  const fields = snap.snapshot.meta.node_fields
  const [type, name, size] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f))
  const types = snap.snapshot.meta.node_types[0]
  const objects = new Map<string, { count: number; bytes: number }>()
  for (let i = 0; i < snap.nodes.length; i += fields.length) {
    const kind = types[snap.nodes[i + type]]
    const key =
      `${kind} ${kind === 'string' || kind === 'number' ? '' : snap.strings[snap.nodes[i + name]].slice(0, 40)}`.trim()
    const entry = objects.get(key) ?? { count: 0, bytes: 0 }
    entry.count++
    entry.bytes += snap.nodes[i + size]
    objects.set(key, entry)
  }
  return objects
}

async function flood(url: string) {
  const { hostname, port } = new URL(url)
  const child = onLoadCore(
    [
      process.execPath,
      join(ROOT, 'harness', 'idle-flood.ts'),
      '--port',
      port,
      '--host',
      hostname,
      '--connections',
      String(CONNECTIONS),
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  )
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]()
  const opened = await Promise.race([
    lines.next(),
    sleep(300_000).then(() => {
      throw new Error('the connections did not open within 300 s')
    }),
  ])
  const event = JSON.parse(opened.value as string) as { answered: number; wrong: number }
  return {
    open: event.answered + event.wrong,
    close: async () => {
      child.stdin!.end('\n')
      await Promise.race([once(child, 'exit'), sleep(60_000)])
      child.kill()
    },
  }
}

async function variant(name: string, script: string, seed: Seed, env: Record<string, string> = {}) {
  const server = await benchServer(script, {
    flags: [...shippedNodeFlags(), '--expose-gc', `--import=${PROBE}`],
    seed,
    cgroup,
    env: { ...env, PROBE_SNAPSHOT: args.snapshot ? '1' : '0' },
  })
  try {
    await (await fetch(`${server.url}/posts/1`)).text()
    const before = await measure(server.pid, cgroup, args.snapshot)
    const connections = await flood(server.url)
    const after = await measure(server.pid, cgroup, args.snapshot)
    await connections.close()
    log(`${name}: ${connections.open} idle connections held`)
    return { name, open: connections.open, before, after }
  } finally {
    await server.stop()
    rmSync(SNAPSHOT, { force: true })
  }
}

const seed = seededDatabase()
const cgroup = memoryCgroup().dir
mkdirSync(WORKDIR, { recursive: true })
writeFileSync(PROBE, probe)
const env = args.env
  ? Object.fromEntries(
      args.env
        .split(' ')
        .filter(Boolean)
        .map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]),
    )
  : undefined
const results = [
  await variant('ours', join(ROOT, 'dist', 'app.js'), seed),
  await variant('ours, node-server', join(ROOT, 'dist', 'app.js'), seed, { HTTP_SERVER: 'node-server' }),
  await variant('floor', join(ROOT, 'bench', 'floor.ts'), seed),
  await variant('floor, node:net', join(ROOT, 'bench', 'floor-net.ts'), seed),
  await variant('bare node:http', join(ROOT, 'bench', 'ceiling.ts'), seed),
  ...(env ? [await variant(`ours, ${args.env!.replace(/\S*\//g, '')}`, join(ROOT, 'dist', 'app.js'), seed, env)] : []),
]
if (cgroup) rmdirSync(cgroup)

const kb = (bytes: number) => (bytes / 1024).toFixed(2)
console.log(
  `\n${CONNECTIONS.toLocaleString('en-US')} idle keep-alive connections, each after one GET /posts/1; KB a connection, after two full GCs`,
)
const rows = [
  [
    'server',
    'held',
    'RSS',
    'V8 used',
    'V8 total',
    'external',
    'array buffers',
    'brk heap',
    'other anon',
    'kernel (kmem)',
    'of it TCP',
  ],
]
for (const { name, open, before: b, after: a } of results) {
  const per = (x: number, y: number) => kb((y - x) / Math.max(1, open))
  rows.push([
    name,
    String(open),
    per(b.usage.rss, a.usage.rss),
    per(b.heap.used_heap_size, a.heap.used_heap_size),
    per(b.heap.total_heap_size, a.heap.total_heap_size),
    per(b.usage.external, a.usage.external),
    per(b.usage.arrayBuffers, a.usage.arrayBuffers),
    per(b.brkKb * 1024, a.brkKb * 1024),
    per(b.anonKb * 1024, a.anonKb * 1024),
    per(b.kmem, a.kmem),
    per(b.tcp, a.tcp),
  ])
}
if (args.snapshot)
  console.log(
    'with --snapshot, RSS and the C heap keep what writing the first snapshot took: read them from a run without it',
  )
const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)))
for (const row of rows)
  console.log(row.map((cell, i) => (i ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  '))

if (args.snapshot) {
  for (const { name, open, before, after } of results) {
    const grown = [...after.objects!].map(([key, { count, bytes }]) => ({
      key,
      count: count - (before.objects!.get(key)?.count ?? 0),
      bytes: bytes - (before.objects!.get(key)?.bytes ?? 0),
    }))
    grown.sort((x, y) => y.bytes - x.bytes)
    console.log(`\n${name}: the V8 heap's growth by object, a connection (heap snapshots, self sizes)`)
    for (const g of grown.slice(0, 14))
      console.log(
        `  ${(g.bytes / open).toFixed(0).padStart(6)} B  ${(g.count / open).toFixed(2).padStart(5)} x  ${g.key}`,
      )
  }
}
