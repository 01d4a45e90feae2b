// `npm start` and the container run this: seed the challenge data on the first start, then serve it.
// With LITESTREAM_REPLICA_URL set, the database lives in a replica too (docs/litestream.md): a
// missing file is restored from the replica before the seed is asked, and the server runs under
// `litestream replicate` (0.5.17 or later), which streams every change to the replica about once a second.
// With PRIMARY_API_URL as well, this node is a follower of that replica (server/follower.ts):
// `litestream restore -f` restores the database and keeps applying what the primary sends, and the
// server reads that copy and forwards every write to the primary.
//
// The file reads in the order things happen: the settings, what the process keeps while it runs, main()
// with one line a step, then each step, then the helpers.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import {
  accessSync,
  closeSync,
  constants,
  existsSync,
  mkdirSync,
  openSync,
  readSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs'
import { DatabaseSync } from 'node:sqlite'
import { basename, dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { environmentUnderLitestream, litestreamFiles } from './server/litestream.ts'

// The settings, from the environment, with their defaults.
// The database: app.ts's setting and default, written again here, as importing app.ts would load the
// whole API into this process (measured: 105 KB more bundle, 19 MB more memory) beside the server's.
const SQLITE_PATH = process.env.SQLITE_PATH || 'data/feed.db'
const REPLICA_URL = process.env.LITESTREAM_REPLICA_URL
const PRIMARY_API_URL = process.env.PRIMARY_API_URL
// The Litestream binary: a path, or a name looked up on the PATH (the image's /usr/local/bin).
const LITESTREAM_BIN = process.env.LITESTREAM_BIN || 'litestream'
// How often a follower looks for new LTX files in the replica.
const FOLLOW_INTERVAL = process.env.LITESTREAM_FOLLOW_INTERVAL || '100ms'
// How often the primary's Litestream reads the WAL and uploads what is new (its monitor and sync
// intervals, 1 s each by default): most of a follower's lag, and a PUT each time there was a write.
const SYNC_INTERVAL = process.env.LITESTREAM_SYNC_INTERVAL || undefined
// The replica's S3 endpoint and region, from the AWS SDKs' usual variables, for S3-compatible stores
// (litestream.io/guides/s3-compatible); the keys Litestream reads from the environment itself.
const S3_ENDPOINT = process.env.AWS_ENDPOINT_URL_S3 || process.env.AWS_ENDPOINT_URL
const S3_REGION = process.env.AWS_REGION

// The oldest Litestream this runs: 0.5.17's SQLite is the first past the WAL-reset bug
// (sqlite.org/wal.html#walresetbug), which a checkpoint from Litestream's connection can hit.
const LITESTREAM_MIN = [0, 5, 17]
// The database's path and the files Litestream keeps beside it (server/litestream.ts).
const files = litestreamFiles(SQLITE_PATH)

// What the process keeps while it runs, for the one place that handles SIGTERM and SIGINT (onSignal);
// set through signalsGoTo().
const state = {
  // The child a signal is passed on to: the step running (the restore, the seed), then a follower's
  // `litestream restore -f` until its copy is whole, then the follower's server. With none and
  // exitOnSignal false, the start does not listen, and a signal has its usual effect.
  child: undefined as ChildProcess | undefined,
  // True while a follower is still restoring: a signal then ends the start at once with exit code 0,
  // as nothing is served yet and nothing needs to drain. Otherwise the start waits for the child's end.
  exitOnSignal: false,
}

await main()

// Each step in the order it runs; a step that fails stops the start with a line that says why.
async function main() {
  // Settings that cannot work stop the start before anything runs.
  checkSettings()
  // Litestream is found and checked first: a start that cannot replicate stops before it restores or seeds.
  const litestream = REPLICA_URL ? litestreamBinary() : undefined
  // Litestream's config is written once, for every command it is given.
  if (litestream) writeLitestreamConfig()
  // A follower restores the primary's replica, follows it and serves the copy, to the end.
  if (litestream && PRIMARY_API_URL) return follow(litestream)
  // A primary's missing database is restored from its replica.
  if (litestream) await restoreIfMissing(litestream)
  // The seed runs in a process of its own, so its memory is gone before the server starts.
  await runToEnd('the seed', process.execPath, [dist('seed.js'), '--if-missing'])
  // The server runs under Litestream, which takes this process's place, or in this process.
  if (litestream) replicate(litestream)
  else await import(new URL('./app.js', import.meta.url).href)
}

// A follower needs its primary's replica; durations are checked as Go writes them, which Litestream
// reads, so a wrong one is a line of ours.
function checkSettings() {
  if (PRIMARY_API_URL && !REPLICA_URL) {
    console.error(
      "start: PRIMARY_API_URL makes this node a follower of a Litestream replica: set LITESTREAM_REPLICA_URL to the primary's",
    )
    process.exit(1)
  }
  for (const [name, value] of [
    ['LITESTREAM_SYNC_INTERVAL', SYNC_INTERVAL],
    ['LITESTREAM_FOLLOW_INTERVAL', FOLLOW_INTERVAL],
  ]) {
    if (value !== undefined && !/^(\d+(\.\d+)?(ms|s|m|h))+$/.test(value)) {
      console.error(`start: ${name} is a duration such as 100ms or 1s, not ${JSON.stringify(value)}`)
      process.exit(1)
    }
  }
}

// LITESTREAM_BIN as it is if it is a path, else the first on the PATH. A missing or older Litestream
// stops the start, with what was found and where to get 0.5.17. A build between releases says so in a
// Go pseudo-version (v0.5.17-0.20260819145314-63225f17ccbb): it counts as the release it names.
function litestreamBinary(): string {
  const binary = LITESTREAM_BIN.includes('/')
    ? LITESTREAM_BIN
    : (process.env.PATH ?? '')
        .split(':')
        .filter(Boolean)
        .map((dir) => join(dir, LITESTREAM_BIN))
        .find(isExecutable)
  const run = binary ? spawnSync(binary, ['version'], { encoding: 'utf8' }) : undefined
  const said = run?.stdout?.trim()
  const version = /^v?(\d+)\.(\d+)\.(\d+)/
    .exec(said ?? '')
    ?.slice(1)
    .map(Number)
  const first = version?.findIndex((n, i) => n !== LITESTREAM_MIN[i])
  if (version && (first === -1 || version[first!] > LITESTREAM_MIN[first!])) return binary!
  const found = !binary
    ? `there is no ${LITESTREAM_BIN} on the PATH`
    : run!.error
      ? `${binary} does not run (${(run!.error as NodeJS.ErrnoException).code})`
      : `${binary} says ${JSON.stringify(said || run!.stderr.trim())}`
  console.error(
    `start: LITESTREAM_REPLICA_URL needs Litestream ${LITESTREAM_MIN.join('.')} or later, and ${found}: get it from the image litestream/litestream:0.5.17 (/usr/local/bin/litestream) or github.com/benbjohnson/litestream/releases, then put it on the PATH or name it in LITESTREAM_BIN`,
  )
  process.exit(1)
}

// The config, beside the database (files.config), in the folder the database will be in.
function writeLitestreamConfig() {
  mkdirSync(dirname(files.db), { recursive: true })
  writeFileSync(files.config, JSON.stringify(litestreamConfig(), null, 2) + '\n')
}

// One database, one replica, and the control socket the server watches the replica through. JSON is
// YAML, and -no-expand-env (litestreamCommand) keeps a `$` in a path as it is. Litestream 0.5 ignores
// keys it does not know: each one here is in litestream.io/reference/config.
function litestreamConfig() {
  const interval = (key: string) => SYNC_INTERVAL && { [key]: SYNC_INTERVAL }
  const replica = {
    url: REPLICA_URL,
    ...(S3_ENDPOINT && { endpoint: S3_ENDPOINT }),
    ...(S3_REGION && { region: S3_REGION }),
    ...interval('sync-interval'),
  }
  const dbs = [{ path: files.db, ...interval('monitor-interval'), replica }]
  return { socket: { enabled: true, path: files.socket }, dbs }
}

// A follower: Litestream restores the database and follows the replica; the server starts once the
// copy is whole and reads it. Either process ending ends the other, and the start.
async function follow(litestream: string): Promise<never> {
  setAsideUnfollowed()
  console.log(`start: following ${shown(REPLICA_URL!)} into ${SQLITE_PATH}; writes go to ${PRIMARY_API_URL}`)
  signalsGoTo(undefined, { exitOnSignal: true })
  const follower = await startFollowing(litestream)
  readersFirst()
  const server = spawn(process.execPath, [...process.execArgv, dist('app.js')], { stdio: 'inherit' })
  signalsGoTo(server)
  const ended = await firstExit({ 'the server': server, 'litestream restore -f': follower })
  await stopAll([server, follower])
  const code = exitCode(ended)
  if (code !== 0)
    console.error(`start: ${ended.who} ended (${ended.signal ?? `exit code ${ended.code}`}), so the follower stops`)
  process.exit(code)
}

// A database here that Litestream did not restore (no `<db>-txid`) cannot be followed: set aside,
// never deleted (it may hold writes of its own), and the copy restored afresh.
function setAsideUnfollowed() {
  const { db, txid } = files
  if (!existsSync(db) || existsSync(txid)) return
  const aside = `${db}.not-followed-${new Date().toISOString().replace(/[:.]/g, '-')}`
  for (const suffix of ['', '-wal', '-shm', '-journal'])
    if (existsSync(db + suffix)) renameSync(db + suffix, aside + suffix)
  console.log(
    `start: ${SQLITE_PATH} has no ${basename(txid)}, so Litestream did not restore it: set it aside as ${aside}`,
  )
}

// `litestream restore -f`, running once it follows: it says so after a restore, or at once when it
// resumes from `<db>-txid` after a restart. 0.5.17 resumes only while the primary has written nothing
// since its last snapshot (one a day): otherwise it refuses, and the copy, Litestream's own, is
// restored afresh. A replica with nothing to restore yet (the primary's first snapshot on its way) is
// tried again every 2 s.
async function startFollowing(litestream: string): Promise<ChildProcess> {
  const started = performance.now()
  for (let waited = false; ;) {
    const restore = restoreFollowing(litestream)
    signalsGoTo(restore.child, { exitOnSignal: true })
    if (await restore.following) {
      console.log(
        `start: ${SQLITE_PATH} is whole after ${((performance.now() - started) / 1000).toFixed(1)} s; serving it`,
      )
      return restore.child
    }
    if (restore.said().includes('cannot resume follow mode')) {
      for (const suffix of ['', '-txid', '-journal', '-wal', '-shm']) rmSync(files.db + suffix, { force: true })
      console.log(`start: Litestream cannot resume ${SQLITE_PATH} where it was; restoring it afresh`)
      continue
    }
    if (!waited) console.log('start: nothing to follow yet; trying again every 2 s')
    waited = true
    await sleep(2_000)
  }
}

// One `litestream restore -f`, its output passed on: `following` settles true when it enters follow
// mode, false if it exits first; `said()` is what it said up to then.
function restoreFollowing(litestream: string) {
  const [binary, args] = litestreamCommand(litestream, 'restore', '-f', '-follow-interval', FOLLOW_INTERVAL, files.db)
  const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let said = ''
  const following = new Promise<boolean>((resolve) => {
    const listen = (out: NodeJS.WriteStream) => (chunk: Buffer) => {
      out.write(chunk)
      if (said.includes('entering follow mode')) return
      said += chunk
      if (said.includes('entering follow mode')) resolve(true)
    }
    child.stdout!.on('data', listen(process.stdout))
    child.stderr!.on('data', listen(process.stderr))
    child.once('exit', () => resolve(false))
  })
  return { child, following, said: () => said }
}

// Litestream restores the primary's header as it is, WAL mode included, and marks the copy
// rollback-journal only when it next applies page 1. A reader of a WAL file holds a lock on it for as
// long as it is open, which Litestream's apply would wait on forever, and trusts its page cache by an
// index Litestream never writes. So the copy is switched before anything reads it, under SQLite's
// locks, which Litestream's apply takes too. (Every commit of the primary writes page 1 under
// Litestream, server/primary.ts: each apply then changes the header's counter, and the readers' caches go.)
function readersFirst() {
  const header = Buffer.alloc(2)
  const fd = openSync(files.db, 'r')
  readSync(fd, header, 0, 2, 18)
  closeSync(fd)
  if (header[0] !== 2) return
  const copy = new DatabaseSync(files.db, { timeout: 10_000 })
  copy.exec('PRAGMA journal_mode = DELETE')
  copy.close()
}

type Exit = { who: string; code: number | null; signal: NodeJS.Signals | null }

// The first of the children, by name, to exit, and how.
function firstExit(children: Record<string, ChildProcess>): Promise<Exit> {
  return Promise.race(
    Object.entries(children).map(([who, child]) =>
      once(child, 'exit').then(([code, signal]): Exit => ({ who, code, signal })),
    ),
  )
}

// Sends SIGTERM to those still running, and waits until all have exited.
async function stopAll(children: ChildProcess[]) {
  const running = children.filter((child) => child.exitCode === null && child.signalCode === null)
  for (const child of running) child.kill('SIGTERM')
  await Promise.all(running.map((child) => once(child, 'exit')))
}

// A follower's exit code: 0 when its server stopped cleanly (a SIGTERM passed on to it), else the exit
// code of the one that ended first, or 1 if it had none.
function exitCode({ who, code }: Exit) {
  return who === 'the server' && code === 0 ? 0 : code || 1
}

// Only a missing file is restored: a file that is there is newer than its replica, or the same.
// Litestream's tips (litestream.io/tips, "Deleting SQLite databases"): a -wal or -shm left from the
// lost file would be applied to the restored one, and Litestream's state beside it describes the lost
// file; all go first. A replica that cannot be read stops the start: seeding then would bury the data.
async function restoreIfMissing(litestream: string) {
  const { db, state } = files
  if (existsSync(db)) return
  for (const path of [`${db}-wal`, `${db}-shm`, state]) rmSync(path, { recursive: true, force: true })
  console.log(`start: ${SQLITE_PATH} is missing; restoring it from ${shown(REPLICA_URL!)}`)
  const started = performance.now()
  await runToEnd('litestream restore', ...litestreamCommand(litestream, 'restore', '-if-replica-exists', db))
  if (existsSync(db)) {
    const mb = (statSync(db).size / 1024 ** 2).toFixed(1)
    console.log(
      `start: restored ${SQLITE_PATH} (${mb} MB) from the replica in ${((performance.now() - started) / 1000).toFixed(1)} s`,
    )
  } else {
    console.log('start: the replica holds no database yet: nothing to restore, so the seed builds one')
  }
}

// Runs a step to its end, passing on SIGTERM and SIGINT; a step that fails stops the start.
async function runToEnd(step: string, command: string, args: readonly string[]) {
  const child = spawn(command, args, { stdio: 'inherit' })
  signalsGoTo(child)
  const [code, signal] = await once(child, 'exit')
  signalsGoTo(undefined)
  if (code !== 0) {
    console.error(`start: ${step} ${signal ? `was stopped by ${signal}` : `failed with exit code ${code}`}`)
    process.exit(code || 1)
  }
}

// Litestream takes this process's place (no process waits in between) and runs the server as its
// child: a SIGTERM to it reaches the server, and once the server has exited, Litestream sends the
// last transactions to the replica and exits 0. The server's connections leave the checkpoints to
// Litestream (litestream.io/tips, "Disable autocheckpoints for high write load servers"), and watch
// the replica through its control socket.
function replicate(litestream: string) {
  const [binary, args] = litestreamCommand(
    litestream,
    'replicate',
    '-exec',
    [process.execPath, ...process.execArgv, dist('app.js')].map(quoted).join(' '),
  )
  console.log(`start: serving ${SQLITE_PATH} under litestream replicate, to ${shown(REPLICA_URL!)}`)
  process.execve!(binary, [binary, ...args], { ...process.env, ...environmentUnderLitestream(files.socket) })
}

// Signals, handled here alone: SIGTERM and SIGINT go to state.child, and while state.exitOnSignal the
// start then exits 0.
function onSignal(signal: NodeJS.Signals) {
  state.child?.kill(signal)
  if (state.exitOnSignal) process.exit(0)
}

// Where a signal goes from now on. With nowhere, the start stops listening: a signal has its usual
// effect again, and the server this process imports handles its own.
function signalsGoTo(child: ChildProcess | undefined, { exitOnSignal = false } = {}) {
  state.child = child
  state.exitOnSignal = exitOnSignal
  process.off('SIGTERM', onSignal).off('SIGINT', onSignal)
  if (child || exitOnSignal) process.on('SIGTERM', onSignal).on('SIGINT', onSignal)
}

// How Litestream is run: the command, its config (written by writeLitestreamConfig), and its arguments.
function litestreamCommand(litestream: string, command: 'restore' | 'replicate', ...args: string[]) {
  return [litestream, [command, '-config', files.config, '-no-expand-env', ...args]] as const
}

// A bundle beside this one in dist/.
function dist(file: string) {
  return fileURLToPath(new URL(`./${file}`, import.meta.url))
}

function sleep(ms: number) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

function isExecutable(path: string) {
  try {
    accessSync(path, constants.X_OK)
    return statSync(path).isFile()
  } catch {
    return false
  }
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
