// openapi.json, the API described for its clients, held to the API: the document valid by OpenAPI 3.1's
// own schema (a maintained validator), and every response the contract's tests get from the built server
// on a fresh seed (status, headers, body) one the document allows for that operation, so that neither
// can drift from the other.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { Validator } from '@seriousme/openapi-schema-validator'
import { Ajv2020 } from 'ajv/dist/2020.js'
import { freshSeededCopy } from '../harness/seed.ts'
import { type Server, startServer } from '../harness/server.ts'
import { within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { contractTests } from './contract.ts'

type Operation = {
  responses: Record<string, { $ref?: string; headers?: object; content?: Record<string, { schema: object }> }>
}
const DOC = JSON.parse(readFileSync(join(ROOT, 'openapi.json'), 'utf8'))
const ID = 'https://twelve-dollar-feed.invalid/openapi.json'

test('openapi.json is a valid OpenAPI 3.1 document', async () => {
  const validator = new Validator()
  const result = await validator.validate(DOC)
  assert.equal(result.valid, true, JSON.stringify(result.errors, null, 2))
  assert.equal(validator.version, '3.1')
})

test('finds what the document does not allow: a wrong body, status, header or method', () => {
  const headers = new Headers({
    'content-type': 'application/json',
    'x-content-type-options': 'nosniff',
    'cache-control': 'no-store',
  })
  const ajv = documentAjv()
  const calls = [
    { method: 'GET', path: '/feed', status: 200, headers, body: '{"posts":[]}' },
    { method: 'GET', path: '/feed', status: 200, headers, body: '{"post":[]}' },
    { method: 'GET', path: '/posts/1', status: 418, headers, body: '{"error":"teapot"}' },
    {
      method: 'GET',
      path: '/feed',
      status: 200,
      headers: new Headers({ 'content-type': 'text/plain' }),
      body: '{"posts":[]}',
    },
    { method: 'PUT', path: '/posts', status: 404, headers, body: '{"error":"not found"}' },
  ]
  assert.deepEqual(
    calls.map((exchange) => disallowed(ajv, exchange).length > 0),
    [false, true, true, true, true],
  )
})

function documentAjv() {
  const ajv = new Ajv2020({ strict: false, allErrors: true })
  ajv.addSchema({ ...DOC, $id: ID })
  return ajv
}

// What one request got, as the contract's tests made it.
type Exchange = { method: string; path: string; status: number; headers: Headers; body: string }

describe('every response of the contract, as openapi.json describes it', () => {
  const db = freshSeededCopy()
  const seen: Exchange[] = []
  const realFetch = globalThis.fetch
  let server: Server

  before(async () => {
    server = await startServer(process.execPath, ['dist/app.js'], { env: { SQLITE_PATH: db.path } })
    globalThis.fetch = async (input, init) => {
      const response = await realFetch(input, init)
      const url = new URL(String(input))
      const body = await response.clone().text()
      seen.push({
        method: init?.method ?? 'GET',
        path: url.pathname,
        status: response.status,
        headers: response.headers,
        body,
      })
      return response
    }
  })
  after(async () => {
    globalThis.fetch = realFetch
    await within(server.stop(), 15_000, 'the server to exit on SIGTERM')
    db.remove()
  })

  contractTests(() => ({ url: server.url, tokens: db.tokens }))

  test('each one is a status, headers and body the document allows', () => {
    assert.ok(seen.length > 50, `${seen.length} responses seen`)
    const ajv = documentAjv()
    const wrong = seen.flatMap((exchange) =>
      disallowed(ajv, exchange).map((why) => `${exchange.method} ${exchange.path} ${exchange.status}: ${why}`),
    )
    assert.deepEqual(wrong, [])
  })
})

// Why the document does not allow the exchange: none when it does.
function disallowed(ajv: Ajv2020, { method, path, status, headers, body }: Exchange): string[] {
  const why: string[] = []
  if (!/^application\/json/.test(headers.get('content-type') ?? '')) why.push('not application/json')
  if (headers.get('x-content-type-options') !== 'nosniff') why.push('no nosniff')
  if (headers.get('cache-control') !== 'no-store') why.push('no no-store')
  const template = Object.keys(DOC.paths).find((t) => new RegExp(`^${t.replace(/\{[^}]+\}/g, '[^/]+')}$`).test(path))
  const check = (pointer: string) => {
    const valid = ajv.validate({ $ref: `${ID}#${pointer}` }, JSON.parse(body))
    if (!valid) why.push(ajv.errorsText())
  }
  if (!template) {
    if (status !== 404) why.push('a path the document lacks, answered other than 404')
    check('/components/schemas/Error')
    return why
  }
  const operation: Operation | undefined = DOC.paths[template][method.toLowerCase()]
  if (!operation) {
    if (status !== 405 || !headers.get('allow'))
      why.push('a method the document lacks, answered other than 405 with Allow')
    check('/components/schemas/Error')
    return why
  }
  if (!operation.responses[status]) return [...why, `status ${status} not in the document`]
  const escaped = template.replaceAll('~', '~0').replaceAll('/', '~1')
  let pointer = `/paths/${escaped}/${method.toLowerCase()}/responses/${status}`
  const ref = operation.responses[status].$ref
  if (ref) pointer = ref.slice(1)
  check(`${pointer}/content/application~1json/schema`)
  return why
}
