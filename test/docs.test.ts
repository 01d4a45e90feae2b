// The documentation's links: every relative link in the Markdown files reaches a file, and every #anchor
// a heading of it, by GitHub's rules, so a section moved between the README and docs/ leaves no dead link.
import assert from 'node:assert/strict'
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { describe, test } from 'node:test'
import { ROOT } from '../harness/tools.ts'

const DOCS = [
  'README.md',
  'BENCHMARKS.md',
  'CHANGELOG.md',
  'bench/README.md',
  'challenge/README.md',
  ...readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
]

// Each line of a Markdown file outside its fenced code blocks, with its number.
function* prose(file: string): Generator<[string, number]> {
  let fenced = false
  for (const [i, line] of readFileSync(file, 'utf8').split('\n').entries()) {
    if (/^\s*```/.test(line)) fenced = !fenced
    else if (!fenced) yield [line, i + 1]
  }
}

// GitHub's anchors: the heading's text lowercased, punctuation but '-' and '_' dropped, each space a
// '-'; a repeated heading gets -1, -2...
function anchors(file: string): Set<string> {
  const seen = new Map<string, number>()
  for (const [line] of prose(file)) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)
    if (!heading) continue
    const text = heading[1].replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    const slug = text
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/ /g, '-')
    seen.set(slug, (seen.get(slug) ?? -1) + 1)
    if (seen.get(slug)! > 0) seen.set(`${slug}-${seen.get(slug)}`, 0)
  }
  return new Set(seen.keys())
}

// Why each relative link of `file` does not resolve: none when all do.
function brokenLinks(file: string): string[] {
  const broken: string[] = []
  for (const [line, number] of prose(file)) {
    for (const [, target] of line.replace(/`[^`]*`/g, '').matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/i.test(target)) continue
      const [path, anchor] = target.split('#')
      const dest = path ? resolve(dirname(file), path) : file
      const where = `${relative(ROOT, file)}:${number} ${target}`
      if (!existsSync(dest)) broken.push(`no such file: ${where}`)
      else if (anchor === undefined) continue
      else if (statSync(dest).isDirectory() || !dest.endsWith('.md'))
        broken.push(`an anchor on a file with no headings: ${where}`)
      else if (!anchors(dest).has(anchor)) broken.push(`no such heading: ${where}`)
    }
  }
  return broken
}

