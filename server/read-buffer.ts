// Reads into one buffer: net.Socket's `onread` option, which node:net offers for a socket it makes
// (net.connect, new Socket) and not for one a server accepts. Set on an accepted socket as the option
// sets it, every read of every connection lands in the same 64 KB and is handed to a function, with
// no Buffer of its own and no stream's push and 'data' event: 7 to 9% of a request's instructions,
// ours and the floors' (BENCHMARKS.md, "One read buffer"). What the function keeps of a read past its
// return it must copy.
import { Socket } from 'node:net'

const READ_BUFFER = Buffer.allocUnsafe(64 * 1024)

// The fields the option sets, as a socket made with it has them; none where a Node names them otherwise.
const probe = new Socket({ onread: { buffer: Buffer.alloc(1), callback: () => true } })
const [kBuffer, kBufferCb] = ['kBuffer', 'kBufferCb'].map((name) =>
  Object.getOwnPropertySymbols(probe).find((symbol) => symbol.description === name),
)
probe.destroy()

type Handle = { useUserBuffer?: (buffer: Uint8Array) => void }

// Whether the socket now reads into the buffer: false where this Node lacks what it takes, and then its
// reads come as 'data'. onRead is called with the socket as `this`, as a 'data' listener is.
export function readIntoOneBuffer(socket: Socket, onRead: (this: Socket, length: number, read: Buffer) => void) {
  const handle = (socket as unknown as { _handle?: Handle })._handle
  const fields = socket as unknown as Record<symbol, unknown>
  if (!kBuffer || !kBufferCb || typeof handle?.useUserBuffer !== 'function' || fields[kBuffer] !== null) return false
  fields[kBuffer] = READ_BUFFER
  fields[kBufferCb] = onRead
  handle.useUserBuffer(READ_BUFFER)
  return true
}
