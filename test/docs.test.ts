// The documentation's links: every relative link in the Markdown files reaches a file, and every #anchor
// a heading of it, by GitHub's rules, so a section moved between the README and docs/ leaves no dead link.
import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { describe, test } from 'node:test'
import { ROOT } from '../harness/tools.ts'

const DOCS = [
  'README.md',
  'BENCHMARKS.md',
  'bench/README.md',
  'challenge/README.md',
  ...readdirSync(join(ROOT, 'docs')).map((f) => `docs/${f}`),
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
    const file = join(mkdtempSync(join(tmpdir(), 'docs-')), 'dead.md')
    writeFileSync(file, '# Here\n\n[ok](#here) [file](nowhere.md) [heading](#gone) `[code](nowhere.md)`\n')
    assert.deepEqual(
      brokenLinks(file).map((why) => why.split(':')[0]),
      ['no such file', 'no such heading'],
    )
  })
})
