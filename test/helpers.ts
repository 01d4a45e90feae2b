// Shared by the tests that run the built server as a real process.
import { spawn, type ChildProcess } from 'node:child_process'
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { sign } from 'hono/jwt'

export const ROOT = join(import.meta.dirname, '..')
export const DEFAULT_SECRET = 'twelve-dollar-challenge'

type Token = { id: number; username: string; token: string }

// A fresh copy of the run's seeded database, in a folder of its own, with its tokens.
export function freshSeededCopy() {
  const seed = process.env.TEST_SEED_DB
  if (!seed) throw new Error('TEST_SEED_DB is not set: run the tests with `npm test`')
  const dir = mkdtempSync(join(tmpdir(), 'feed-db-'))
  const path = join(dir, 'feed.db')
  copyFileSync(seed, path)
  const tokens: Token[] = JSON.parse(readFileSync(join(dirname(seed), 'tokens.json'), 'utf8'))
  return { dir, path, tokens, remove: () => rmSync(dir, { recursive: true, force: true }) }
}

export type Server = {
  url: string
  child: ChildProcess
  output: () => string
  stop: (signal?: NodeJS.Signals) => Promise<number | null>
}

// Starts a program that logs "listening on http://host:port" and waits for that line.
export function startServer(args: string[], env: Record<string, string>, cwd = ROOT): Promise<Server> {
  const child = spawn(process.execPath, args, {
    cwd,
    env: { PATH: process.env.PATH ?? '', PORT: '0', HOST: '127.0.0.1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start in 60 s:\n${output}`)), 60_000)
    const onData = (chunk: Buffer) => {
      output += chunk
      const match = /listening on http:\/\/[^:]+:(\d+)/.exec(output)
      if (!match) return
      clearTimeout(timer)
      resolve({
        url: `http://127.0.0.1:${match[1]}`,
        child,
        output: () => output,
        stop: (signal = 'SIGTERM') => {
          child.kill(signal)
          return exited
        },
      })
    }
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    child.once('exit', (code) => reject(new Error(`server exited with ${code} before listening:\n${output}`)))
  })
}

const base64url = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

// A token for the tests' own claims, signed with HS256 (or left unsigned for alg "none").
export async function makeToken(
  payload: Record<string, unknown>,
  { secret = DEFAULT_SECRET, alg = 'HS256' }: { secret?: string; alg?: string } = {},
) {
  if (alg === 'none') return `${base64url({ alg: 'none', typ: 'JWT' })}.${base64url(payload)}.`
  return sign(payload, secret, alg as 'HS256')
}

export const now = () => Math.floor(Date.now() / 1000)
export const claims = (sub: unknown, username: unknown = `user_${sub}`) => ({ sub, username, iat: now(), exp: now() + 3600 })
