// `npm start` and the container run this: seed the challenge data on the first start, then serve it.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { fileURLToPath } from 'node:url'

// The seed runs in a process of its own, so its memory is gone before the server starts.
const seed = spawn(process.execPath, [fileURLToPath(new URL('./seed.js', import.meta.url)), '--if-missing'], { stdio: 'inherit' })
const forward = (signal: NodeJS.Signals) => seed.kill(signal)
process.on('SIGTERM', forward).on('SIGINT', forward)
const [code, signal] = await once(seed, 'exit')
process.off('SIGTERM', forward).off('SIGINT', forward)
if (code !== 0) {
  console.error(`start: the seed ${signal ? `was stopped by ${signal}` : `failed with exit code ${code}`}`)
  process.exit(code || 1)
}

const { run } = await import(new URL('./app.js', import.meta.url).href)
run()
