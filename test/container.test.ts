// The container: the Dockerfile read as text for what only the text shows, then the image built from it
// and run by a real Docker engine with the README's own commands. Where no engine answers (this
// repository's CI starts one with ../shared/tools/docker-engine.sh), that part says so and skips.
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { connect } from 'node:net'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import type { Token } from '../harness/seed.ts'
import { sleep, within } from '../harness/time.ts'
import { ROOT } from '../harness/tools.ts'
import { contractTests } from './contract.ts'
import { describeNeeding, freePort, waitHealthy } from './helpers.ts'
import { readToEnd } from './sockets.ts'

type Instruction = { keyword: string; args: string }

// Dockerfile instructions by stage, continuation lines joined, comments dropped.
function readDockerfile(path: string): Instruction[][] {
  const lines = readFileSync(path, 'utf8')
    .replace(/\\\n\s*/g, '')
    .split('\n')
  const stages: Instruction[][] = []
  for (const line of lines.map((l) => l.trim()).filter((l) => l && !l.startsWith('#'))) {
    const [, keyword, args] = /^(\S+)\s+(.*)$/.exec(line)!
    if (keyword.toUpperCase() === 'FROM') stages.push([])
    stages.at(-1)!.push({ keyword: keyword.toUpperCase(), args })
  }
  return stages
}

const stages = readDockerfile(join(ROOT, 'Dockerfile'))
const runtime = stages.at(-1)!
const one = (keyword: string) => {
  const found = runtime.filter((i) => i.keyword === keyword)
  assert.equal(found.length, 1, `one ${keyword} in the runtime stage`)
  return found[0].args
}
const execForm = (args: string) => JSON.parse(args) as string[]
const baseImage = stages[0][0].args.split(/\s+/)[0]

describe('Dockerfile', () => {
  test('lints clean with dockerfile-utils', () => {
    const lint = spawnSync(join(ROOT, 'node_modules', '.bin', 'dockerfile-utils'), ['lint', join(ROOT, 'Dockerfile')], {
      encoding: 'utf8',
    })
    assert.equal(lint.stdout.trim(), '', lint.stdout)
  })

  test('builds and runs on the same Node base', () => {
    assert.equal(new Set(stages.map((stage) => stage[0].args.split(/\s+/)[0])).size, 1)
  })

  test('sends only what the build stage copies into the build context', () => {
    const ignore = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
      .split('\n')
      .filter((l) => l.startsWith('!'))
      .map((l) => l.slice(1))
    const copied = stages[0].filter((i) => i.keyword === 'COPY').flatMap((i) => i.args.split(/\s+/).slice(0, -1))
    assert.deepEqual([...copied].sort(), [...ignore].sort())
  })

  test('installs without the dev dependencies: the base has its Node, npm must not fetch the pinned one', () => {
    const install = stages[0].find((i) => i.keyword === 'RUN' && /npm ci/.test(i.args))
    assert.match(install?.args ?? '', /--omit=dev/)
  })

  test('gives node the same flags as challenge/start.sh and npm start', () => {
    const [, ...args] = execForm(one('CMD'))
    const flags = args.slice(0, -1)
    const startSh = readFileSync(join(ROOT, 'challenge', 'start.sh'), 'utf8')
    assert.match(startSh, new RegExp(`^exec node ${flags.join(' ')} dist/app\\.js$`, 'm'))
    const { scripts } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'))
    assert.match(scripts.start, new RegExp(`node ${flags.join(' ')} dist/start\\.js$`))
  })

  test('runs as a non-root user, with exec-form CMD and HEALTHCHECK that need only node', () => {
    assert.notEqual(one('USER'), 'root')
    assert.equal(execForm(one('CMD'))[0], 'node')
    const healthcheck = /^(--\S+\s+)*CMD\s+(\[.*\])$/.exec(one('HEALTHCHECK'))
    assert.ok(healthcheck, 'HEALTHCHECK ... CMD [exec form]')
    assert.equal(execForm(healthcheck[2])[0], 'node')
  })
})

// The README's container commands, in the order it gives them.
const readme = readFileSync(join(ROOT, 'README.md'), 'utf8')
const section = /^## Run it in a container\n([\s\S]*?)^## /m.exec(readme)?.[1] ?? ''
const commands = [...section.matchAll(/(?:^|`)(docker (?:build|run) [^`\n]+)/gm)].map((m) => m[1].trim())

