// Stand-in for k6's `k6` module: records checks and think times instead of sleeping.
export const recorded = { checks: [], sleeps: [] }

export function check(response, checks) {
  for (const [name, fn] of Object.entries(checks)) recorded.checks.push({ name, ok: fn(response) === true })
}

export function sleep(seconds) {
  recorded.sleeps.push(seconds)
}
