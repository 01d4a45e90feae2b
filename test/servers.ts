// One suite for both HTTP servers dist/app.js can run (README, HTTP_SERVER): ours on node:net ('net') and
// @hono/node-server on node:http ('node-server'). A file's cases are written once, in a function of the
// server, and run once for each, as Hono's router tests run one case list against every router; where a
// server differs on purpose, or has a known bug, the case is skipped on it by name, with the reason,
// which node:test prints beside the skip (as test/differential.test.ts lists its deliberate differences).
//
//   forEachServer('the contract', (server) => {
//     before(async () => (target = await startServer(node, ['dist/app.js'], { env: { HTTP_SERVER: server } })))
//     test('…', async () => { … }) // `test` from this module, so that a difference can name it
//   }, { differences: [{ server: 'node-server', test: '…', reason: 'node:http …' }] })
//
// A run with HTTP_SERVER set (`HTTP_SERVER=node-server npm test`) runs each such suite on that server
// alone: the other's is one skipped test that says so.
import assert from 'node:assert/strict'
import { describe, test as nodeTest, type TestContext, type TestOptions } from 'node:test'

export const HTTP_SERVERS = ['net', 'node-server'] as const
export type HttpServer = (typeof HTTP_SERVERS)[number]

// A case one server does not run, and why: a deliberate difference ("node:http …", "ours …"), or a bug
// of that server not yet fixed ("known: …", so that the suite stays green and the bug stays listed).
// `test` is a case's own name, as given to test(): every case of that name in the suite is skipped.
export type Difference = { server: HttpServer; test: string; reason: string }

// The server whose suite is being declared, and its differences not yet met: test() reads it while
// describe() runs the suite's function, which node:test does at once, before describe() returns.
let lane: { server: HttpServer; differences: Difference[]; met: Set<Difference> } | undefined

// Runs `suite` once for each server, each in a describe of its own named `${name} (HTTP_SERVER=…)`; the
// suite starts its own servers (with env HTTP_SERVER set to the one it is given) and stops them. A
// difference that names no case of the suite is a failure: a skip is not left standing for a case
// renamed or removed.
export function forEachServer(
  name: string,
  suite: (server: HttpServer) => void,
  { differences = [], only = HTTP_SERVERS }: { differences?: Difference[]; only?: readonly HttpServer[] } = {},
) {
  const chosen = process.env.HTTP_SERVER
  for (const server of HTTP_SERVERS) {
    const title = `${name} (HTTP_SERVER=${server})`
    if (!only.includes(server)) continue
    if (chosen && chosen !== server) {
      nodeTest(title, { skip: `this run is for HTTP_SERVER=${chosen} alone` })
      continue
    }
    const own = differences.filter((d) => d.server === server)
    describe(title, () => {
      const outer = lane
      lane = { server, differences: own, met: new Set() }
      try {
        suite(server)
      } finally {
        const unmet = own.filter((d) => !lane!.met.has(d))
        lane = outer
        for (const d of unmet)
          nodeTest(`the difference on ${server} names a case of the suite: "${d.test}"`, () =>
            assert.fail(`no case named "${d.test}" in "${title}"; its reason: ${d.reason}`),
          )
      }
    })
  }
}

type Fn = (t: TestContext) => void | Promise<void>

// node:test's test(), which inside forEachServer skips a case its server's differences name, with
// their reason. Outside one it is node:test's own.
export function test(name: string, fn: Fn): Promise<void>
export function test(name: string, options: TestOptions, fn?: Fn): Promise<void>
export function test(name: string, optionsOrFn: TestOptions | Fn, maybeFn?: Fn): Promise<void> {
  const [options, fn] = typeof optionsOrFn === 'function' ? [{}, optionsOrFn] : [optionsOrFn, maybeFn]
  const difference = lane?.differences.find((d) => d.test === name)
  if (difference) lane!.met.add(difference)
  return nodeTest(name, difference ? { ...options, skip: `${lane!.server}: ${difference.reason}` } : options, fn)
}
