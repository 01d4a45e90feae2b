// npm start, npm test and the other scripts run this first: on a Node older than the pin it stops with
// one line that says what is needed, what was found and how to get it, not a stack trace from
// node:sqlite. Plain JavaScript that any Node since 12 runs.
import { existsSync, readFileSync } from 'node:fs'

const needed = readFileSync(new URL('../.nvmrc', import.meta.url), 'utf8').trim()
const [found, want] = [process.versions.node, needed].map((v) => v.split('.').map(Number))
const older = want.findIndex((part, i) => part !== found[i]) // the first part that differs
if (older !== -1 && found[older] < want[older]) {
  // npm links the pinned build into node_modules/.bin when the registry has one for this platform.
  const installed = existsSync(new URL('../node_modules/pinned-node/package.json', import.meta.url))
  const how = installed
    ? `the npm registry has no Node.js ${needed} build for ${process.platform}-${process.arch}: install it with nvm (\`nvm install\` reads .nvmrc) or from https://nodejs.org`
    : 'run `npm install` first, which brings the pinned Node.js for this machine'
  console.error(
    `This project needs Node.js ${needed} or newer, found ${process.version} (${process.execPath}): ${how}.`,
  )
  process.exit(1)
}
