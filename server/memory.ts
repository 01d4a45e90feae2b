// The memory guard. On a box without swap, running out of memory ends it all: the kernel kills a
// process, and with it every connection it holds. So every process of the server looks at what is
// left four times a second (once a second while it is far from the lines) and gives way first: short
// of memory, it takes no more connections than it holds (a new one is closed as it comes; those held
// are served); shorter, it also closes idle keep-alive connections, least recently used first; with
// memory back, it takes new ones again. A connection it does not take is answered all the same
// (server/api-server.ts, maxConnections).
import { openSync, readFileSync, readSync } from 'node:fs'
import type { Socket } from 'node:net'
import type { ApiServer } from './api-server.ts'

// The memory the server may use, in MiB: by default its memory cgroup's limit, or else the machine's.
const MEMORY_LIMIT_MB = Number(process.env.MEMORY_LIMIT_MB || 0)
const MiB = 1024 * 1024
const CHECK_MS = 250
// Far from the lines, with more than four times the first free, it looks once a second: each look wakes
// the process, and even a flood of connections takes longer than a second to use up that much.
const FAR_CHECK_MS = 1_000
const FAR = 4
// What the lines leave free, of the memory the server may use: below the first it takes no more
// connections, below half of it it closes idle ones; it takes new ones again above one and a half.
const FULL_SHARE = 0.1
const FULL_AT_LEAST = 64 * MiB
// Of the connections held, the idle ones closed at each look while memory is below the second line.
const SHED_SHARE = 0.05

// The process's guard, changed at each look.
const guard = {
  state: 'taking' as 'taking' | 'full' | 'shedding',
  shed: 0, // idle connections closed since the guard last took connections
}

// What /health adds while the guard holds connections back.
export const memoryHealth = () => (guard.state === 'taking' ? {} : { memory: guard.state })
export const takingConnections = () => guard.state === 'taking'

// `connections`: this process's, kept by whoever counts them.
export function guardMemory(server: ApiServer, connections: Set<Socket>, measure = memoryMeter()) {
  // Returns how long to wait for the next look.
  const look = (): number => {
    let figures
    try {
      figures = measure()
    } catch {
      return CHECK_MS // a look that cannot read the figures changes nothing; the next one tries again
    }
    const { budget, used } = figures
    const full = Math.max(budget * FULL_SHARE, FULL_AT_LEAST)
    const available = budget - used
    let next = guard.state
    if (available < full / 2) next = 'shedding'
    else if (available > full * 1.5) next = 'taking'
    else if (available < full || guard.state === 'shedding') next = 'full'
    // Short of memory, it holds no more connections than it held then: one that closes makes room.
    if (next === 'shedding') {
      guard.shed += closeIdle(connections, server, Math.ceil(connections.size * SHED_SHARE))
      server.maxConnections = connections.size
    } else if (next === 'full' && guard.state === 'taking') server.maxConnections = connections.size
    else if (next === 'taking') server.maxConnections = Infinity
    if (next !== guard.state) {
      const figures = `${Math.round(used / MiB)} of ${Math.round(budget / MiB)} MiB used, ${connections.size} connections held`
      const says = {
        taking: `taking new connections again${guard.shed ? ` (${guard.shed} idle ones closed meanwhile)` : ''}`,
        full: 'taking no more connections than it holds',
        shedding: 'closing idle connections, least recently used first',
      }
      console.warn(`memory: ${figures}; ${says[next]}`)
      if (next === 'taking') guard.shed = 0
      guard.state = next
    }
    return next === 'taking' && available > full * FAR ? FAR_CHECK_MS : CHECK_MS
  }
  const lookAgain = (afterMs: number) => setTimeout(() => lookAgain(look()), afterMs).unref()
  lookAgain(look())
}

// Closes up to `count` idle connections, those that answered longest ago first; returns how many.
function closeIdle(connections: Set<Socket>, server: ApiServer, count: number): number {
  const idle: [number, Socket][] = []
  for (const socket of connections) {
    const since = server.idleSince(socket)
    if (since !== undefined) idle.push([since, socket])
  }
  idle.sort((a, b) => a[0] - b[0])
  for (const [, socket] of idle.slice(0, count)) socket.destroy()
  return Math.min(count, idle.length)
}

// How much memory there is and how much is used: a memory cgroup's limit and its working set (what it
// holds but the page cache it could drop), or else the machine's memory and what is not available.
function memoryMeter(): () => { budget: number; used: number } {
  const meter = limitedCgroup() ?? machineMeter()
  return () => {
    const { total, used } = meter()
    return { budget: MEMORY_LIMIT_MB ? MEMORY_LIMIT_MB * MiB : total, used }
  }
}

// A file of the kernel's, opened once and read again from its start at each look: a process whose
// connections took every file it may open (EMFILE) could not open it then, and the look would throw
// out of its timer and end the process (test/faults/files.test.ts, 2 runs in 5 before this).
function kernelFile(path: string): () => string {
  const fd = openSync(path, 'r')
  const buffer = Buffer.alloc(16 * 1024) // memory.stat and meminfo are 1 to 2 KB
  return () => {
    let length = 0
    for (let n; (n = readSync(fd, buffer, length, buffer.length - length, length)) > 0;) length += n
    return buffer.toString('utf8', 0, length)
  }
}

function machineMeter() {
  const meminfo = kernelFile('/proc/meminfo')
  return () => {
    const text = meminfo()
    const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(text)?.[1] ?? 0) * 1024
    return { total: kb('MemTotal'), used: kb('MemTotal') - kb('MemAvailable') }
  }
}

// The memory cgroup this process is in, v2 or v1, when it has a limit: reads of it, or undefined.
function limitedCgroup(): (() => { total: number; used: number }) | undefined {
  let lines: string[]
  try {
    lines = readFileSync('/proc/self/cgroup', 'utf8').trim().split('\n')
  } catch {
    return undefined // not Linux: the machine's figures, where it has them
  }
  const stat = (text: string, key: string) => Number(new RegExp(`^${key} (\\d+)`, 'm').exec(text)?.[1] ?? 0)
  const v1 = lines.find((line) => /^\d+:([^:]*,)?memory(,[^:]*)?:/.test(line))
  try {
    if (v1) {
      const dir = `/sys/fs/cgroup/memory${v1.slice(v1.lastIndexOf(':') + 1)}`.replace(/\/$/, '')
      const limit = stat(readFileSync(`${dir}/memory.stat`, 'utf8'), 'hierarchical_memory_limit')
      if (!(limit > 0 && limit < 2 ** 60)) return undefined
      const [usage, stats] = [kernelFile(`${dir}/memory.usage_in_bytes`), kernelFile(`${dir}/memory.stat`)]
      return () => ({ total: limit, used: Number(usage()) - stat(stats(), 'total_inactive_file') })
    }
    const v2 = lines.find((line) => line.startsWith('0::'))
    if (!v2) return undefined
    // The nearest limit, from this process's cgroup up.
    for (let path = v2.slice(3); ; path = path.slice(0, path.lastIndexOf('/')) || '/') {
      const dir = `/sys/fs/cgroup${path === '/' ? '' : path}`
      const limit = Number(readFileSync(`${dir}/memory.max`, 'utf8').trim())
      if (limit > 0) {
        const [current, stats] = [kernelFile(`${dir}/memory.current`), kernelFile(`${dir}/memory.stat`)]
        return () => ({ total: limit, used: Number(current()) - stat(stats(), 'inactive_file') })
      }
      if (path === '/') return undefined
    }
  } catch {
    return undefined // a file it could not read: the machine's figures
  }
}
