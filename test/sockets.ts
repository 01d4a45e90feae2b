// A test's sockets and what the kernel says of a server's (/proc/net/tcp), for a test that must know a
// server has done something before it goes on: read what a client sent, closed its listener, let its
// connections go. Linux only; sockets of another network namespace (a container's) are not here.
import { readFileSync } from 'node:fs'
import type { Socket } from 'node:net'

type TcpSocket = { localPort: number; remotePort: number; state: string; unread: number }

const ESTABLISHED = '01'
const CLOSE_WAIT = '08' // the client closed its end; the server has not yet
const LISTEN = '0A'

function tcpSockets(): TcpSocket[] {
  return readFileSync('/proc/net/tcp', 'utf8')
    .trim()
    .split('\n')
    .slice(1)
    .map((line) => {
      const [, local, remote, state, queues] = line.trim().split(/\s+/)
      const port = (address: string) => parseInt(address.split(':')[1], 16)
      return { localPort: port(local), remotePort: port(remote), state, unread: parseInt(queues.split(':')[1], 16) }
    })
}

// Whether anything listens on the port.
export const listensOn = (port: number) => tcpSockets().some((s) => s.localPort === port && s.state === LISTEN)

// How many connections to the port the server still holds: open, or closed by the client only.
export const heldOn = (port: number) =>
  tcpSockets().filter((s) => s.localPort === port && (s.state === ESTABLISHED || s.state === CLOSE_WAIT)).length

// Whether the server at the other end of a connected socket has taken in all the client wrote: nothing
// waits in the client's buffer, and the server's end of the connection holds no byte unread. A Node
// server parses what it reads in the same turn of its loop, so its next turn (a signal's handler, say)
// finds it parsed.
export function serverHasRead(socket: Socket): boolean {
  const end = tcpSockets().find((s) => s.localPort === socket.remotePort && s.remotePort === socket.localPort)
  return socket.writableLength === 0 && end !== undefined && end.unread === 0
}

// Whether the server at the other end of a connected socket has closed its end: its FIN sent (past
// ESTABLISHED and CLOSE_WAIT), or the connection gone. For a client that does not read, and so cannot see it.
export function serverClosed(socket: Socket): boolean {
  const end = tcpSockets().find((s) => s.localPort === socket.remotePort && s.remotePort === socket.localPort)
  return end === undefined || (end.state !== ESTABLISHED && end.state !== CLOSE_WAIT)
}

// What comes on the socket until the server closes it.
export async function readToEnd(socket: Socket): Promise<string> {
  let received = ''
  for await (const chunk of socket) received += chunk
  return received
}
