// s3rver (S3 on npm) as a process of its own: the object store Litestream replicates to in the
// replication and follower tests and in the benchmark's cluster.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { join } from 'node:path'
import { ROOT } from './tools.ts'

// s3rver on the given port (0: any) and cores, one bucket (feed), its objects in a folder; stop() ends
// it. Litestream gets `env`; a restore by hand takes `url`.
export async function startS3rver(port: number, directory: string, cores?: string) {
  const command = [process.execPath, join(ROOT, 'harness', 's3rver.ts'), directory, String(port)]
  const [file, ...argv] = cores ? ['taskset', '-c', cores, ...command] : command
  const child = spawn(file, argv, { cwd: ROOT, stdio: ['ignore', 'pipe', 'inherit'] })
  // Its port once it listens; an exit or 20 s without it fail the start.
  const started = await Promise.race([
    once(child.stdout!, 'data').then(([chunk]) => String(chunk).trim()),
    once(child, 'exit').then(([code]) => `exited with ${code}`),
    new Promise<string>((resolve) => setTimeout(resolve, 20_000, 'no answer within 20 s').unref()),
  ])
  if (!/^\d+$/.test(started)) {
    child.kill('SIGKILL')
    throw new Error(`s3rver did not start: ${started}`)
  }
  port = Number(started)
  return {
    env: {
      AWS_ENDPOINT_URL_S3: `http://127.0.0.1:${port}`,
      AWS_ACCESS_KEY_ID: 'S3RVER',
      AWS_SECRET_ACCESS_KEY: 'S3RVER',
    },
    url: `s3://feed/feed.db?endpoint=http://127.0.0.1:${port}`,
    // SIGKILL: on SIGTERM s3rver closes gently, and waits for connections a client keeps open.
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.kill('SIGKILL')
      await once(child, 'exit')
    },
  }
}
