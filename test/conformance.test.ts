// server/http1.ts against a corpus nobody here wrote: llhttp's own request tests (test/request/*.md
// in llhttp's repository, MIT), read at run time from $LLHTTP_TESTS or ../shared/corpora/llhttp, never
// copied here. Each case's bytes go, as llhttp's runner makes them, to three echo servers
// (test/echo-server.ts): llhttp as Node runs it (the judge: non-lenient, whatever the case's type),
// @hono/node-server on node:http, and ours. Ours must refuse whatever llhttp refuses, request by
// request (earlier, never later); what llhttp accepts, ours must parse the same or refuse for one of
// DELIBERATE's reasons; and no case may bring a server down. A head llhttp refuses at its first wrong
// byte ours may still be reading when the case's bytes end, if server/http1.ts refuses it once it ends:
// it is never taken, and its client gets that refusal or a 408.
//
// Read against llhttp 9.4.2 (commit 01e105a, `git log -1 --oneline` in its repository): 166 cases, all
// of request types. As they are, 176 requests: llhttp refused 92, ours refused 88 of them and was still
// reading the head of the other 4; both waited for more of 3; ours refused 6 that llhttp waited for;
// 19 both took and parsed the same; 56 llhttp took ours refused, each for a reason in DELIBERATE (47
// without Host). With Host added, 91 requests: llhttp refused 27 (ours all 27), 48 parsed the same, 1
// HEAD with no echo, 5 refused deliberately. No difference outside DELIBERATE.
import assert from 'node:assert/strict'
import { connect } from 'node:net'
import { after, before, describe, test, type TestContext } from 'node:test'
import { exchange } from '../harness/client.ts'
import { type Server, startServer } from '../harness/server.ts'
import { holdsWithin } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { MAX_BODY_BYTES } from '../app.ts'
import { RequestReader } from '../server/reader.ts'
import { describeNeeding } from './helpers.ts'
import { corpusRoot, logVerdict, readCases, requestFiles, type CorpusCase } from './llhttp-corpus.ts'

// Refusals of what llhttp (as Node runs it) takes that are ours on purpose, each backed by an RFC.
const DELIBERATE: Record<string, string> = {
  'an HTTP/1.1 request without Host': 'RFC 9112, 3.2: a server MUST answer 400 to an HTTP/1.1 request that lacks Host.',
  'a request line that is not method SP target SP HTTP/1.x':
    'RFC 9112, 3 and 2.3: the line ends in HTTP-version, named "HTTP"; RTSP/1.0, ICE/1.0 and HTTP/0.9 without a version are not HTTP/1.1.',
  'a request target of characters RFC 3986 does not allow':
    "RFC 9112, 3.2.1 and RFC 3986, 3.3 and 3.4: a path and query have no '\"', and no '#': a fragment is never sent.",
  'userinfo in an absolute-form target':
    'RFC 9110, 4.2.4: a recipient SHOULD treat userinfo in an http(s) URI as an error; a fetch Request refuses such a URL too.',
  'a request target in authority-form or asterisk-form':
    "RFC 9112, 3.2.3 and 3.2.4: they name no resource (CONNECT's authority, a server-wide OPTIONS *), and no route here could answer them.",
}

// Cases where ours differs from llhttp for no good reason: bugs in server/http1.ts, reported, run as
// `todo` until fixed. Keyed by file:line (and " with Host" for the variant below).
const KNOWN_BUGS: Record<string, string> = {}

// A wait for answers that may never come: a case's bytes may end inside a request on purpose.
const ANSWER_WAIT_MS = 1_000
// Once every answer the log promises has come, how long to listen for one more.
const QUIET_MS = 150
const CONCURRENT_CASES = 8
// An HTTP/1.1 request without Host is refused by ours (DELIBERATE); each such case runs again with a
// Host field added after the request line, so that the rest of it is compared too.
const ADDED_HOST = 'Host: llhttp.test\r\n'

