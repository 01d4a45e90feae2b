// The object store the replication tests and the benchmark's cluster run over (harness/s3rver.ts) shows
// an object as S3 does: not at all until its PUT is done, then whole.
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, test } from 'node:test'
import { startS3rver } from '../harness/s3.ts'

const folder = mkdtempSync(join(tmpdir(), 's3rver-'))
let s3: Awaited<ReturnType<typeof startS3rver>>
let bucket = ''
before(async () => {
  s3 = await startS3rver(0, folder)
  bucket = `${s3.env.AWS_ENDPOINT_URL_S3}/feed/`
})
after(async () => {
  await s3.stop()
  rmSync(folder, { recursive: true, force: true })
})

// Each request has 10 s: s3rver answers these in milliseconds.
const request = (url: string, init: RequestInit = {}) => fetch(url, { ...init, signal: AbortSignal.timeout(10_000) })

// Every object's size, as a list shows them.
async function listed() {
  const xml = await (await request(`${bucket}?list-type=2`)).text()
  return [...xml.matchAll(/<Key>([^<]+)<\/Key>.*?<Size>(\d+)<\/Size>/gs)].map(([, key, size]) => [key, Number(size)])
}

test('an object is listed only whole, while its PUT is written, and read whole once it is answered', async () => {
  // 4 MiB takes s3rver several writes, so lists sent meanwhile would see it part-written.
  const body = Buffer.alloc(4 << 20, 7)
  const seen: (string | number)[][] = []
  for (let i = 0; i < 10; i++) {
    let putting = true
    const lists = (async () => {
      while (putting) seen.push(...(await listed()))
    })()
    const put = await request(`${bucket}object-${i}`, { method: 'PUT', body })
    putting = false
    await lists
    assert.equal(put.status, 200)
    assert.equal((await (await request(`${bucket}object-${i}`)).arrayBuffer()).byteLength, body.length)
  }
  assert.ok(seen.length > 0, 'no list named an object')
  assert.deepEqual(
    seen.filter(([, size]) => size !== body.length),
    [],
  )
})

test('a multipart upload is read whole once its completion is answered', async () => {
  // Every part but the last is at least 5 MiB, as S3 asks.
  const parts = [Buffer.alloc(5 << 20, 1), Buffer.alloc(1 << 20, 2)]
  const object = `${bucket}multipart`
  const started = await (await request(`${object}?uploads`, { method: 'POST' })).text()
  const uploadId = /<UploadId>([^<]+)<\/UploadId>/.exec(started)?.[1]
  assert.ok(uploadId, started)
  let completion = '<CompleteMultipartUpload>'
  for (const [i, part] of parts.entries()) {
    const put = await request(`${object}?partNumber=${i + 1}&uploadId=${uploadId}`, { method: 'PUT', body: part })
    assert.equal(put.status, 200)
    completion += `<Part><PartNumber>${i + 1}</PartNumber><ETag>${put.headers.get('etag')}</ETag></Part>`
  }
  completion += '</CompleteMultipartUpload>'
  const completed = await request(`${object}?uploadId=${uploadId}`, { method: 'POST', body: completion })
  assert.equal(completed.status, 200, await completed.text())
  assert.deepEqual(Buffer.from(await (await request(object)).arrayBuffer()), Buffer.concat(parts))
})
