// The API's database as the server opens it, beside other processes that use it: the start waits a
// while for locks another process holds, each connection leaves its checkpoints to whoever
// WAL_AUTOCHECKPOINT says, and a file that was read-only and is writable again is written without a
// restart. What it adds to the API is part of the server's setup (server/main.ts).
import { accessSync, chmodSync, constants, statSync } from 'node:fs'
import type { DatabaseSync } from 'node:sqlite'
import { closeDatabase, openDatabase, type ServerSetup, SQLITE_PATH } from '../app.ts'

// How long the start waits for locks another process holds on the database.
const START_WAIT_MS = Number(process.env.START_WAIT_MS || 30_000)
// WAL pages after which a commit checkpoints them into the file: SQLite's default, or 0 where another
// process does the checkpoints (start.ts sets 0 under Litestream).
const WAL_AUTOCHECKPOINT = Number(process.env.WAL_AUTOCHECKPOINT || 1000)

// The API's connections on this box: checkpoints as WAL_AUTOCHECKPOINT says, and a copy the server
// only reads (a follower's) opened read-only and kept so; any other, reopened once it is writable again.
export function databaseSetup(readOnly: boolean): ServerSetup {
  const afterOpen = (db: DatabaseSync) => db.exec(`PRAGMA wal_autocheckpoint = ${WAL_AUTOCHECKPOINT}`)
  return readOnly ? { readOnly, afterOpen } : { afterOpen, whileReadOnly: reopenWhenWritable }
}

// At the start, before the first request. Another process may hold the database's locks a while (a long
// transaction, or a follower's Litestream applying a large one): the start waits, and says so, up to
// START_WAIT_MS, then serves anyway, /health saying the database is busy until the first request finds
// it free.
export async function openDatabaseAtStart() {
  const started = Date.now()
  let waited = false
  while (!openDatabase()) {
    if (Date.now() - started >= START_WAIT_MS) {
      return console.warn(
        `start: ${SQLITE_PATH} is still locked after ${START_WAIT_MS / 1000} s; serving, and /health says the database is busy until it is free`,
      )
    }
    if (!waited)
      console.log(
        `start: ${SQLITE_PATH} is locked by another process (a long transaction); waiting up to ${START_WAIT_MS / 1000} s`,
      )
    waited = true
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  if (waited) console.log(`start: ${SQLITE_PATH} is free after ${((Date.now() - started) / 1000).toFixed(1)} s`)
}

// The file is writable again: a new connection replaces the read-only one. SQLite made the WAL and its
// index with the file's mode of then, read-only, and a connection could not write through them.
function reopenWhenWritable() {
  try {
    accessSync(SQLITE_PATH, constants.W_OK)
  } catch {
    return // still read-only
  }
  closeDatabase()
  const { mode } = statSync(SQLITE_PATH)
  for (const file of [`${SQLITE_PATH}-wal`, `${SQLITE_PATH}-shm`]) {
    try {
      chmodSync(file, mode & 0o777)
    } catch {} // gone, or another user's: the writes will say read-only, as they do now
  }
}