const root = corpusRoot(ROOT)
const MODES = ['llhttp', 'node-server', 'net'] as const
type Mode = (typeof MODES)[number]

const NO_CORPUS =
  'no llhttp corpus: set LLHTTP_TESTS to a folder holding test/request/*.md of llhttp (or put one at ../shared/corpora/llhttp)'

describeNeeding(
  root ? false : NO_CORPUS,
  "llhttp's request tests: ours refuses what llhttp refuses and parses what it takes the same",
  { timeout: 120_000 },
  () => {
    const servers = {} as Record<Mode, Server>
    const ports = {} as Record<Mode, number>
    const totals = { corpus: newCounts(), withHost: newCounts() }

    before(async () => {
      await Promise.all(
        MODES.map(async (mode) => {
          // The llhttp echo's handler reads a body with `for await`, which throws, unhandled, when the
          // connection closes before the body has all come (after a chunk llhttp refuses, say): warned
          // of here, so that the judge stays up. Ours and @hono/node-server keep Node's default.
          const flags = mode === 'llhttp' ? ['--unhandled-rejections=warn'] : []
          servers[mode] = await startServer(
            process.execPath,
            [...flags, '--experimental-import-text', '--disable-warning=ExperimentalWarning', 'test/echo-server.ts'],
            { env: { HTTP_SERVER: mode } },
          )
          ports[mode] = Number(new URL(servers[mode].url).port)
        }),
      )
    })
    after(() => Promise.all(MODES.map((mode) => servers[mode] && stopWithin(servers[mode], 5_000))))

    for (const file of root ? requestFiles(root) : []) {
      test(file, async (t) => {
        const cases = readCases(root!, file).filter((c) => !/^(response|url)/.test(c.type) && c.meta.skip !== true)
        const counts = { corpus: newCounts(), withHost: newCounts() }
        const failures: string[] = []
        await inBatches(cases, async (c) => {
          for (const run of runsOf(c)) {
            const found = judge(run, await converseAll(ports, run), run.variant ? counts.withHost : counts.corpus)
            if (found.length > 0) await report(t, run, found, failures)
          }
        })
        await stillServing(servers, ports)
        addCounts(totals.corpus, counts.corpus)
        addCounts(totals.withHost, counts.withHost)
        t.diagnostic(`${cases.length} cases; as they are: ${summary(counts.corpus)}`)
        t.diagnostic(`with Host added where an HTTP/1.1 request had none: ${summary(counts.withHost)}`)
        assert.deepEqual(failures, [], failures.join('\n\n'))
      })
    }

    test('all files', (t) => {
      t.diagnostic(`as they are: ${summary(totals.corpus)}`)
      t.diagnostic(`with Host added where an HTTP/1.1 request had none: ${summary(totals.withHost)}`)
    })
  },
)

// A case as sent: the corpus's bytes, or the variant with Host added.
type Run = {
  case: CorpusCase
  label: string
  key: string
  bytes: Buffer
  cuts: number[]
  last: string
  finish: boolean
  variant: boolean
}

function runsOf(c: CorpusCase): Run[] {
  const { ends, last } = logVerdict(c.log)
  const base = { case: c, last, finish: c.type === 'request-finish', variant: false }
  const label = `${c.file}:${c.line} "${c.heading}" [${c.type}]`
  const runs: Run[] = [
    { ...base, label, key: `${c.file}:${c.line}`, bytes: c.bytes, cuts: ends.filter((end) => end < c.bytes.length) },
  ]
  const hostless = hostlessRequestLines(c)
  if (hostless.length === 0) return runs
  const parts: Buffer[] = []
  let from = 0
  for (const at of hostless) (parts.push(c.bytes.subarray(from, at), Buffer.from(ADDED_HOST)), (from = at))
  parts.push(c.bytes.subarray(from))
  const shift = (end: number) => end + ADDED_HOST.length * hostless.filter((at) => at <= end).length
  runs.push({
    ...base,
    variant: true,
    label: `${label} with Host added`,
    key: `${c.file}:${c.line} with Host`,
    bytes: Buffer.concat(parts),
    cuts: runs[0].cuts.map(shift),
  })
  return runs
}

