// The floor without node:http: bench/floor.ts's work (the same SQL and token check, bench/floor-sql.ts;
// the same answers, byte for byte but for the Date), its requests read and answered straight on node:net
// by bench/floor-wire.ts. Against bench/floor.ts it measures what node:http costs around the same work;
// against ours, what a server of ours on node:net could at best save.
//
//   SQLITE_PATH=feed.db PORT=3000 node bench/floor-net.ts
import { DECIMAL, openFloorDatabase, tokenUser, type JsonRow } from './floor-sql.ts'
import { serveWire, type WireAnswer, type WireRequest } from './floor-wire.ts'

const { db, feed, post, postExists, insertPost, insertLike } = openFloorDatabase(process.env.SQLITE_PATH!)

const answer = (status: number, body: string): WireAnswer => ({ status, body })
const NOT_FOUND = answer(404, '{"error":"not found"}')
const POST_NOT_FOUND = answer(404, '{"error":"post not found"}')
const INVALID_ID = answer(400, '{"error":"invalid post id"}')

// bench/floor.ts's route, with the body already read.
function route({ method, target, fields, body }: WireRequest): WireAnswer {
  const [, first, id, last] = target.split('/')
  if (method === 'GET' && first === 'feed' && id === undefined) return answer(200, (feed.get() as JsonRow)[0])
  if (first !== 'posts') return NOT_FOUND
  if (method === 'GET' && id !== undefined && last === undefined) {
    if (!DECIMAL.test(id)) return INVALID_ID
    const row = post.get(Number(id)) as JsonRow | undefined
    return row ? answer(200, row[0]) : POST_NOT_FOUND
  }
  if (method !== 'POST' || (id !== undefined && last !== 'like')) return NOT_FOUND
  const authorization = fields.get('authorization')
  if (!authorization?.startsWith('Bearer ')) return answer(401, '{"error":"missing bearer token"}')
  const who = tokenUser(authorization)
  if (!who) return answer(401, '{"error":"invalid or expired token"}')
  return id === undefined ? createPost(who, body) : like(who.id, id)
}

function createPost(who: { id: number; username: string }, bytes: Buffer): WireAnswer {
  let input
  try {
    input = JSON.parse(bytes.toString())
  } catch {
    return answer(400, '{"error":"malformed JSON body"}')
  }
  const body = typeof input?.body === 'string' ? input.body.trim() : ''
  if (!body) return answer(400, '{"error":"body is required"}')
  if (body.length > 500 && [...body].length > 500) return answer(400, '{"error":"body must be at most 500 characters"}')
  const [{ 0: json }] = insertPost.all({ userId: who.id, body, author: who.username }) as JsonRow[]
  return answer(201, json)
}

function like(userId: number, id: string): WireAnswer {
  if (!DECIMAL.test(id)) return INVALID_ID
  const postId = Number(id)
  const { changes } = insertLike.run(userId, postId)
  if (!changes && !postExists.get(postId)) return POST_NOT_FOUND
  return answer(changes ? 201 : 200, `{"liked":true,"already_liked":${!changes},"post_id":${postId}}`)
}

serveWire(route, () => db.close())
