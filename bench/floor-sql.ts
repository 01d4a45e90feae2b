// What the three floors share (bench/floor.ts on node:http, bench/floor-net.ts on node:net, and
// bench/floor-hono.ts, Hono on the same node:net reader): one node:sqlite connection (WAL,
// synchronous=NORMAL), the same statements, and the same HS256 check of a token.
//
// The statements are app.ts's, copied here as it writes them (its whitespace too, so that a diff shows
// any drift): a floor reads no source at run time, so that nothing of ours has to keep a shape for it
// to find (issue 36). The feed is the exception, in its reference form: ours
// reads it by rowid range when it can (app.ts), which is ours, not the stack's. bench/bench.test.ts
// holds each floor to the goldens and to ours' answers, so a statement that drifts from app.ts's fails there.
// bench/cluster.ts times the post statement alone, this one.
import { createHmac, timingSafeEqual } from 'node:crypto'
import { DatabaseSync, type StatementSync } from 'node:sqlite'
import { DEFAULT_SECRET } from '../harness/seed.ts'

const FEED = `
  SELECT json_object('posts', json_group_array(json_object(
           'id', p.id, 'body', p.body, 'created_at', p.created_at, 'author', u.username,
           'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
         ) ORDER BY p.created_at DESC, p.id DESC)) AS json
  FROM (SELECT id, user_id, body, created_at FROM posts ORDER BY created_at DESC, id DESC LIMIT 20) AS p
  JOIN users AS u ON u.id = p.user_id`

export const POST = `
        SELECT json_object('post', json_object(
                 'id', p.id, 'body', p.body, 'created_at', p.created_at,
                 'author', (SELECT username FROM users AS u WHERE u.id = p.user_id),
                 'like_count', (SELECT count(*) FROM likes AS l WHERE l.post_id = p.id)
               )) AS json
        FROM posts AS p
        WHERE p.id = ?`

const POST_EXISTS = 'SELECT 1 FROM posts WHERE id = ?'

const INSERT_POST = `
        INSERT INTO posts (user_id, body) VALUES ($userId, $body)
        RETURNING json_object('post', json_object(
          'id', id, 'body', body, 'created_at', created_at, 'author', $author, 'like_count', 0
        )) AS json`

// Inserts only when the post exists, and ignores a repeated like.
const INSERT_LIKE = 'INSERT OR IGNORE INTO likes (user_id, post_id) SELECT ?, id FROM posts WHERE id = ?'

// The floor's one connection and its statements, each write in its own autocommit; rows as arrays, as
// ours reads them (node:sqlite makes an array for less than an object with the columns' names).
export function openFloorDatabase(path: string) {
  const db = new DatabaseSync(path)
  db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL')
  return {
    db,
    feed: rowsAsArrays(db.prepare(FEED)),
    post: rowsAsArrays(db.prepare(POST)),
    postExists: rowsAsArrays(db.prepare(POST_EXISTS)),
    insertPost: rowsAsArrays(db.prepare(INSERT_POST)),
    insertLike: db.prepare(INSERT_LIKE),
  }
}

function rowsAsArrays(statement: StatementSync): StatementSync {
  statement.setReturnArrays(true)
  return statement
}

// A post id, as ours reads one: a positive decimal integer.
export const DECIMAL = /^[1-9][0-9]*$/
export type JsonRow = { 0: string } // the one column, the JSON SQLite wrote
const SECRET = process.env.JWT_SECRET || DEFAULT_SECRET

// HS256 only, checked by hand: the signature, exp, and the claims the writes use. `authorization` is the
// header's value, which the caller has seen start with "Bearer ". A token that is not JSON where it should
// be is no user either, as in ours.
export function tokenUser(authorization: string): { id: number; username: string } | undefined {
  try {
    const [header, payload, signature] = authorization.slice(7).split('.')
    if (!signature || JSON.parse(Buffer.from(header, 'base64url').toString()).alg !== 'HS256') return undefined
    const expected = createHmac('sha256', SECRET).update(`${header}.${payload}`).digest()
    const given = Buffer.from(signature, 'base64url')
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString())
    if (!(claims.exp > Date.now() / 1000) || !DECIMAL.test(claims.sub) || typeof claims.username !== 'string')
      return undefined
    return { id: Number(claims.sub), username: claims.username }
  } catch {
    return undefined
  }
}
