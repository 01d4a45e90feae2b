// Stand-in for k6's `k6/http`: synchronous requests, like k6's, made by a child Node process.
import { spawnSync } from 'node:child_process'

export const requests = []

const FETCH = `
  const { method, url, body, headers } = JSON.parse(require('node:fs').readFileSync(0, 'utf8'))
  fetch(url, { method, body, headers }).then(async (r) => console.log(JSON.stringify({ status: r.status, body: await r.text() })))`

function request(method, url, body, params = {}) {
  const run = spawnSync(process.execPath, ['-e', FETCH], {
    input: JSON.stringify({ method, url, body: body ?? undefined, headers: params.headers }),
    encoding: 'utf8',
  })
  const { status, body: text } = JSON.parse(run.stdout)
  requests.push({ method, url, status, name: params.tags?.name, headers: params.headers ?? {} })
  return {
    status,
    body: text,
    // k6 takes a gjson path; the scenario uses plain dotted paths only.
    json: (path) => (path ? path.split('.').reduce((value, key) => value?.[key], JSON.parse(text)) : JSON.parse(text)),
  }
}

export default {
  get: (url, params) => request('GET', url, null, params),
  post: (url, body, params) => request('POST', url, body, params),
}
