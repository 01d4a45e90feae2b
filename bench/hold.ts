// The users hold, which the comparison (npm run bench) and the score (--score) both run: N users, each a
// keep-alive connection running the k6 loop from its arrival (bench/users.ts), arriving evenly over the
// ramp and then held. Past PER_GENERATOR users several generators share them, each to its own loopback
// address of the server (127.0.0.1, .2, ...; binding the clients instead makes the kernel's search for a
// free port slower with every connection), so the server listens on 0.0.0.0 then.
import { existsSync, readFileSync, rmSync } from 'node:fs'
import { join } from 'node:path'
import { CACHE } from '../harness/seed.ts'
import { within } from '../harness/time.ts'
import { usersGenerator } from './lib.ts'

export const USER_RATE = 0.106 // requests a second per user, the k6 loop's average
// Users per generator: one client address may open about 28,000 connections to one server address and
// port, and one process of ours holds about 19,900.
export const PER_GENERATOR = 18_000

export const generatorsFor = (users: number) => Math.ceil(users / PER_GENERATOR)

// What every generator said once its users had arrived, summed.
export type Arrival = { open: number; failedToConnect: number; failure?: Error }

// The hold, over every generator: its counts summed, its latencies (ms) sorted together, its errors
// (bad statuses and bodies, closed connections, failed connects, unanswered requests, and the users
// who never connected) summed; failure is a generator that died, whose figures are missing here.
export type Tally = {
  sent: number
  answered: number
  unanswered: number
  errors: number
  seconds: number
  // Each generator's share of its core over the hold.
  generatorCpu: number[]
  latencies: number[]
  example?: string
  failure?: Error
}

type Generator = ReturnType<typeof usersGenerator> & { latencies: string }
type Event = Record<string, any>

// The hold's deadlines, when the caller wants a hung generator to fail it: for the users to arrive
// (from the start), and for the hold to end (from their arrival); name says whose users they are.
type Deadlines = { arriveMs: number; doneMs: number; name: string }

type Users = { url: string; users: number; tokens: string; ramp: number; hold: number; deadlines?: Deadlines }

// Starts the users against the server (its url on 127.0.0.1) now; arrived() once every user has had its
// first answer, done() once the hold is over; stop() ends the generators and removes their files.
export function startUsers(o: Users) {
  const count = generatorsFor(o.users)
  const generators: Generator[] = Array.from({ length: count }, (_, i) => {
    const share = Math.floor(o.users / count) + (i < o.users % count ? 1 : 0)
    const url = o.url.replace('127.0.0.1', `127.0.0.${1 + i}`)
    const latencies = join(CACHE, `users-latencies-${process.pid}-${i}.json`)
    const { tokens, hold, ramp } = o
    const generator = usersGenerator({
      url,
      connections: share,
      tokens,
      latencies,
      idle: 0,
      hold,
      ramp,
      loopOnArrival: true,
    })
    return { latencies, ...generator }
  })
  // Each generator's event, or the error it died with.
  const each = (event: string, ms: number | undefined, what: string) => {
    const all = Promise.all(generators.map((g) => g.next(event).catch((error: Error) => ({ error }))))
    return ms === undefined ? all : within(all, ms, what)
  }
  let failedToConnect = 0
  return {
    arrived: async (): Promise<Arrival> => {
      const connected = await each('connected', o.deadlines?.arriveMs, `the users of ${o.deadlines?.name} arriving`)
      const open = sum(connected, (c) => c.connections)
      failedToConnect = sum(connected, (c) => c.failed)
      return { open, failedToConnect, failure: failureOf(connected) }
    },
    done: async (): Promise<Tally> => {
      const done = await each('done', o.deadlines?.doneMs, `the hold of ${o.deadlines?.name}`)
      return tally(done, generators, failedToConnect)
    },
    stop: () => {
      for (const g of generators) {
        g.kill()
        rmSync(g.latencies, { force: true })
      }
    },
  }
}

type Settled = (Event | { error: Error })[]
const succeeded = (events: Settled) => events.filter((e): e is Event => !('error' in e))
const sum = (events: Settled, of: (e: Event) => number) => succeeded(events).reduce((total, e) => total + of(e), 0)
const failureOf = (events: Settled) => events.find((e): e is { error: Error } => 'error' in e)?.error

// The errors one generator counted: its users' and its requests never answered.
const errorsOf = ({ errors, unanswered }: Event) =>
  errors.status + errors.body + errors.closed + errors.connect + unanswered

function tally(results: Settled, generators: Generator[], failedToConnect: number): Tally {
  const done = succeeded(results)
  // Percentiles over every request of every generator, not averages of theirs.
  const latencies = generators
    .flatMap((g) => (existsSync(g.latencies) ? (JSON.parse(readFileSync(g.latencies, 'utf8')) as number[]) : []))
    .sort((a, b) => a - b)
  return {
    sent: sum(results, (r) => r.sent),
    answered: sum(results, (r) => r.answered),
    unanswered: sum(results, (r) => r.unanswered),
    errors: sum(results, errorsOf) + failedToConnect,
    seconds: Math.max(...done.map((r) => r.seconds)),
    generatorCpu: done.map((r) => r.generator_cpu),
    latencies,
    example: done.map((r) => r.errors.example).find(Boolean),
    failure: failureOf(results),
  }
}
