// A server that answers each request with what it was given, for the conformance and differential
// tests of server/http1.ts: how a request reached the fetch handler (method, URL, header fields, body),
// served by either of the API's HTTP servers, or by bare node:http, llhttp as Node runs it.
//
//   HTTP_SERVER=net|node-server|llhttp PORT=0 node test/echo-server.ts
//
// Prints "listening on http://127.0.0.1:<port>". Each answer is 200 with the JSON
// {"method","url","headers":[[name, value], ...],"body":"<base64>"}; the headers as a fetch handler
// iterates them (lower case, sorted, repeated fields joined). llhttp: what node:http itself parsed
// (`url` is the request target as sent, `headers` its raw field lines), and a parse error is a 400 with
// {"error":"<llhttp's code>"}, then the close.
import { Hono } from 'hono'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { MAX_BODY_BYTES } from '../app.ts'
import { createNodeServer } from '../server/node-server.ts'
import { createWireServer } from '../server/wire.ts'

const mode = process.env.HTTP_SERVER ?? 'net'

const echo = new Hono()
echo.all('*', async (c) => {
  const body = Buffer.from(await c.req.arrayBuffer()).toString('base64')
  return c.json({ method: c.req.method, url: c.req.url, headers: [...c.req.raw.headers], body })
})

function bareNodeHttp() {
  const server = createServer({ requireHostHeader: false, keepAliveTimeout: 65_000 }, async (req, res) => {
    const chunks: Buffer[] = []
    try {
      for await (const chunk of req) chunks.push(chunk)
    } catch {
      return // the body never came whole: llhttp refused it, or the client left (clientError answers)
    }
    const headers = []
    for (let i = 0; i < req.rawHeaders.length; i += 2) headers.push([req.rawHeaders[i], req.rawHeaders[i + 1]])
    const body = JSON.stringify({
      method: req.method,
      url: req.url,
      headers,
      body: Buffer.concat(chunks).toString('base64'),
    })
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body)
  })
  server.on('clientError', (error: NodeJS.ErrnoException, socket) => {
    if (!socket.writable) return socket.destroy()
    const body = JSON.stringify({ error: error.code ?? 'unknown' })
    socket.end(
      `HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`,
    )
  })
  return server
}

const server =
  mode === 'llhttp'
    ? bareNodeHttp()
    : (mode === 'node-server'
        ? createNodeServer(echo.fetch, MAX_BODY_BYTES)
        : createWireServer(echo.fetch, MAX_BODY_BYTES)
      ).server
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${(server.address() as AddressInfo).port}`)
})
process.on('SIGTERM', () => process.exit(0))
