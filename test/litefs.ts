// A LiteFS cluster on this machine, for the cluster tests and `npm run bench -- --cluster`: node 0 is
// the primary (static lease), the others replicate it; each node is a real `litefs mount` with its own
// FUSE mount and data directory. The API servers are the caller's to start, on each node's mount.
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { accessSync, constants, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freePort, ROOT, sleep } from './helpers.ts'

export const DB_NAME = 'feed.db'

// The binary: LITEFS, else the shared tools beside the repository (as CI lays them out), else PATH.
export function litefsBinary(): string | undefined {
  const candidates = [process.env.LITEFS, join(ROOT, '..', 'shared', 'tools', 'litefs')]
  const found = candidates.find((path) => path && existsSync(path))
  if (found) return found
  const which = spawnSync('which', ['litefs'], { encoding: 'utf8' })
  return which.status === 0 ? which.stdout.trim() : undefined
}

// Why LiteFS cannot run here, or undefined when it can: it mounts FUSE, which takes root and fuse3.
export function whyNoLiteFS(): string | undefined {
  if (!litefsBinary()) return 'no litefs binary (set LITEFS, or put it at ../shared/tools/litefs)'
  if (process.getuid?.() !== 0) return 'LiteFS mounts FUSE, which these tests do as root'
  try {
    accessSync('/dev/fuse', constants.R_OK | constants.W_OK)
  } catch {
    return 'no /dev/fuse'
  }
  if (spawnSync('which', ['fusermount3']).status !== 0) return 'no fusermount3 (apt-get install fuse3)'
  return undefined
}

export type LiteFSNode = {
  name: string
  mount: string
  dbPath: string
  url: string // the LiteFS API
  apiPort: number
  process: ChildProcess
  pid: () => number
  log: () => string
  position: () => string
  kill: (signal: NodeJS.Signals) => Promise<void>
  restart: () => Promise<void>
}

export type Cluster = { dir: string; nodes: LiteFSNode[]; stop: () => Promise<void> }

type ClusterOptions = {
  nodes: number
  seed: string // a SQLite database in WAL mode, imported once into the primary
  cores?: string // taskset every LiteFS process to these cores (the bench)
  unstarted?: number // the last so many replicas are left for the caller to start (restart()), as new nodes
}

// The primary is up and the seed imported; every replica started has caught up with it.
export async function startCluster({ nodes: count, seed, cores, unstarted = 0 }: ClusterOptions): Promise<Cluster> {
  const bin = litefsBinary()!
  const dir = mkdtempSync(join(tmpdir(), 'litefs-'))
  const apiPorts = await Promise.all(Array.from({ length: count }, () => freePort()))
  const httpPorts = await Promise.all(Array.from({ length: count }, () => freePort()))
  const primaryUrl = `http://127.0.0.1:${httpPorts[0]}`
  const nodes: LiteFSNode[] = []
  try {
    for (let i = 0; i < count; i++) {
      const name = String.fromCharCode(97 + i)
      const mount = join(dir, name, 'mnt')
      const data = join(dir, name, 'data')
      mkdirSync(mount, { recursive: true })
      mkdirSync(data, { recursive: true })
      const config = join(dir, name, 'litefs.yml')
      // A static lease: node a holds it. On a replica, LiteFS shows its own lease.hostname as the
      // primary's name in .primary, so every node names the primary's API there.
      writeFileSync(config, [
        `fuse:\n  dir: "${mount}"`,
        `data:\n  dir: "${data}"`,
        `http:\n  addr: "127.0.0.1:${httpPorts[i]}"`,
        `lease:\n  type: "static"\n  candidate: ${i === 0}\n  hostname: "127.0.0.1:${apiPorts[0]}"\n  advertise-url: "${primaryUrl}"`,
        'exit-on-error: false',
        '',
      ].join('\n'))
      nodes.push(liteFSNode({ bin, name, mount, config, url: `http://127.0.0.1:${httpPorts[i]}`, apiPort: apiPorts[i], cores }))
    }
    await nodes[0].restart()
    execFileSync(bin, ['import', '-url', nodes[0].url, '-name', DB_NAME, seed], { stdio: 'pipe' })
    const replicas = nodes.slice(1, count - unstarted)
    await Promise.all(replicas.map((node) => node.restart()))
    await Promise.all(replicas.map((node) => caughtUpWith(node, nodes[0].position(), 60_000)))
  } catch (error) {
    await stopNodes(nodes, dir)
    throw error
  }
  return { dir, nodes, stop: () => stopNodes(nodes, dir) }
}

