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
