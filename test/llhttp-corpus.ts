// Reads llhttp's request tests (test/request/*.md in its repository, MIT) into cases of bytes, the way
// llhttp's own runner does (its test/md-test.ts on the markdown as mdgator parses it), so that
// test/conformance.test.ts can send them to servers. Nothing of llhttp is kept in this repository: the
// corpus is read where it lies, at run time.
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { runInNewContext } from 'node:vm'

export type CorpusCase = {
  file: string // the .md file's name
  heading: string // the heading the case is under
  line: number // the heading's line, counted from 1, as llhttp names its cases
  type: string // meta `type`: request, request-finish, request-lenient-headers...
  meta: Record<string, unknown>
  bytes: Buffer // the ```http block, as llhttp's runner hands it to the parser
  log: string[] // the ```log block's lines: what llhttp's parser reports
}

// The folder holding test/request/*.md: $LLHTTP_TESTS, else ../shared/corpora/llhttp from the repository's
// root if it holds one; undefined when there is neither. A LLHTTP_TESTS that holds none is a mistake to
// say, not a reason to skip.
export function corpusRoot(repositoryRoot: string): string | undefined {
  const given = process.env.LLHTTP_TESTS
  if (given) {
    if (!existsSync(join(given, 'test', 'request')))
      throw new Error(`LLHTTP_TESTS=${given} holds no test/request folder`)
    return given
  }
  const shared = join(repositoryRoot, '..', 'shared', 'corpora', 'llhttp')
  return existsSync(join(shared, 'test', 'request')) ? shared : undefined
}

export function requestFiles(root: string): string[] {
  return readdirSync(join(root, 'test', 'request'))
    .filter((name) => name.endsWith('.md'))
    .sort()
}

export function readCases(root: string, file: string): CorpusCase[] {
  const text = readFileSync(join(root, 'test', 'request', file), 'utf8')
  return headingsOf(text).flatMap((heading) => {
    const http = heading.fences.filter((fence) => fence.info === 'http')
    const log = heading.fences.filter((fence) => fence.info === 'log')
    if (http.length === 0) return []
    if (http.length !== 1 || log.length !== 1)
      throw new Error(`${file}:${heading.line + 1}: not one http and one log block`)
    const meta = http[0].meta ?? {}
    return [
      {
        file,
        heading: heading.name,
        line: heading.line + 1,
        type: String(meta.type),
        meta,
        bytes: bytesOf(http[0].content),
        log: logOf(log[0].content),
      },
    ]
  })
}

// What llhttp's runner does to a ```http block before the parser sees it, in its order. The runner
// passes the string to the parser's process as an argument, so it reaches the parser as UTF-8.
export function bytesOf(block: string): Buffer {
  let input = block.replace(/\n$/, '')
  input = input.replace(/\\(\r\n|\r|\n)/g, '')
  input = input.replace(/\r\n|\r|\n/g, '\r\n')
  input = input.replace(/\\r/g, '\r').replace(/\\n/g, '\n').replace(/\\t/g, '\t').replace(/\\f/g, '\f')
  input = input.replace(/\\x([0-9a-fA-F]+)/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)))
  input = input.replace(/\\([0-7]{1,3})/g, (_, digits) => String.fromCharCode(parseInt(digits, 8)))
  input = input.replace(/\$\{(.+?)\}/g, (_, code) => String(runInNewContext(code)))
  return Buffer.from(input, 'utf8')
}

function logOf(block: string): string[] {
  return block.replace(/\\t/g, '\t').replace(/\\f/g, '\f').split('\n').slice(0, -1)
}

// What llhttp's log says of the messages in a case: where each one ended ("message complete"), and
// how the last one ended. Pauses (codes 21 to 23: a CONNECT or an Upgrade, or the runner's own
// pause) are not errors.
export function logVerdict(log: string[]): { ends: number[]; last: 'complete' | 'error' | 'incomplete' } {
  const ends: number[] = []
  let last: 'complete' | 'error' | 'incomplete' = 'incomplete'
  for (const line of log) {
    const event = /^off=(\d+) (message begin|message complete|error code=(\d+))/.exec(line)
    if (!event) continue
    if (event[2] === 'message begin') last = 'incomplete'
    else if (event[2] === 'message complete') ((last = 'complete'), ends.push(Number(event[1])))
    else if (Number(event[3]) < 21 || Number(event[3]) > 23) last = 'error'
  }
  return { ends, last }
}

type Fence = { info: string; content: string; meta?: Record<string, any> }
type Heading = { name: string; line: number; depth: number; fences: Fence[] }

// The headings of a markdown file with the fenced blocks under each, as mdgator (on markdown-it) finds
// them: a block belongs to the nearest heading above it, if that heading has a heading above it; an
// HTML comment `<!-- meta={...} -->` gives its JSON to the next block. Enough markdown for the corpus:
// ATX and setext headings, fences, HTML comments, paragraphs.
export function headingsOf(text: string): Heading[] {
  const lines = text.replace(/\r\n?/g, '\n').split('\n')
  const headings: Heading[] = []
  const stack: Heading[] = []
  let meta: Record<string, any> | undefined
  let paragraph: number | undefined // the first line of the paragraph being read
  const open = (name: string, line: number, depth: number) => {
    while (stack.length > 0 && stack.at(-1)!.depth >= depth) stack.pop()
    const heading = { name, line, depth, fences: [] }
    headings.push(heading)
    stack.push(heading)
    meta = undefined
    paragraph = undefined
  }
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]
    const atx = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/.exec(line)
    const setext = paragraph !== undefined ? /^ {0,3}(=+|-+)[ \t]*$/.exec(line) : null
    const fence = /^( {0,3})(`{3,}|~{3,})[ \t]*([^`]*?)[ \t]*$/.exec(line)
    if (atx) open(atx[2] ?? '', i, atx[1].length - 1)
    else if (setext) open(lines.slice(paragraph, i).join('\n').trim(), paragraph!, setext[1][0] === '=' ? 0 : 1)
    else if (fence) {
      const end = closingFence(lines, i + 1, fence[2])
      const content = lines
        .slice(i + 1, end)
        .map((body) => `${body.replace(new RegExp(`^ {0,${fence[1].length}}`), '')}\n`)
        .join('')
      if (stack.length > 1) stack.at(-1)!.fences.push({ info: fence[3], content, meta })
      if (stack.length > 1) meta = undefined
      paragraph = undefined
      i = end
    } else if (/^ {0,3}<!--/.test(line)) {
      const end = lines.findIndex((rest, at) => at >= i && rest.includes('-->'))
      const comment = lines.slice(i, end < 0 ? lines.length : end + 1).join('\n')
      const json = /<!--\s+meta=(.*)\s+-->/.exec(comment)
      if (json && stack.length >= 1) meta = JSON.parse(json[1])
      paragraph = undefined
      i = end < 0 ? lines.length : end
    } else if (line.trim() === '') paragraph = undefined
    else paragraph ??= i
  }
  return headings
}

// The line of the fence that closes one opened with `opening`: the same character, at least as many.
function closingFence(lines: string[], from: number, opening: string): number {
  for (let i = from; i < lines.length; i++) {
    const close = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(lines[i])
    if (close && close[1][0] === opening[0] && close[1].length >= opening.length) return i
  }
  return lines.length
}