// Resolves once the node's copy is at the given position (TXID/checksum) or past it.
export async function caughtUpWith(node: LiteFSNode, target: string, timeoutMs: number) {
  const until = performance.now() + timeoutMs
  while (node.position().slice(0, 16) < target.slice(0, 16)) {
    if (performance.now() > until) throw new Error(`node ${node.name} is at ${node.position()}, not ${target}, after ${timeoutMs} ms\n${node.log()}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

function liteFSNode({ bin, name, mount, config, url, apiPort, cores }: { bin: string; name: string; mount: string; config: string; url: string; apiPort: number; cores?: string }): LiteFSNode {
  let child: ChildProcess | undefined
  let log = ''
  const dbPath = join(mount, DB_NAME)
  const node: LiteFSNode = {
    name, mount, dbPath, url, apiPort,
    get process() {
      return child!
    },
    pid: () => child!.pid!,
    log: () => log,
    position: () => {
      try {
        return readFileSync(`${dbPath}-pos`, 'latin1').trim()
      } catch {
        return ''
      }
    },
    kill: async (signal) => {
      if (!child || child.exitCode !== null || child.signalCode !== null) return
      const exited = once(child, 'exit').then(() => true)
      child.kill(signal)
      const within = (ms: number) => Promise.race([exited, sleep(ms).then(() => false)])
      if (await within(10_000)) return
      // Killed inside a request on its own mount, a LiteFS thread can wait on the mount, and so on
      // itself, for ever (seen once in 2 runs of the cluster tests): the kernel ends it when the mount's
      // FUSE connection is aborted.
      abortFuseConnection(mount)
      if (!(await within(10_000))) throw new Error(`litefs ${name} did not exit after ${signal}, nor once its FUSE connection was aborted`)
    },
    // (Re)mounts: a mount left by a killed LiteFS is detached first, even while files on it are open.
    restart: async () => {
      await node.kill('SIGTERM')
      spawnSync('fusermount3', ['-uz', mount], { stdio: 'ignore' })
      const [command, args] = cores ? ['taskset', ['-c', cores, bin]] : [bin, []]
      child = spawn(command, [...args, 'mount', '-config', config], { stdio: ['ignore', 'pipe', 'pipe'] })
      log = ''
      const ready = new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`litefs ${name} was not ready in 60 s:\n${log}`)), 60_000)
        const onData = (chunk: Buffer) => {
          log += chunk
          if (log.includes('connected to cluster, ready')) {
            clearTimeout(timer)
            resolve()
          }
        }
        child!.stdout!.on('data', onData)
        child!.stderr!.on('data', onData)
        child!.once('exit', (code, signal) => {
          clearTimeout(timer)
          reject(new Error(`litefs ${name} exited (${signal ?? code}):\n${log}`))
        })
      })
      await ready
    },
  }
  return node
}

// /sys/fs/fuse/connections/<the mount's device minor>/abort, with the FUSE control file system mounted.
function abortFuseConnection(mount: string) {
  const line = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').find((l) => l.split(' ')[4] === mount)
  const minor = line?.split(' ')[2].split(':')[1]
  if (!minor) return
  const connections = '/sys/fs/fuse/connections'
  if (!existsSync(join(connections, minor))) spawnSync('mount', ['-t', 'fusectl', 'none', connections], { stdio: 'ignore' })
  try {
    writeFileSync(join(connections, minor, 'abort'), '1')
  } catch {} // not allowed here: the caller's deadline says so
}

// Every LiteFS process stopped and every mount gone, whatever state the nodes were left in.
async function stopNodes(nodes: LiteFSNode[], dir: string) {
  for (const node of nodes) {
    const stopped = node.kill('SIGTERM').catch(() => {})
    const late = setTimeout(() => node.kill('SIGKILL').catch(() => {}), 5_000)
    await stopped
    clearTimeout(late)
    spawnSync('fusermount3', ['-uz', node.mount], { stdio: 'ignore' })
  }
  rmSync(dir, { recursive: true, force: true })
}