describe('the README', () => {
  test('builds, then runs with one flag first, then with the volume and says why', () => {
    assert.equal(commands[0], 'docker build -t twelve-dollar-feed .')
    assert.equal(commands[1], 'docker run -p 3000:3000 twelve-dollar-feed')
    assert.equal(commands[2], 'docker run -p 3000:3000 -v feed-data:/data twelve-dollar-feed')
    assert.ok(commands.includes('docker run --rm -v feed-data:/data twelve-dollar-feed cat /data/tokens.json'))
    assert.match(section, /volume/)
  })
})

// Bounded, so an engine that stops answering fails the test instead of hanging it.
const docker = (...args: string[]) =>
  spawnSync('docker', args, { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024, timeout: 300_000 })
const info = docker('info', '--format', '{{.ServerVersion}}')
const engine =
  info.status === 0
    ? false
    : `no Docker engine answers here (docker info: ${(info.stderr || info.error?.message || '').trim().split('\n')[0]}); ../shared/tools/docker-engine.sh starts one`

describeNeeding(engine, 'the image, built and run by a real Docker engine as the README says', {}, () => {
  // The README's names, made unique to this run; the published port is a free one.
  const tag = `twelve-dollar-feed-test-${process.pid}`
  const volume = `feed-data-test-${process.pid}`
  const name = `feed-test-${process.pid}`
  let port = 0
  let url = ''
  let tokens: Token[] = []
  let created: { id: number; body: string }
  const ours = (command: string) =>
    command
      .replaceAll('3000:3000', `${port}:3000`)
      .replaceAll('feed-data:', `${volume}:`)
      .replace(/twelve-dollar-feed(\s|$)/, `${tag}$1`)
      .split(/\s+/)
      .slice(1)
  // The run's HTTP_SERVER, where it sets one, goes to the container too.
  const run = (command: string) =>
    ours(command).toSpliced(
      1,
      0,
      '-d',
      '--name',
      name,
      ...(process.env.HTTP_SERVER ? ['-e', `HTTP_SERVER=${process.env.HTTP_SERVER}`] : []),
    )
  const logs = () => {
    const l = docker('logs', name)
    return l.stdout + l.stderr
  }
  const state = (field: string) => docker('inspect', '--format', `{{${field}}}`, name).stdout.trim()

  before(async () => {
    port = await freePort()
    url = `http://127.0.0.1:${port}`
    const build = docker(...ours(commands[0]).slice(0, -1), ROOT)
    assert.equal(build.status, 0, build.stdout + build.stderr)
    const started = docker(...run(commands[2]))
    assert.equal(started.status, 0, started.stderr)
    await waitHealthy(url, 90_000).catch((error) => assert.fail(`${error.message}\n${logs()}`))
    const cat = docker(...ours(commands.find((c) => c.endsWith('cat /data/tokens.json'))!))
    assert.equal(cat.status, 0, cat.stderr)
    tokens = JSON.parse(cat.stdout)
  })

  after(() => {
    docker('rm', '--force', name)
    docker('volume', 'rm', volume)
    docker('image', 'rm', tag)
  })

  test('adds its bundles, mimalloc and the Litestream binary to the base image, and nothing else of size', (t) => {
    const size = (image: string) => Number(docker('image', 'inspect', '--format', '{{.Size}}', image).stdout)
    const added = size(tag) - size(baseImage)
    const litestream = Number(docker('run', '--rm', tag, 'stat', '-c', '%s', '/usr/local/bin/litestream').stdout)
    t.diagnostic(
      `${baseImage}: ${(size(baseImage) / 1e6).toFixed(1)} MB; the project's layers add ${(added / 1e6).toFixed(1)} MB: Litestream ${(litestream / 1e6).toFixed(1)} MB, the rest ${((added - litestream) / 1024).toFixed(0)} KB`,
    )
    assert.ok(litestream > 0, 'the Litestream binary is in the image')
    assert.ok(
      added - litestream > 0 && added - litestream < 1024 * 1024,
      `${added - litestream} bytes besides Litestream`,
    )
    const listing = docker('run', '--rm', tag, 'ls', '-A', '/app', '/app/dist').stdout
    assert.equal(listing, '/app:\ndist\n\n/app/dist:\napp.js\nseed.js\nstart.js\n')
  })

  test('runs node with mimalloc preloaded, as challenge/start.sh does', () => {
    const maps = docker('exec', name, 'cat', '/proc/1/maps')
    assert.equal(maps.status, 0, maps.stderr)
    assert.match(maps.stdout, /\/usr\/local\/lib\/libmimalloc\.so\.3/)
  })

  test('seeded the empty volume on the first start, with progress in the log', () => {
    assert.match(logs(), /seed: likes 100% \(2,016,005 of 2,016,005\)/)
    assert.match(logs(), /checksum 738d11ab…cf1d ok; tokens in \/data\/tokens\.json/)
  })

  test('runs as uid 1000, which owns the database on the volume', () => {
    assert.match(docker('exec', name, 'cat', '/proc/1/status').stdout, /^Uid:\s+1000\s/m)
    assert.equal(
      docker('run', '--rm', '-v', `${volume}:/data`, tag, 'stat', '-c', '%u', '/data/feed.db').stdout.trim(),
      '1000',
    )
  })

  test('is healthy by its own HEALTHCHECK', async () => {
    const until = performance.now() + 60_000
    while (state('.State.Health.Status') !== 'healthy' && performance.now() < until)
      await new Promise((resolve) => setTimeout(resolve, 500))
    assert.equal(state('.State.Health.Status'), 'healthy')
  })

  contractTests(() => ({ url, tokens }))

  test('takes a post with a token from the volume: 201', async () => {
    const res = await fetch(`${url}/posts`, {
      method: 'POST',
      headers: { authorization: `Bearer ${tokens[3].token}` },
      body: JSON.stringify({ body: 'written in the container' }),
    })
    assert.equal(res.status, 201)
    created = (await res.json()).post
    assert.equal(created.body, 'written in the container')
  })

  test('docker stop under load: the request in flight is answered, the load sees no error before the stop, exit 0 within 2 s', async () => {
    // Readers and likers on keep-alive connections until the stop.
    let stopAt = Infinity
    const early: string[] = []
    const statuses = new Map<number, number>()
    const loop = async (i: number) => {
      while (true) {
        const sent = performance.now()
        try {
          const res =
            i % 4
              ? await fetch(`${url}/posts/${1 + ((i * 7919) % 500_000)}`)
              : await fetch(`${url}/posts/${1 + i}/like`, {
                  method: 'POST',
                  headers: { authorization: `Bearer ${tokens[i].token}` },
                })
          await res.arrayBuffer()
          statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1)
        } catch (error) {
          if (sent < stopAt) early.push(String((error as Error).cause ?? error))
          return
        }
      }
    }
    const load = Array.from({ length: 16 }, (_, i) => loop(i))
    // A request half sent when the stop comes, completed after it.
    const body = JSON.stringify({ body: 'sent across docker stop' })
    const socket = connect(port, '127.0.0.1')
    await within(once(socket, 'connect'), 5_000, 'the connection to the container')
    socket.write(
      `POST /posts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${tokens[5].token}\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 10)}`,
    )
    // The server's sockets are in the container's network namespace, behind Docker's proxy: nothing here
    // sees it read the bytes or take the signal (test/sockets.ts cannot), so each is given time.
    await sleep(1_000)
    stopAt = performance.now()
    // Docker sends SIGTERM, and SIGKILL after 2 s: exit code 0 means node stopped by itself within 2 s.
    const stop = spawn('docker', ['stop', '--time', '2', name])
    const stopped = once(stop, 'exit')
    await sleep(300)
    socket.end(body.slice(10))
    const response = await within(readToEnd(socket), 15_000, 'the answer to the request sent across the stop')
    await within(stopped, 15_000, 'docker stop to exit')
    await within(Promise.all(load), 15_000, 'the load to end')
    assert.match(response, /^HTTP\/1.1 201 Created\r\n/)
    assert.deepEqual(early, [], 'no request sent before the stop failed')
    assert.deepEqual(
      [...statuses.keys()].filter((s) => s !== 200 && s !== 201),
      [],
    )
    assert.equal(state('.State.ExitCode'), '0')
    assert.equal(state('.State.OOMKilled'), 'false')
  })

  test('starts again on the same volume without seeding, with the new post there', async () => {
    docker('rm', name)
    const started = docker(...run(commands[2]))
    assert.equal(started.status, 0, started.stderr)
    await waitHealthy(url, 30_000)
    assert.match(logs(), /seed: \/data\/feed\.db exists, serving it as it is/)
    assert.doesNotMatch(logs(), /seed: users/)
    const res = await fetch(`${url}/posts/${created.id}`)
    assert.equal(res.status, 200)
    assert.equal((await res.json()).post.body, 'written in the container')
  })
})
