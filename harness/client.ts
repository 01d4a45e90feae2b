// A client that speaks bytes: one request on a connection of its own, and what came back, for the tests
// of the server and of the benchmark's floors alike.
import { connect } from 'node:net'

export type Answer = { status?: number; headers: Record<string, string>; body: string; bodyBytes: number; raw: string }

// One request, as bytes, on a connection of its own: whatever comes back before the server closes it
// (or timeoutMs pass), with the first answer's head parsed. A whole response with a Content-Length is enough.
export function exchange(
  port: number,
  bytes: Buffer | string,
  { halfClose = false, timeoutMs = 5_000 } = {},
): Promise<Answer> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    const chunks: Buffer[] = []
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      const received = Buffer.concat(chunks)
      const end = received.indexOf('\r\n\r\n')
      const head = received.subarray(0, end < 0 ? received.length : end).toString('utf8')
      // The first answer's body: what its Content-Length says, where it says one (another answer may follow).
      const length = /\r\ncontent-length: *(\d+)/i.exec(head)?.[1]
      const body =
        end < 0
          ? Buffer.alloc(0)
          : received.subarray(end + 4, length === undefined ? undefined : end + 4 + Number(length))
      const status = /^HTTP\/1\.1 (\d{3}) /.exec(head)?.[1]
      const headers = Object.fromEntries(
        head
          .split('\r\n')
          .slice(1)
          .map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
      )
      resolve({
        status: status ? Number(status) : undefined,
        headers,
        body: body.toString('utf8'),
        bodyBytes: body.length,
        raw: received.toString('utf8'),
      })
    }
    const timer = setTimeout(done, timeoutMs)
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      const received = Buffer.concat(chunks)
      const end = received.indexOf('\r\n\r\n')
      const length = /\r\ncontent-length: *(\d+)/i.exec(received.toString('latin1'))?.[1]
      if (end >= 0 && length !== undefined && received.length >= end + 4 + Number(length)) done()
    })
    socket.on('close', done)
    socket.on('error', () => {})
    socket.write(bytes, () => halfClose && socket.end())
  })
}

// A head, then `length` bytes of x after it (a body, or more of the head), written 64 KB at a time,
// each piece once the kernel took the last, as curl and k6 send a large body, and read meanwhile: the
// answer's status line, and the error the connection met first (a reset, a write after it), if any.
export function sendStreaming(
  port: number,
  head: string,
  length: number,
  { timeoutMs = 5_000 } = {},
): Promise<{ statusLine: string; error?: string }> {
  return new Promise((resolve) => {
    // Half open: the server's FIN after its answer does not end what this side still writes.
    const socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true })
    let received = ''
    let error: string | undefined
    const done = () => {
      clearTimeout(timer)
      socket.destroy()
      resolve({ statusLine: received.split('\r\n')[0], error })
    }
    const timer = setTimeout(() => ((error ??= 'timeout'), done()), timeoutMs)
    const piece = Buffer.alloc(64 * 1024, 'x')
    let left = length
    let serverEnded = false
    // Closed once all of it is written and the server has closed its side.
    const endIfDone = () => left === 0 && serverEnded && socket.end()
    const pump = () => {
      while (left > 0 && !socket.destroyed) {
        const next = piece.subarray(0, Math.min(left, piece.length))
        left -= next.length
        if (!socket.write(next)) return void socket.once('drain', pump)
      }
      endIfDone()
    }
    socket.on('connect', () => (socket.write(head), pump()))
    socket.on('data', (chunk: Buffer) => (received += chunk.toString('latin1')))
    socket.on('error', (e: NodeJS.ErrnoException) => (error ??= e.code ?? e.message))
    socket.on('close', done)
    socket.on('end', () => ((serverEnded = true), endIfDone()))
  })
}
