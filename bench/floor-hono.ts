// The node:net floor with Hono in it: bench/floor-net.ts's reader and writer (bench/floor-wire.ts), the
// same SQL and token check (bench/floor-sql.ts), but every request goes through a minimal Hono app, four
// routes whose handlers return `new Response(body, { status, headers })`, called as app.fetch(request).
// Against bench/floor-net.ts it measures what Hono itself adds: its router, its Context, a Response a
// request. Nothing else is built: the request is a light object with what Hono reads of one (method,
// url, headers.get(), text() and arrayBuffer()), and the Response is a light one that keeps what it was
// given, in place of the global one, as ours' servers do (server/'s own, and @hono/node-server's).
//
//   SQLITE_PATH=feed.db PORT=3000 node bench/floor-hono.ts
import { Hono, type Context } from 'hono'
import { DECIMAL, openFloorDatabase, tokenUser, type JsonRow } from './floor-sql.ts'
import { serveWire, type WireAnswer, type WireRequest } from './floor-wire.ts'

const { db, feed, post, postExists, insertPost, insertLike } = openFloorDatabase(process.env.SQLITE_PATH!)

// What the handlers' `new Response(...)` makes: their status and body, read back as they are.
class LightResponse {
  status: number
  content: string
  constructor(body: string | null, init?: { status?: number }) {
    this.status = init?.status ?? 200
    this.content = body ?? ''
  }
}
Object.defineProperty(globalThis, 'Response', { value: LightResponse, writable: true, configurable: true })

class LightHeaders {
  #fields: Map<string, string>
  constructor(fields: Map<string, string>) {
    this.#fields = fields
  }
  get(name: string): string | null {
    return this.#fields.get(name.toLowerCase()) ?? null
  }
}

class LightRequest {
  method: string
  url: string
  headers: LightHeaders
  #body: Buffer
  constructor({ method, target, fields, body }: WireRequest) {
    this.method = method
    this.url = `http://${fields.get('host') ?? 'localhost'}${target}`
    this.headers = new LightHeaders(fields)
    this.#body = body
  }
  text() {
    return Promise.resolve(this.#body.toString())
  }
  arrayBuffer() {
    return Promise.resolve(new Uint8Array(this.#body).buffer)
  }
}

// Every answer here carries the same three headers, which the wire writes: reading them back from each
// Response would measure an adapter, not Hono.
const JSON_HEADERS = {
  'content-type': 'application/json',
  'x-content-type-options': 'nosniff',
  'cache-control': 'no-store',
}
const json = (status: number, body: string) => new Response(body, { status, headers: JSON_HEADERS })

// The writer a request's token names, or the 401 that refuses it.
function writer(c: Context): { id: number; username: string } | Response {
  const authorization = c.req.header('authorization')
  if (!authorization?.startsWith('Bearer ')) return json(401, '{"error":"missing bearer token"}')
  return tokenUser(authorization) ?? json(401, '{"error":"invalid or expired token"}')
}

const app = new Hono()

app.get('/feed', () => json(200, (feed.get() as JsonRow)[0]))

app.get('/posts/:id', (c) => {
  const id = c.req.param('id')
  if (!DECIMAL.test(id)) return json(400, '{"error":"invalid post id"}')
  const row = post.get(Number(id)) as JsonRow | undefined
  return row ? json(200, row[0]) : json(404, '{"error":"post not found"}')
})

app.post('/posts', async (c) => {
  const who = writer(c)
  if (who instanceof Response) return who
  let input
  try {
    input = JSON.parse(await c.req.text())
  } catch {
    return json(400, '{"error":"malformed JSON body"}')
  }
  const body = typeof input?.body === 'string' ? input.body.trim() : ''
  if (!body) return json(400, '{"error":"body is required"}')
  if (body.length > 500 && [...body].length > 500) return json(400, '{"error":"body must be at most 500 characters"}')
  const [{ 0: created }] = insertPost.all({ userId: who.id, body, author: who.username }) as JsonRow[]
  return json(201, created)
})

app.post('/posts/:id/like', (c) => {
  const who = writer(c)
  if (who instanceof Response) return who
  const id = c.req.param('id')
  if (!DECIMAL.test(id)) return json(400, '{"error":"invalid post id"}')
  const postId = Number(id)
  const { changes } = insertLike.run(who.id, postId)
  if (!changes && !postExists.get(postId)) return json(404, '{"error":"post not found"}')
  return json(changes ? 201 : 200, `{"liked":true,"already_liked":${!changes},"post_id":${postId}}`)
})

app.notFound(() => json(404, '{"error":"not found"}'))

// What throws is a 500, as ours answers it.
app.onError((error) => {
  console.error(error)
  return json(500, '{"error":"internal server error"}')
})

function readBack(response: Response): WireAnswer {
  if (!(response instanceof LightResponse)) throw new Error('a Response not made by the handlers')
  return { status: response.status, body: response.content }
}

function handle(request: WireRequest): WireAnswer | Promise<WireAnswer> {
  const response = app.fetch(new LightRequest(request) as unknown as Request)
  return response instanceof Promise ? response.then(readBack) : readBack(response)
}

serveWire(handle, () => db.close())
