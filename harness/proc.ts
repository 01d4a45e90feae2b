// What /proc says of a process and its descendants (a server and its cluster workers, Litestream and
// the server under it): whether it runs, its CPU, memory and context switches. For the tests and the
// benchmark alike; Linux only.
import { execFileSync } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'

export function isRunning(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}

// Microseconds in one of the clock's ticks, the unit /proc counts CPU time in.
export const TICK_US = 1e6 / Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim())

// utime + stime of a process, all its threads, in clock ticks.
export function cpuTicks(pid: number): { user: number; system: number; total: number } {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')
  const user = Number(fields[11])
  const system = Number(fields[12])
  return { user, system, total: user + system }
}

export function memoryKb(pid: number, field: 'VmHWM' | 'VmRSS'): number {
  return Number(new RegExp(`${field}:\\s+(\\d+)`).exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1])
}

// A server is its process and every descendant (cluster workers): their CPU and memory add up.
export function processTree(pid: number): number[] {
  const children = new Map<number, number[]>()
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const ppid = Number(readFileSync(`/proc/${entry}/stat`, 'utf8').split(') ')[1].split(' ')[1])
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)])
    } catch {} // gone meanwhile
  }
  const tree = [pid]
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]) ?? []))
  return tree
}

export const treeCpuTicks = (pid: number) => processTree(pid).reduce((sum, p) => sum + cpuTicks(p).total, 0)
export const treeMemoryKb = (pid: number, field: 'VmHWM' | 'VmRSS') =>
  processTree(pid).reduce((sum, p) => sum + memoryKb(p, field), 0)

// utime and stime of the process tree, all threads, in clock ticks: the user and kernel sides apart.
export function treeCpu(pid: number): { user: number; system: number } {
  const sum = { user: 0, system: 0 }
  for (const p of processTree(pid)) {
    try {
      const { user, system } = cpuTicks(p)
      sum.user += user
      sum.system += system
    } catch {} // gone meanwhile
  }
  return sum
}

// Context switches of every thread of the process tree (/proc/<pid>/task/*/status): voluntary (the thread
// waited: epoll_wait, a futex, I/O) and involuntary (the scheduler took the core from it). A thread that
// ends between two readings takes its count with it; Node's threads live as long as the process.
export function treeSwitches(pid: number): { voluntary: number; involuntary: number } {
  const sum = { voluntary: 0, involuntary: 0 }
  for (const p of processTree(pid)) {
    let tasks: string[] = []
    try {
      tasks = readdirSync(`/proc/${p}/task`)
    } catch {} // gone meanwhile
    for (const task of tasks) {
      try {
        const status = readFileSync(`/proc/${p}/task/${task}/status`, 'utf8')
        sum.voluntary += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1])
        sum.involuntary += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1])
      } catch {} // a thread that ended meanwhile
    }
  }
  return sum
}
