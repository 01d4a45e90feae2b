// s3rver's process (started by s3.ts): one bucket (feed) in a folder, on a port; prints the port it got.
// Usage: node harness/s3rver.ts <folder> <port>
import { createHash } from 'node:crypto'
import { createWriteStream } from 'node:fs'
import { mkdir, rename, writeFile } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
// @ts-expect-error: s3rver ships no types.
import S3rver from 's3rver'
// @ts-expect-error: s3rver ships no types.
import FilesystemStore from 's3rver/lib/stores/filesystem.js'

// s3rver answers a PUT before the object's file is written, and writes it in place, so a list or a read
// meanwhile sees part of an object, which S3 never shows: a following Litestream once failed on one
// (`decode header: unexpected EOF`). Each object is written aside, whole, then renamed into place; so is
// each part of a multipart upload, which its completion reads.
let written = 0
async function writeAside(path: string, content: Buffer | Readable) {
  const aside = `${path}.${process.pid}-${++written}.partial`
  await mkdir(dirname(path), { recursive: true })
  const md5 = createHash('md5')
  let size = 0
  await pipeline(
    Buffer.isBuffer(content) ? Readable.from([content]) : content,
    async function* (chunks: AsyncIterable<Buffer>) {
      for await (const chunk of chunks) {
        md5.update(chunk)
        size += chunk.length
        yield chunk
      }
    },
    createWriteStream(aside),
  )
  return { aside, size, md5: md5.digest('hex') }
}

type S3Object = { bucket: string; key: string; content: Buffer | Readable; metadata: object }
FilesystemStore.prototype.putObject = async function (object: S3Object) {
  const path: string = this.getResourcePath(object.bucket, object.key, 'object')
  const { aside, size, md5 } = await writeAside(path, object.content)
  await this.putMetadata(object.bucket, object.key, object.metadata, md5)
  await rename(aside, path)
  return { size, md5 }
}

FilesystemStore.prototype.putPart = async function (bucket: string, uploadId: string, part: number, content: Readable) {
  const path = join(this.getResourcePath(bucket, undefined, 'uploads'), uploadId, String(part))
  const { aside, size, md5 } = await writeAside(path, content)
  await rename(aside, path)
  await writeFile(`${path}.md5`, md5)
  return { size, md5 }
}

const [directory, port] = process.argv.slice(2)
const server = new S3rver({
  address: '127.0.0.1',
  port: Number(port),
  silent: true,
  directory,
  configureBuckets: [{ name: 'feed' }],
})
const { port: bound } = await server.run()
console.log(bound)
