// The Node ceiling: the least a node:http server can do per request. Same Node, same core, and a
// constant JSON body the size of a feed response (the golden feed itself), so our figures can be read
// as multiples of it.
import { readFileSync } from 'node:fs'
import { createServer } from 'node:http'

const body = readFileSync(new URL('../test/golden/feed.json', import.meta.url))
const headers = { 'content-type': 'application/json', 'content-length': body.length }

const server = createServer((req, res) => {
  res.writeHead(200, headers)
  res.end(body)
})
server.keepAliveTimeout = 65_000
server.listen(Number(process.env.PORT ?? 0), process.env.HOST ?? '127.0.0.1', () => {
  const { address, port } = server.address() as { address: string; port: number }
  console.log(`listening on http://${address}:${port}`)
})
process.on('SIGTERM', () => server.close(() => process.exit(0)))
