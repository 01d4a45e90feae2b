// What start.ts, which runs Litestream, and the server under it (server/primary.ts, server/follower.ts)
// both need to know: the files Litestream keeps beside the database, and what start.ts hands the
// server. Written once here, where nothing else is imported, so that start.ts stays small.
import { tmpdir } from 'node:os'
import { basename, dirname, join, resolve } from 'node:path'

// Litestream's own files sit beside the database (litestream.io/reference/config): its state in
// .feed.db-litestream/, the config start.ts writes in .feed.db-litestream.yml, and its control socket,
// through which the server watches the replica. A socket's path has at most 107 bytes; a longer one
// goes to the temporary folder. On a follower, `litestream restore -f` writes the TXID it has applied
// to `<db>-txid`.
export function litestreamFiles(sqlitePath: string) {
  const db = resolve(sqlitePath)
  const state = join(dirname(db), `.${basename(db)}-litestream`)
  const socket =
    Buffer.byteLength(`${state}.sock`) <= 107 ? `${state}.sock` : join(tmpdir(), `litestream-${process.pid}.sock`)
  return { db, state, config: `${state}.yml`, socket, txid: `${db}-txid` }
}

// What start.ts adds to the environment of the server it runs under `litestream replicate`: where
// Litestream's control socket is, and the checkpoints left to Litestream (litestream.io/tips, "Disable
// autocheckpoints for high write load servers").
const SOCKET = 'LITESTREAM_SOCKET'
export const environmentUnderLitestream = (socket: string) => ({ [SOCKET]: socket, WAL_AUTOCHECKPOINT: '0' })

// In the server: the control socket of the Litestream it runs under, if it does.
export const litestreamSocket = process.env[SOCKET]
