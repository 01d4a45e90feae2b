// What the first process and its helpers agree on (server/first-process.ts, server/helper.ts): how a
// helper knows it is one, where it finds its copy of the listening socket, and every message between
// them. Each side hears the other in one place.
import type { ChildProcess } from 'node:child_process'
import type { Server } from 'node:net'

// Set in a helper's environment by the first process, which started it: the first's pid.
export const HELPER_OF = 'HELPER_OF'
export const isHelper = process.env[HELPER_OF] !== undefined
// Where a helper has its copy of the listening socket: after stdin, stdout, stderr and the IPC channel.
export const SOCKET_FD = 4

export type Message =
  | { kind: 'ready' } // helper: started; it takes new connections once told to
  | { kind: 'accept' } // first: take new connections, from your copy of the socket
  | { kind: 'nearly full' } // helper: start my successor (said too as soon as it accepts)
  | { kind: 'copy' } // first: send me the socket you accept from; helper: here it is, as the handle
  | { kind: 'successor' } // first: your successor holds its copy; once full, stop at once
  | { kind: 'full' } // helper: the next may take new connections
  | { kind: 'stop' } // first: stop accepting, the next takes new connections
// What a helper tells the first process, and what the first orders a helper.
export type Report = Extract<Message, { kind: 'ready' | 'nearly full' | 'copy' | 'full' }>
export type Order = Extract<Message, { kind: 'accept' | 'copy' | 'successor' | 'stop' }>

export const order = (helper: ChildProcess, order: Order) => helper.send(order)

// In a helper. `socket`: with a 'copy', the server it accepts from, if it still does.
export const report = (report: Report, socket?: Server) => process.send!(report, socket)
