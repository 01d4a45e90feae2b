// Waiting, for the tests and the benchmark alike: every wait has a deadline, in milliseconds, and an
// error that names what did not happen.
export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

// Polls until condition() holds or timeoutMs pass; whether it held. For a wait whose end is no failure
// (a server may rightly not answer yet); `until` is the wait that must see it happen.
export async function holdsWithin(condition: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = performance.now() + timeoutMs
  while (!condition()) {
    if (performance.now() > deadline) return false
    await sleep(20)
  }
  return true
}

// Polls until condition() holds; throws, naming what it waited for, when it has not within timeoutMs.
export async function until(condition: () => boolean, timeoutMs: number, what: string) {
  if (!(await holdsWithin(condition, timeoutMs))) throw new Error(`${what}: not within ${timeoutMs / 1000} s`)
}

// The promise, or an error naming what did not happen within timeoutMs.
export async function within<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>(
    (_, reject) =>
      (timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs / 1000} s`)), timeoutMs)),
  )
  try {
    return await Promise.race([promise, late])
  } finally {
    clearTimeout(timer)
  }
}