// Where the log shows an HTTP/1.1 request without a Host field: the ends of those request lines.
function hostlessRequestLines(c: CorpusCase): number[] {
  const at: number[] = []
  let lineEnd: number | undefined
  let hasHost = false
  for (const line of c.log) {
    const version = /^off=(\d+) len=\d+ span\[version\]="1\.1"$/.exec(line)
    if (/^off=\d+ message begin/.test(line)) ((lineEnd = undefined), (hasHost = false))
    else if (version) lineEnd = c.bytes.indexOf(10, Number(version[1])) + 1 || undefined
    else if (/^off=\d+ len=\d+ span\[header_field\]="host"$/i.test(line)) hasHost = true
    else if (/^off=\d+ headers complete/.test(line) && lineEnd !== undefined && !hasHost) at.push(lineEnd)
  }
  return at
}

// What came back on one connection: the answers in order, and whether the server closed it.
type Reply = { status: number; close: boolean; body: Buffer }
type Conversation = { replies: Reply[]; closed: boolean }

function converseAll(ports: Record<Mode, number>, run: Run): Promise<Record<Mode, Conversation>> {
  return Promise.all(MODES.map((mode) => converse(ports[mode], run))).then(
    (all) => Object.fromEntries(MODES.map((mode, i) => [mode, all[i]])) as Record<Mode, Conversation>,
  )
}

// Sends a case's bytes, a message at a time where llhttp's log says one ends, each after the answer
// to the one before (or ANSWER_WAIT_MS without one), so that no server's answers can come out of
// order; then waits for the last answers. A request-finish case ends with the client's FIN, as
// llhttp's runner ends it with llhttp_finish().
async function converse(port: number, run: Run): Promise<Conversation> {
  const socket = connect(port, '127.0.0.1')
  let received = Buffer.alloc(0)
  let closed = false
  let lastData = performance.now()
  socket.on('data', (chunk: Buffer) => ((received = Buffer.concat([received, chunk])), (lastData = performance.now())))
  socket
    .on('end', () => (closed = true))
    .on('close', () => (closed = true))
    .on('error', () => (closed = true))
  const replies = () => readReplies(received, closed)
  const segments = [0, ...run.cuts, run.bytes.length]
  for (let i = 0; i + 1 < segments.length && !closed; i++) {
    socket.write(run.bytes.subarray(segments[i], segments[i + 1]))
    if (i + 2 < segments.length) await holdsWithin(() => closed || replies().length > i, ANSWER_WAIT_MS)
  }
  if (run.finish && !closed) socket.end()
  const promised = run.cuts.length + (run.last === 'complete' ? 1 : 0)
  await holdsWithin(
    () =>
      closed || (run.last === 'complete' && replies().length >= promised && performance.now() - lastData > QUIET_MS),
    ANSWER_WAIT_MS,
  )
  socket.destroy()
  return { replies: readReplies(received, true), closed }
}

// The whole answers in what a server sent, interim (1xx) ones left out. An answer to HEAD has a
// Content-Length and no body: an echo's body starts with "{", so a head followed by another answer, or
// by nothing once the connection is done, has none.
function readReplies(bytes: Buffer, done: boolean): Reply[] {
  const replies: Reply[] = []
  for (let at = 0; at < bytes.length;) {
    const end = bytes.indexOf('\r\n\r\n', at)
    if (end < 0) break
    const head = bytes.toString('latin1', at, end)
    const status = Number(/^HTTP\/1\.[01] (\d{3}) /.exec(head)?.[1] ?? 0)
    const field = (name: string) => new RegExp(`\\r\\n${name}:[ \\t]*([^\\r]*)`, 'i').exec(head)?.[1]
    at = end + 4
    if (status >= 100 && status < 200) continue
    const close = /close/i.test(field('connection') ?? '')
    const length = field('content-length')
    const bodyless = bytes.subarray(at, at + 7).toString('latin1') === 'HTTP/1.' || (done && at === bytes.length)
    if (/chunked/i.test(field('transfer-encoding') ?? '')) {
      const body = dechunk(bytes, at)
      if (!body) break
      ;(replies.push({ status, close, body: body.body }), (at = body.end))
    } else if (length !== undefined) {
      const size = bodyless ? 0 : Number(length)
      if (bytes.length - at < size) break
      ;(replies.push({ status, close, body: bytes.subarray(at, at + size) }), (at += size))
    } else if (done) (replies.push({ status, close, body: bytes.subarray(at) }), (at = bytes.length))
    else break
  }
  return replies
}

