// The floor: what our stack costs with nothing of ours around the SQL. A bare node:http server, one
// node:sqlite connection (WAL, synchronous=NORMAL), app.ts's own statements (copied in
// bench/floor-sql.ts) but for the feed, which it reads in the reference form, tokens checked with
// node:crypto's HMAC, each write in its own autocommit, no framework. It answers what the benchmark sends exactly as ours does, and the refusals the
// benchmark's requests can meet (a missing or bad token, a post that is not there, a malformed id or
// body) with ours' status and body; any other path is a bare 404, and what throws a 500, as ours: every
// answer framed by a Content-Length, which is what bench/users.ts reads.
//
//   SQLITE_PATH=feed.db PORT=3000 node bench/floor.ts
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { DECIMAL, openFloorDatabase, tokenUser, type JsonRow } from './floor-sql.ts'

const { db, feed, post, postExists, insertPost, insertLike } = openFloorDatabase(process.env.SQLITE_PATH!)

const HEADERS = Object.entries({
  'content-type': 'application/json',
  'x-content-type-options': 'nosniff',
  'cache-control': 'no-store',
})

// The same bytes on the wire as ours: Node adds Content-Length, after its own headers.
function answer(res: ServerResponse, status: number, body: string) {
  res.statusCode = status
  for (const [name, value] of HEADERS) res.setHeader(name, value)
  res.end(body)
}

async function route(req: IncomingMessage, res: ServerResponse) {
  const [, first, id, last] = req.url!.split('/')
  if (req.method === 'GET' && first === 'feed' && id === undefined) return answer(res, 200, (feed.get() as JsonRow)[0])
  if (first !== 'posts') return answer(res, 404, '{"error":"not found"}')
  if (req.method === 'GET' && id !== undefined && last === undefined) {
    if (!DECIMAL.test(id)) return answer(res, 400, '{"error":"invalid post id"}')
    const row = post.get(Number(id)) as JsonRow | undefined
    return row ? answer(res, 200, row[0]) : answer(res, 404, '{"error":"post not found"}')
  }
  if (req.method !== 'POST' || (id !== undefined && last !== 'like')) return answer(res, 404, '{"error":"not found"}')
  if (!req.headers.authorization?.startsWith('Bearer ')) return answer(res, 401, '{"error":"missing bearer token"}')
  const who = tokenUser(req.headers.authorization)
  if (!who) return answer(res, 401, '{"error":"invalid or expired token"}')
  if (id === undefined) {
    let text = ''
    for await (const chunk of req) text += chunk
    let input
    try {
      input = JSON.parse(text)
    } catch {
      return answer(res, 400, '{"error":"malformed JSON body"}')
    }
    const body = typeof input?.body === 'string' ? input.body.trim() : ''
    if (!body) return answer(res, 400, '{"error":"body is required"}')
    if (body.length > 500 && [...body].length > 500)
      return answer(res, 400, '{"error":"body must be at most 500 characters"}')
    const [{ 0: json }] = insertPost.all({ userId: who.id, body, author: who.username }) as JsonRow[]
    return answer(res, 201, json)
  }
  if (!DECIMAL.test(id)) return answer(res, 400, '{"error":"invalid post id"}')
  const postId = Number(id)
  const { changes } = insertLike.run(who.id, postId)
  if (!changes && !postExists.get(postId)) return answer(res, 404, '{"error":"post not found"}')
  answer(res, changes ? 201 : 200, `{"liked":true,"already_liked":${!changes},"post_id":${postId}}`)
}

// What throws is a 500, as ours answers it, and the process goes on: an unhandled rejection would end it.
function failed(res: ServerResponse, error: unknown) {
  console.error(error)
  if (!res.headersSent) answer(res, 500, '{"error":"internal server error"}')
}

const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) =>
  route(req, res).catch((error) => failed(res, error)),
)
server.listen(Number(process.env.PORT ?? 0), process.env.HOST ?? '127.0.0.1', () => {
  const { address, port } = server.address() as { address: string; port: number }
  console.log(`listening on http://${address}:${port}`)
})
const stop = () => server.close(() => (db.close(), process.exit(0)))
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
