// A server as a process of its own, for the tests and the benchmark alike: the built server, a floor,
// or anything that prints "listening on http://host:port"; the Node flags the image runs it with; and
// the inspector of one started with --inspect.
import { spawn, type ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { sleep, within } from './time.ts'
import { ROOT } from './tools.ts'

export type Server = {
  child: ChildProcess
  pid: number
  url: string
  output: () => string // stdout and stderr, as they came
  stdout: () => string
  stderr: () => string
  // Sends the signal and resolves with the exit code once the process is gone.
  stop: (signal?: NodeJS.Signals) => Promise<number | null>
}

export type StartOptions = {
  // All the process gets, beside PATH, PORT=0 (any free port), HOST=127.0.0.1 and the run's HTTP_SERVER.
  env: Record<string, string>
  cwd?: string
  uid?: number
  gid?: number
  cores?: string // run under `taskset -c cores`
  cgroup?: string // a memory cgroup's folder, joined before the command starts: all it allocates is charged there
  timeoutMs?: number // how long it may take to listen
  onStderr?: (chunk: Buffer) => void // each chunk of its stderr, as it comes
}

// The run's HTTP_SERVER goes to every server: `HTTP_SERVER=node-server npm test` runs each on node:http.
const HTTP_SERVER = process.env.HTTP_SERVER ? { HTTP_SERVER: process.env.HTTP_SERVER } : {}

// Starts the command and resolves once it prints its address on stdout or stderr; rejects, with what it
// printed, when it exits first or does not listen within timeoutMs (then it is killed).
export function startServer(
  command: string,
  args: string[],
  { env, cwd = ROOT, uid, gid, cores, cgroup, timeoutMs = 90_000, onStderr }: StartOptions,
): Promise<Server> {
  const pinned = cores ? ['taskset', '-c', cores, command, ...args] : [command, ...args]
  const [file, ...argv] = cgroup ? ['sh', '-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, ...pinned] : pinned
  const child = spawn(file, argv, {
    cwd,
    uid,
    gid,
    env: { PATH: process.env.PATH ?? '', PORT: '0', HOST: '127.0.0.1', ...HTTP_SERVER, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const printed = { output: '', stdout: '', stderr: '' }
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`server did not start in ${timeoutMs / 1000} s:\n${printed.output}`))
    }, timeoutMs)
    const onData = (stream: 'stdout' | 'stderr') => (chunk: Buffer) => {
      printed.output += chunk
      printed[stream] += chunk
      if (stream === 'stderr') onStderr?.(chunk)
      const match = /listening on http:\/\/[^:]+:(\d+)/.exec(printed.output)
      if (!match) return
      clearTimeout(timer)
      resolve({
        child,
        pid: child.pid!,
        url: `http://127.0.0.1:${match[1]}`,
        output: () => printed.output,
        stdout: () => printed.stdout,
        stderr: () => printed.stderr,
        stop: (signal = 'SIGTERM') => {
          child.kill(signal)
          return exited
        },
      })
    }
    child.stdout.on('data', onData('stdout'))
    child.stderr.on('data', onData('stderr'))
    child.once('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`server exited with ${code} before listening:\n${printed.output}`))
    })
  })
}

// The Node flags the image runs the server with (its Dockerfile's CMD): a server measured or attacked
// as it is shipped.
export function shippedNodeFlags(): string[] {
  const cmd = /^CMD\s+(\[.*\])\s*$/m.exec(readFileSync(join(ROOT, 'Dockerfile'), 'utf8'))
  const argv = JSON.parse(cmd![1]) as string[]
  return argv.slice(1, -1)
}

// The inspector protocol over the WebSocket a server's --inspect opened; output is what it has printed.
export async function openInspector(output: () => string) {
  let wsUrl: string | undefined
  for (let i = 0; i < 100 && !wsUrl; i++) {
    wsUrl = /ws:\/\/\S+/.exec(output())?.[0]
    if (!wsUrl) await sleep(50)
  }
  if (!wsUrl) throw new Error('the server did not print its inspector address within 5 s')
  const socket = new WebSocket(wsUrl)
  await new Promise((resolve, reject) => ((socket.onopen = resolve), (socket.onerror = reject)))
  let id = 0
  const pending = new Map<number, (result: any) => void>()
  socket.onmessage = (event) => {
    const message = JSON.parse(String(event.data))
    pending.get(message.id)?.(message.result)
    pending.delete(message.id)
  }
  return {
    // A server that stopped answering its inspector fails the wait rather than hangs it.
    send: (method: string, params = {}, timeoutMs = 60_000) =>
      within(
        new Promise<any>((resolve) => {
          pending.set(++id, resolve)
          socket.send(JSON.stringify({ id, method, params }))
        }),
        timeoutMs,
        `the inspector's answer to ${method}`,
      ),
    close: () => socket.close(),
  }
}