function dechunk(bytes: Buffer, at: number): { body: Buffer; end: number } | undefined {
  const parts: Buffer[] = []
  for (;;) {
    const eol = bytes.indexOf('\r\n', at)
    if (eol < 0) return undefined
    const size = parseInt(bytes.toString('latin1', at, eol), 16)
    if (size === 0)
      return bytes.indexOf('\r\n\r\n', eol) < 0
        ? undefined
        : { body: Buffer.concat(parts), end: bytes.indexOf('\r\n\r\n', eol) + 4 }
    if (bytes.length < eol + 2 + size + 2) return undefined
    parts.push(bytes.subarray(eol + 2, eol + 2 + size))
    at = eol + 2 + size + 2
  }
}

// How one request (by its index on the connection) went on one server.
type Echo = { method: string; url: string; headers: [string, string][]; body: string }
type Outcome =
  { kind: 'accepted'; echo?: Echo } | { kind: 'refused'; reply?: Reply } | { kind: 'none'; closed: boolean }

function outcomeOf(conversation: Conversation, i: number): Outcome {
  const reply = conversation.replies[i]
  if (reply === undefined)
    return i === conversation.replies.length && conversation.closed
      ? { kind: 'refused' }
      : { kind: 'none', closed: conversation.closed }
  if (reply.status < 200 || reply.status > 299) return { kind: 'refused', reply }
  try {
    return { kind: 'accepted', echo: JSON.parse(reply.body.toString('utf8')) }
  } catch {
    return { kind: 'accepted' } // an answer to HEAD: no body to read the echo from
  }
}

type Tally =
  | 'runs'
  | 'requests'
  | 'llhttpRefused'
  | 'oursRefusedToo'
  | 'bothWaiting'
  | 'oursRefusedEarly'
  | 'sameParse'
  | 'unreadable'
  | 'deliberate'
  | 'failed'
type Counts = Record<Tally, number> & { reasons: Record<string, number>; stillReading: string[] }
function newCounts(): Counts {
  const zero = {
    runs: 0,
    requests: 0,
    llhttpRefused: 0,
    oursRefusedToo: 0,
    bothWaiting: 0,
    oursRefusedEarly: 0,
    sameParse: 0,
    unreadable: 0,
    deliberate: 0,
    failed: 0,
  }
  return { ...zero, reasons: {}, stillReading: [] }
}

function addCounts(to: Counts, from: Counts) {
  for (const key of Object.keys(from) as (keyof Counts)[])
    if (key !== 'reasons' && key !== 'stillReading') to[key] += from[key]
  to.stillReading.push(...from.stillReading)
  for (const [reason, n] of Object.entries(from.reasons)) to.reasons[reason] = (to.reasons[reason] ?? 0) + n
}

