// `npm start` and the container run this: seed the challenge data on the first start, then serve it.
// With LITESTREAM_REPLICA_URL set, the database lives in a replica too (README, "Keep the data"): a
// missing file is restored from the replica before the seed is asked, and the server runs under
// `litestream replicate`, which streams every change to the replica about once a second.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { accessSync, constants, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { basename, dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const SQLITE_PATH = process.env.SQLITE_PATH || 'data/feed.db'
const REPLICA_URL = process.env.LITESTREAM_REPLICA_URL
const dist = (file: string) => fileURLToPath(new URL(`./${file}`, import.meta.url))

if (REPLICA_URL) await restoreIfMissing()

// The seed runs in a process of its own, so its memory is gone before the server starts.
await runToEnd('the seed', process.execPath, [dist('seed.js'), '--if-missing'])

if (REPLICA_URL) replicate()
else (await import(new URL('./app.js', import.meta.url).href)).run()

// Runs a step to its end, passing on SIGTERM and SIGINT; a step that fails stops the start.
async function runToEnd(step: string, command: string, args: readonly string[]) {
  const child = spawn(command, args, { stdio: 'inherit' })
  const forward = (signal: NodeJS.Signals) => child.kill(signal)
  process.on('SIGTERM', forward).on('SIGINT', forward)
  const [code, signal] = await once(child, 'exit')
  process.off('SIGTERM', forward).off('SIGINT', forward)
  if (code !== 0) {
    console.error(`start: ${step} ${signal ? `was stopped by ${signal}` : `failed with exit code ${code}`}`)
    process.exit(code || 1)
  }
}

// Litestream's own files sit beside the database (litestream.io/reference/config): its state in
// .feed.db-litestream/, and the config this writes in .feed.db-litestream.yml.
function litestreamPaths() {
  const db = resolve(SQLITE_PATH)
  const state = join(dirname(db), `.${basename(db)}-litestream`)
  return { db, state, config: `${state}.yml` }
}

// One database, one replica. The S3 endpoint and region come from the AWS SDKs' usual variables,
// for S3-compatible stores (litestream.io/guides/s3-compatible); the keys Litestream reads from the
// environment itself. JSON is YAML, and -no-expand-env keeps a `$` in a path as it is.
function writeLitestreamConfig() {
  const { db, config } = litestreamPaths()
  const endpoint = process.env.AWS_ENDPOINT_URL_S3 || process.env.AWS_ENDPOINT_URL
  const region = process.env.AWS_REGION
  const replica = { url: REPLICA_URL, ...(endpoint && { endpoint }), ...(region && { region }) }
  mkdirSync(dirname(db), { recursive: true })
  writeFileSync(config, JSON.stringify({ dbs: [{ path: db, replicas: [replica] }] }, null, 2) + '\n')
  return config
}

function litestream(command: 'restore' | 'replicate', ...args: string[]) {
  return [litestreamBinary(), [command, '-config', writeLitestreamConfig(), '-no-expand-env', ...args]] as const
}

// The binary of the optional dependency @flydotio/litestream-linux-x64 (Fly.io publishes no other
// platform), else one on the PATH (the image's /usr/local/bin).
function litestreamBinary(): string {
  try {
    return createRequire(import.meta.url).resolve(`@flydotio/litestream-${process.platform}-${process.arch}/litestream`)
  } catch {}
  const found = (process.env.PATH ?? '').split(':')
    .filter(Boolean)
    .map((dir) => join(dir, 'litestream'))
    .find((path) => {
      try {
        accessSync(path, constants.X_OK)
        return true
      } catch {
        return false
      }
    })
  if (found) return found
  console.error(`start: LITESTREAM_REPLICA_URL is set, but there is no litestream binary for ${process.platform}-${process.arch}: install Litestream 0.3.13 on the PATH`)
  process.exit(1)
}

// Only a missing file is restored: a file that is there is newer than its replica, or the same.
// Litestream's tips (litestream.io/tips, "Deleting SQLite databases"): a -wal or -shm left from the
// lost file would be applied to the restored one, and Litestream's state beside it describes the lost
// file; all go first. A replica that cannot be read stops the start: seeding then would bury the data.
async function restoreIfMissing() {
  const { db, state } = litestreamPaths()
  if (existsSync(db)) return
  for (const path of [`${db}-wal`, `${db}-shm`, state]) rmSync(path, { recursive: true, force: true })
  console.log(`start: ${SQLITE_PATH} is missing; restoring it from ${shown(REPLICA_URL!)}`)
  const started = performance.now()
  await runToEnd('litestream restore', ...litestream('restore', '-if-replica-exists', db))
  // Litestream 0.3.13 leaves the empty WAL and index of its temporary file behind.
  for (const suffix of ['.tmp-wal', '.tmp-shm']) rmSync(db + suffix, { force: true })
  if (existsSync(db)) {
    const mb = (statSync(db).size / 1024 ** 2).toFixed(1)
    console.log(`start: restored ${SQLITE_PATH} (${mb} MB) from the replica in ${((performance.now() - started) / 1000).toFixed(1)} s`)
  } else {
    console.log('start: the replica holds no database yet: nothing to restore, so the seed builds one')
  }
}

// Litestream takes this process's place (no process waits in between) and runs the server as its
// child: a SIGTERM to it reaches the server, and once the server has exited, Litestream sends the
// last frames to the replica and exits 0 (if it has synced once: it first does a second after it
// starts). The server's connections leave the checkpoints to Litestream (litestream.io/tips,
// "Disable autocheckpoints for high write load servers").
function replicate() {
  const [binary, args] = litestream('replicate', '-exec', [process.execPath, ...process.execArgv, dist('app.js')].map(quoted).join(' '))
  console.log(`start: serving ${SQLITE_PATH} under litestream replicate, to ${shown(REPLICA_URL!)}`)
  process.execve!(binary, [binary, ...args], { ...process.env, WAL_AUTOCHECKPOINT: '0' })
}

// -exec is split into words the way a shell would: each word in single quotes.
function quoted(word: string) {
  return `'${word.replaceAll("'", `'\\''`)}'`
}

// A URL as the log shows it: without a password, if it has one (sftp://user:password@host/...).
function shown(url: string) {
  try {
    const parsed = new URL(url)
    if (parsed.password) parsed.password = '***'
    return parsed.href
  } catch {
    return url
  }
}
