// The floor: what our stack costs with nothing of ours around the SQL. A bare node:http server, one
// node:sqlite connection (WAL, synchronous=NORMAL), app.ts's own statements (read out of its source, so
// the two cannot drift apart), tokens checked with node:crypto's HMAC, each write in its own autocommit,
// no framework. It answers what the benchmark sends exactly as ours does; anything else is a bare 404.
//
//   SQLITE_PATH=feed.db PORT=3000 node bench/floor.ts
import { createHmac, timingSafeEqual } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { DatabaseSync } from 'node:sqlite'

const SECRET = process.env.JWT_SECRET || 'twelve-dollar-challenge'
const source = readFileSync(new URL('../app.ts', import.meta.url), 'utf8')

// The SQL of `<name>: db.prepare(...)` in app.ts, as written there.
function appStatement(name: string): string {
  const match = new RegExp(`\\b${name}: db\\.prepare\\((['\`])([\\s\\S]*?)\\1\\)`).exec(source)
  if (!match || match[2].includes('${')) throw new Error(`app.ts has no plain statement named ${name}`)
  return match[2]
}

const db = new DatabaseSync(process.env.SQLITE_PATH!)
db.exec('PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL')
const feed = db.prepare(appStatement('feed'))
const post = db.prepare(appStatement('post'))
const postExists = db.prepare(appStatement('postExists'))
const insertPost = db.prepare(appStatement('insertPost'))
const insertLike = db.prepare(appStatement('insertLike'))

const HEADERS = Object.entries({ 'content-type': 'application/json', 'x-content-type-options': 'nosniff', 'cache-control': 'no-store' })

// The same bytes on the wire as ours: Node adds Content-Length, after its own headers.
function answer(res: ServerResponse, status: number, body: string) {
  res.statusCode = status
  for (const [name, value] of HEADERS) res.setHeader(name, value)
  res.end(body)
}
const DECIMAL = /^[1-9][0-9]*$/

// HS256 only, checked by hand: the signature, exp, and the claims the writes use.
function user(req: IncomingMessage): { id: number; username: string } | undefined {
  const [header, payload, signature] = req.headers.authorization?.slice(7).split('.') ?? []
  if (!signature || JSON.parse(Buffer.from(header, 'base64url').toString()).alg !== 'HS256') return undefined
  const expected = createHmac('sha256', SECRET).update(`${header}.${payload}`).digest()
  const given = Buffer.from(signature, 'base64url')
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined
  const claims = JSON.parse(Buffer.from(payload, 'base64url').toString())
  if (!(claims.exp > Date.now() / 1000) || !DECIMAL.test(claims.sub) || typeof claims.username !== 'string') return undefined
  return { id: Number(claims.sub), username: claims.username }
}

async function route(req: IncomingMessage, res: ServerResponse) {
  const [, first, id, last] = req.url!.split('/')
  if (req.method === 'GET' && first === 'feed' && id === undefined) return answer(res, 200, (feed.get() as { json: string }).json)
  if (first !== 'posts') return answer(res, 404, '{"error":"not found"}')
  if (req.method === 'GET' && id !== undefined && last === undefined) {
    const row = DECIMAL.test(id) ? (post.get(Number(id)) as { json: string } | undefined) : undefined
    return row ? answer(res, 200, row.json) : answer(res, 404, '{"error":"post not found"}')
  }
  if (req.method !== 'POST') return answer(res, 404, '{"error":"not found"}')
  const who = user(req)
  if (!who) return answer(res, 401, '{"error":"invalid or expired token"}')
  if (id === undefined) {
    let text = ''
    for await (const chunk of req) text += chunk
    const body = String(JSON.parse(text).body ?? '').trim()
    const [{ json }] = insertPost.all({ userId: who.id, body, author: who.username }) as { json: string }[]
    return answer(res, 201, json)
  }
  if (last !== 'like' || !DECIMAL.test(id)) return answer(res, 404, '{"error":"not found"}')
  const postId = Number(id)
  const { changes } = insertLike.run(who.id, postId)
  if (!changes && !postExists.get(postId)) return answer(res, 404, '{"error":"post not found"}')
  answer(res, changes ? 201 : 200, `{"liked":true,"already_liked":${!changes},"post_id":${postId}}`)
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => void route(req, res))
server.listen(Number(process.env.PORT ?? 0), process.env.HOST ?? '127.0.0.1', () => {
  const { address, port } = server.address() as { address: string; port: number }
  console.log(`listening on http://${address}:${port}`)
})
const stop = () => server.close(() => (db.close(), process.exit(0)))
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