function summary(c: Counts): string {
  const reasons = Object.entries(c.reasons)
    .map(([reason, n]) => `${n}× ${reason}`)
    .join('; ')
  return (
    `${c.runs} runs, ${c.requests} requests: llhttp refused ${c.llhttpRefused}, ours refused ${c.oursRefusedToo} of them ` +
    `and was still reading the head of ${c.stillReading.length} (${c.stillReading.join('; ') || 'none'}); ` +
    `both still waited for the rest of ${c.bothWaiting}, ours refused ${c.oursRefusedEarly} that llhttp still waited for; ` +
    `both accepted and parsed the same ${c.sameParse}, both accepted with no echo to compare (HEAD) ${c.unreadable}; ours refused ${c.deliberate} that llhttp accepted, deliberately (${reasons || 'none'}); ${c.failed} runs with differences`
  )
}

// Every difference between ours and llhttp in one run, request by request.
function judge(run: Run, got: Record<Mode, Conversation>, counts: Counts): string[] {
  counts.runs++
  const found: string[] = []
  const verdicts = oursVerdicts(run.bytes, run.finish)
  const requests = Math.max(got.llhttp.replies.length, got.net.replies.length) + 1
  for (let i = 0; i < requests; i++) {
    const llhttp = outcomeOf(got.llhttp, i)
    const ours = outcomeOf(got.net, i)
    if (llhttp.kind === 'none' && ours.kind === 'none') {
      if (verdicts[i] !== undefined) (counts.requests++, counts.bothWaiting++)
      break
    }
    counts.requests++
    const stillReading = counts.stillReading.length
    const problem = judgeRequest(
      llhttp,
      ours,
      outcomeOf(got['node-server'], i),
      verdicts[i] ?? { reason: 'no request read' },
      counts,
    )
    if (problem) found.push(`request ${i + 1}: ${problem}`)
    if (counts.stillReading.length > stillReading) counts.stillReading[stillReading] = `${run.label}, request ${i + 1}`
    // Past a refusal on either side, what follows on the connection was never read as a request.
    if (llhttp.kind === 'refused' || ours.kind === 'refused') break
  }
  const refusal = got.net.replies.find((reply) => reply.status >= 400)
  if (refusal && (!refusal.close || !got.net.closed))
    found.push(
      `ours refused with a ${refusal.status} but ${refusal.close ? 'left the connection open' : 'without Connection: close'}`,
    )
  if (found.length > 0) counts.failed++
  return found
}

function judgeRequest(
  llhttp: Outcome,
  ours: Outcome,
  nodeServer: Outcome,
  verdict: Verdict,
  counts: Counts,
): string | undefined {
  if (llhttp.kind === 'refused') {
    counts.llhttpRefused++
    if (ours.kind === 'refused') return void counts.oursRefusedToo++
    // Ours reads a head whole before it judges all of it: one llhttp refuses at its first wrong byte
    // ours refuses once it ends, or with a 408 when it never does. Not taken either way.
    if (ours.kind === 'none' && verdict.reason === HEAD_PENDING) {
      counts.stillReading.push('')
      return verdict.refusedOnceWhole
        ? undefined
        : 'llhttp refused it, ours waits for the rest of its head, and server/http1.ts takes that head once it ends'
    }
    if (ours.kind === 'accepted')
      return `llhttp refused it (${told(llhttp)}), ours accepted it: ${JSON.stringify(ours.echo)}`
    return `llhttp refused it (${told(llhttp)}), ours answered nothing within ${ANSWER_WAIT_MS / 1000} s; server/http1.ts says: ${verdict.reason}`
  }
  if (llhttp.kind === 'none') {
    if (ours.kind === 'accepted')
      return `llhttp answered nothing (it waits for more), ours accepted it: ${JSON.stringify(ours.echo)}`
    return void counts.oursRefusedEarly++
  }
  if (ours.kind !== 'accepted') {
    if (!(verdict.reason in DELIBERATE))
      return `llhttp accepted it, ours ${ours.kind === 'refused' ? `refused it (${told(ours)})` : 'answered nothing'}; server/http1.ts says: ${verdict.reason}`
    counts.deliberate++
    counts.reasons[verdict.reason] = (counts.reasons[verdict.reason] ?? 0) + 1
    return undefined
  }
  if (!llhttp.echo || !ours.echo) return llhttp.echo || ours.echo ? 'one echo is missing' : void counts.unreadable++
  const differences = compareEchoes(
    llhttp.echo,
    ours.echo,
    nodeServer.kind === 'accepted' ? nodeServer.echo : undefined,
  )
  if (verdict.body && verdict.body.toString('base64') !== llhttp.echo.body)
    differences.push(`server/http1.ts read the body ${JSON.stringify(verdict.body.toString('latin1'))}`)
  if (differences.length === 0) return void counts.sameParse++
  return `parsed differently: ${differences.join('; ')}`
}