describe('the documentation', () => {
  for (const doc of DOCS) {
    test(`${doc}: every relative link and anchor resolves`, () => {
      assert.deepEqual(brokenLinks(join(ROOT, doc)), [])
    })
  }

  test('finds a dead link and a dead anchor', () => {
    const dir = mkdtempSync(join(tmpdir(), 'docs-'))
    const file = join(dir, 'dead.md')
    writeFileSync(file, '# Here\n\n[ok](#here) [file](nowhere.md) [heading](#gone) `[code](nowhere.md)`\n')
    try {
      assert.deepEqual(
        brokenLinks(file).map((why) => why.split(':')[0]),
        ['no such file', 'no such heading'],
      )
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

// What the docs and the code's comments name must exist: a file of the repository by its path (or, in
// prose and comments, by its bare name: a file at the root, or one of that name in some folder), an npm
// script, a setting (an environment variable the code reads), and a part of a Markdown file quoted after
// its name (`BENCHMARKS.md, "Now"`: a heading, or a list item's bold lead). Other projects' paths (the
// challenge's files, llhttp's, Node's) are told apart by the folders ours live in and by their context;
// BENCHMARKS.md's History names what was, and only its sections are held to this.
const CODE = [
  'app.ts',
  'token.ts',
  'seed.ts',
  'start.ts',
  'random.ts',
  'build.mjs',
  'load.js',
  'Dockerfile',
  '.ci/run',
  ...readdirSync(join(ROOT, 'docs', 'deploy')).map((f) => `docs/deploy/${f}`),
  ...['server', 'harness', 'bench', 'test', 'test/faults', 'challenge', 'pinned-node'].flatMap((dir) =>
    readdirSync(join(ROOT, dir))
      .filter((f) => /\.(ts|mjs|js|sh)$/.test(f))
      .map((f) => `${dir}/${f}`),
  ),
].filter((file) => file !== 'test/docs.test.ts') // its own examples name what is not there
const FOLDERS = ['server', 'bench', 'test', 'harness', 'docs', 'challenge', 'pinned-node', '\\.ci']
const GENERATED = /^(dist|bench\/results|bench\/\.cache)\//
const PATH = new RegExp(
  `(?<![\\w./-])((?:${FOLDERS.join('|')})/[\\w./-]*\\.(?:ts|mjs|js|md|sh|json|lua|svg|sql))\\b`,
  'g',
)
// A bare file name, of the kinds this repository holds, not part of a path.
const NAME = /(?<![\w./@$-])([A-Za-z][\w-]*(?:\.[\w-]+)*\.(?:ts|mjs|js|md|sh|json|sql|conf|service|env))\b(?![\w/(-])/g
// Bare names that are not files of this repository: the bundles and tokens.json, which the build and the
// seed write; the challenge's own files (docs/challenge.md, "The challenge's spec"); the workplace's Docker
// script; a usage line's placeholder.
const NOT_OURS = new Set([
  'Node.js',
  'app.js',
  'seed.js',
  'start.js',
  'tokens.json',
  'CONTRACT.md',
  'SEED.md',
  'seed-words.json',
  'docker-engine.sh',
  'file.json',
])
// Every file name the repository holds, in any folder but what is installed, generated or git's.
function fileNames(dir = ROOT, names = new Set<string>()): Set<string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (['node_modules', '.git', 'dist', '.cache', 'results'].includes(entry.name)) continue
    if (entry.isDirectory()) fileNames(join(dir, entry.name), names)
    else names.add(entry.name)
  }
  return names
}
// The prose a bare name is looked for in: a Markdown file's (BENCHMARKS.md's up to its History), a code
// file's comments (// in JavaScript and TypeScript, # elsewhere), each line's from its marker on.
function prosePart(file: string): string {
  if (file.endsWith('.md')) return text(file)
  const marker = /\.(ts|mjs|js)$/.test(file) ? /(?:^|\s)\/\/(.*)$/ : /(?:^|\s)#(.*)$/
  return readFileSync(join(ROOT, file), 'utf8')
    .split('\n')
    .flatMap((line) => marker.exec(line)?.[1] ?? [])
    .join('\n')
}

// Settings that are not this project's to read: the OS's, glibc's, libuv's, Docker's, Node's, k6's.
const OTHERS_SETTINGS = new Set([
  'LD_PRELOAD',
  'AWS_CA_BUNDLE',
  'SYS_ADMIN',
  'NODE_OPTIONS',
  'K6_NO_USAGE_REPORT',
  'MALLOC_ARENA_MAX',
  'UV_THREADPOOL_SIZE',
  'F_SETLKW',
])

// A file's text, a comment's lines as one so that a name wrapped over two is read whole; BENCHMARKS.md
// up to its History.
function text(file: string): string {
  const body = readFileSync(join(ROOT, file), 'utf8')
  if (file.endsWith('.md')) return file === 'BENCHMARKS.md' ? body.split('\n## History\n')[0] : body
  return body.replace(/\n[ \t]*(?:\/\/|#)[ \t]*/g, ' ')
}

// The parts of a Markdown file a quote may name: its headings and its list items' bold leads.
function parts(file: string): string[] {
  return [...prose(join(ROOT, file))].flatMap(([line]) => /^(?:#{1,6}\s+|\s*[-*]\s+\*\*)(.*)$/.exec(line)?.[1] ?? [])
}

export function missingNames(files: string[]): string[] {
  const scripts = Object.keys(JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')).scripts)
  const code = CODE.map(text).join('\n')
  const names = fileNames()
  const missing: string[] = []
  for (const file of files) {
    const body = text(file)
    for (const [, name] of prosePart(file).matchAll(NAME)) {
      if (!names.has(name) && !NOT_OURS.has(name)) missing.push(`${file}: the file ${name}`)
    }
    for (const { 1: path, index } of body.matchAll(PATH)) {
      if (GENERATED.test(path) || /llhttp/.test(body.slice(Math.max(0, index - 40), index))) continue
      if (!existsSync(join(ROOT, path))) missing.push(`${file}: the file ${path}`)
    }
    for (const [, script] of body.matchAll(/npm run ([\w:-]*[\w])/g)) {
      if (!scripts.includes(script)) missing.push(`${file}: the script npm run ${script}`)
    }
    const quoted = (file.endsWith('.md') ? readFileSync(join(ROOT, file), 'utf8') : body).matchAll(
      /(?<![\w/.-])((?:[\w-]+\/)*[\w-]+\.md)\]?(?:\([^)]*\))?(?:'s|,) "([^"]+)"/g,
    )
    for (const [, md, quote] of quoted) {
      const target = DOCS.find((doc) => doc === md || doc.endsWith(`/${md}`))
      const section = quote.replace(/\s+/g, ' ')
      if (target && !parts(target).some((part) => part.includes(section)))
        missing.push(`${file}: the section "${section}" of ${target}`)
    }
    if (!file.endsWith('.md')) continue
    for (const [, name] of body.matchAll(/`([A-Z][A-Z0-9]*_[A-Z0-9_]+)(?:=[^`]*)?`/g)) {
      if (!OTHERS_SETTINGS.has(name) && !new RegExp(`\\b${name}\\b`).test(code))
        missing.push(`${file}: the setting ${name}`)
    }
  }
  return missing
}

describe('what the docs and comments name', () => {
  test('every file, npm script, setting and quoted section named exists', () => {
    assert.deepEqual(missingNames([...DOCS, ...CODE]), [])
  })

  test('finds a missing file, script, setting and section, in a page and in a comment', () => {
    // In the repository, as the names are read from it; bench/.cache is git-ignored.
    mkdirSync(join(ROOT, 'bench', '.cache'), { recursive: true })
    const dir = mkdtempSync(join(ROOT, 'bench', '.cache', 'docs-'))
    const [page, code] = ['named.md', 'named.ts'].map((name) => relative(ROOT, join(dir, name)))
    writeFileSync(
      join(ROOT, page),
      'See server/nowhere.ts, `nowhere.sh`, `npm run nothing`, `NO_SUCH_SETTING` and BENCHMARKS.md, "No such section".\n' +
        'But server/wire.ts, `token.ts`, `http1.ts`, `npm test`, `SQLITE_PATH` and BENCHMARKS.md, "Now" are there.\n',
    )
    writeFileSync(
      join(ROOT, code),
      "// As server/gone.ts and SEEDS.md say (not app.ts, server/main.ts or BENCHMARKS.md, 'Now'): npm run gone,\n" +
        '// BENCHMARKS.md, "Gone section".\n' +
        "const path = 'server/in-code.ts', name = 'in-code.ts' // not a comment's, but a path all the same\n",
    )
    try {
      assert.deepEqual(
        missingNames([page, code]).map((why) => why.split(': ')[1]),
        [
          'the file nowhere.sh',
          'the file server/nowhere.ts',
          'the script npm run nothing',
          'the section "No such section" of BENCHMARKS.md',
          'the setting NO_SUCH_SETTING',
          'the file SEEDS.md',
          'the file server/gone.ts',
          'the file server/in-code.ts',
          'the script npm run gone',
          'the section "Gone section" of BENCHMARKS.md',
        ],
      )
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