const told = (outcome: Outcome) =>
  outcome.kind === 'refused'
    ? outcome.reply
      ? `${outcome.reply.status} ${outcome.reply.body.toString('latin1')}`
      : 'closed without an answer'
    : outcome.kind

// What ours' echo shows against llhttp's: the method, the body, the URL (against @hono/node-server's,
// which builds it as ours does, or else llhttp's target resolved on its Host) and the header fields
// (against @hono/node-server's, or llhttp's raw ones as fetch Headers would hold them).
function compareEchoes(llhttp: Echo, ours: Echo, nodeServer: Echo | undefined): string[] {
  const differences: string[] = []
  if (ours.method !== llhttp.method) differences.push(`method ${ours.method}, llhttp ${llhttp.method}`)
  // A fetch Request has no body for GET or HEAD: what http1.ts read of one is compared in judgeRequest.
  const body = nodeServer?.body ?? (llhttp.method === 'GET' || llhttp.method === 'HEAD' ? '' : llhttp.body)
  if (ours.body !== body)
    differences.push(
      `body ${JSON.stringify(Buffer.from(ours.body, 'base64').toString('latin1'))}, expected ${JSON.stringify(Buffer.from(body, 'base64').toString('latin1'))}`,
    )
  const url = expectedUrl(llhttp, ours, nodeServer)
  if (url.ours !== url.expected) differences.push(`url ${url.ours}, expected ${url.expected} (${url.from})`)
  const expected = expectedHeaders(llhttp, nodeServer)
  if (typeof expected === 'string') differences.push(expected)
  else if (JSON.stringify(ours.headers) !== JSON.stringify(expected))
    differences.push(`headers ${JSON.stringify(ours.headers)}, expected ${JSON.stringify(expected)}`)
  return differences
}

function expectedUrl(
  llhttp: Echo,
  ours: Echo,
  nodeServer: Echo | undefined,
): { ours: string; expected: string; from: string } {
  if (nodeServer) return { ours: ours.url, expected: nodeServer.url, from: "@hono/node-server's" }
  const host = llhttp.headers.find(([name]) => name.toLowerCase() === 'host')?.[1] ?? 'localhost'
  const pathOf = (url: URL) => url.pathname + url.search
  try {
    return {
      ours: pathOf(new URL(ours.url)),
      expected: pathOf(new URL(llhttp.url, `http://${host}`)),
      from: `llhttp's target ${llhttp.url} on Host ${host}`,
    }
  } catch {
    return { ours: ours.url, expected: `no URL from ${llhttp.url} on Host ${host}`, from: "llhttp's target" }
  }
}

// The fields a fetch handler sees; for a chunked body ours shows its decoded length instead of its
// coding (RFC 9112, 7.1.3), and no Trailer.
function expectedHeaders(llhttp: Echo, nodeServer: Echo | undefined): [string, string][] | string {
  let fields: [string, string][]
  try {
    fields = nodeServer?.headers ?? [...new Headers(llhttp.headers)]
  } catch (error) {
    return `llhttp's fields make no fetch Headers: ${(error as Error).message}`
  }
  if (!fields.some(([name]) => name === 'transfer-encoding')) return fields
  const kept = fields.filter(
    ([name]) => name !== 'transfer-encoding' && name !== 'trailer' && name !== 'content-length',
  )
  const length = Buffer.from(llhttp.body, 'base64').length
  return [...kept, ['content-length', String(length)] as [string, string]].sort(([a], [b]) =>
    a < b ? -1 : a > b ? 1 : 0,
  )
}

// What server/wire.ts makes of the bytes, request by request, by the calls to server/http1.ts it
// makes: the body of each request it accepts, then a refusal's reason, or what it still waits for.
type Verdict = { reason: string; body?: Buffer; refusedOnceWhole?: boolean }
const ACCEPTED = 'accepted'
const HEAD_PENDING = 'the head is not whole yet'
const BODY_PENDING = 'the body is not whole yet'
const FIN_INSIDE = 'the client ended the connection inside a request'

function oursVerdicts(bytes: Buffer, finish: boolean): Verdict[] {
  const verdicts: Verdict[] = []
  const unfinished = (pending: string) => [...verdicts, { reason: finish ? FIN_INSIDE : pending }]
  const reader = new RequestReader(MAX_BODY_BYTES)
  reader.push(bytes) // kept as it is: the reader's offsets are the bytes' own
  while (reader.bytes !== undefined) {
    if (reader.head === undefined) {
      const head = reader.readHead()
      if (head === undefined)
        return [
          ...verdicts,
          { reason: finish ? FIN_INSIDE : HEAD_PENDING, refusedOnceWhole: refusedOnceWhole(bytes, reader.start) },
        ]
      if ('status' in head) return [...verdicts, { reason: head.reason }]
      if (head.bodyLength > MAX_BODY_BYTES) return [...verdicts, { reason: 'a body over the limit' }]
    }
    const request = reader.readBody()
    if (request === undefined) return unfinished(BODY_PENDING)
    if ('status' in request) return [...verdicts, { reason: request.reason }]
    verdicts.push({ reason: ACCEPTED, body: request.body ?? Buffer.alloc(0) })
    if (!request.head.keepAlive) break
  }
  return verdicts
}

// Whether http1.ts refuses a head not whole yet once a blank line ends it: so that a head llhttp
// refused at its first wrong byte is never taken by ours, however the client goes on.
function refusedOnceWhole(bytes: Buffer, start: number): boolean {
  const reader = new RequestReader(MAX_BODY_BYTES)
  reader.push(Buffer.concat([bytes.subarray(start), Buffer.from('\r\n\r\n')]))
  const head = reader.readHead()
  return head !== undefined && 'status' in head
}

async function report(t: TestContext, run: Run, found: string[], failures: string[]) {
  const text = `${run.label}\n  bytes: ${JSON.stringify(run.bytes.toString('latin1'))}\n  ${found.join('\n  ')}`
  if (run.key in KNOWN_BUGS) await t.test(run.label, { todo: KNOWN_BUGS[run.key] }, () => assert.fail(text))
  else failures.push(text)
}

async function inBatches<T>(items: T[], work: (item: T) => Promise<void>) {
  let next = 0
  const worker = async () => {
    while (next < items.length) await work(items[next++])
  }
  await Promise.all(Array.from({ length: CONCURRENT_CASES }, worker))
}

// A server asked to stop that has not within timeoutMs is killed.
function stopWithin(server: Server, timeoutMs: number): Promise<unknown> {
  const timer = setTimeout(() => server.child.kill('SIGKILL'), timeoutMs)
  return server.stop().finally(() => clearTimeout(timer))
}

// No case may have brought a server down: each still answers a plain GET.
async function stillServing(servers: Record<Mode, Server>, ports: Record<Mode, number>) {
  for (const mode of MODES) {
    assert.equal(servers[mode].child.exitCode, null, `the ${mode} server exited:\n${servers[mode].output()}`)
    const answer = await exchange(ports[mode], 'GET / HTTP/1.1\r\nHost: llhttp.test\r\n\r\n', { timeoutMs: 2_000 })
    assert.equal(answer.status, 200, `the ${mode} server no longer answers GET /: ${answer.raw}`)
  }
}
