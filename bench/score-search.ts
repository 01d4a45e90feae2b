// The score's procedure (bench/score.ts), the challenge's own: the levels' lengths, the search (doubling
// from 2,500 users while each level passes, then narrowing), and the confirmation on 5-minute holds,
// stepping down where the best level fails. Each level is bench/score-level.ts's.
import { fmt, log } from './lib.ts'
import { type Level, level, type Lengths, type Scoring } from './score-level.ts'

const STEP = 250
const round = (n: number) => Math.max(STEP, Math.round(n / STEP) * STEP)

// The challenge's lengths with --full; shorter by default, to fit in about 20 minutes.
export const lengthsOf = (full: boolean) => ({
  warmup: full ? { ramp: 30, hold: 120 } : { ramp: 15, hold: 30 },
  search: full ? { ramp: 60, hold: 60 } : { ramp: 30, hold: 30 },
  confirm: full ? { ramp: 60, hold: 300 } : { ramp: 60, hold: 60 },
})
export const levelSeconds = (l: Lengths) => l.ramp + l.hold + 15
// The search's levels from 2,500 to the expected score, doubling.
export const doublingsTo = (expected: number) => Math.max(1, Math.ceil(Math.log2(expected / 2500)) + 1)

type Search = { full: boolean; lengths: ReturnType<typeof lengthsOf>; confirmFrom?: number; expected: number }

// Doubling from 2,500 while each level passes, then narrowing: halving the bracket until it is within
// 250 users (--full), or an eighth of the best. --confirm-from skips both. Gives the best level passed,
// and the step the confirmation starts stepping down by.
export async function search(s: Scoring, { full, lengths, confirmFrom, expected }: Search) {
  const { search: searching, confirm } = lengths
  const doublings = () => doublingsTo(expected)
  let passed = confirmFrom ?? 0
  let failedAt = confirmFrom ?? 0
  if (confirmFrom)
    log(`score: no search and no narrowing (--confirm-from): the confirmation starts at ${fmt(confirmFrom)} users`)
  for (let users = 2500, n = 0; !confirmFrom; users *= 2, n++) {
    s.remaining = () => levelSeconds(searching) * (Math.max(0, doublings() - n - 1) + 4) + levelSeconds(confirm)
    const result = await level(s, users, 'search', searching)
    if (!result.pass) {
      failedAt = users
      break
    }
    passed = users
  }
  const resolution = full || confirmFrom ? STEP : round(passed / 8)
  const steps = () => Math.max(0, Math.ceil(Math.log2(Math.max(1, (failedAt - passed) / resolution))))
  while (failedAt - passed > resolution) {
    s.remaining = () => levelSeconds(searching) * (steps() - 1) + levelSeconds(confirm)
    const users = round((passed + failedAt) / 2)
    if (users <= passed || users >= failedAt) break
    const result = await level(s, users, 'narrowing', searching)
    if (result.pass) passed = users
    else failedAt = users
  }
  return { passed, resolution }
}

// The confirmation: the best level of the search, held for the challenge's 5 minutes. Where it fails, the
// step down doubles (250, 500, 1,000, ...) until a level holds, then the bracket between it and the lowest
// level that failed is halved to within the resolution, every level held 5 minutes: the challenge's own
// narrowing, on its own lengths, where a step of 250 at a time could take hours.
export async function confirm(
  s: Scoring,
  { from, resolution, lengths }: { from: number; resolution: number; lengths: ReturnType<typeof lengthsOf> },
) {
  const tried = (users: number) => level(s, users, 'confirmation', lengths.confirm)
  let held: Level | undefined
  let last: Level | undefined
  let failedAt = Infinity
  for (let users = from, step = resolution; !held && users > 0; users -= step, step *= 2) {
    s.remaining = () => levelSeconds(lengths.confirm)
    last = await tried(users)
    if (last.pass) held = last
    else failedAt = users
  }
  while (held && failedAt - held.users > resolution) {
    const steps = Math.ceil(Math.log2((failedAt - held.users) / resolution))
    s.remaining = () => levelSeconds(lengths.confirm) * steps
    const users = round((held.users + failedAt) / 2)
    if (users <= held.users || users >= failedAt) break
    const result = await tried(users)
    if (result.pass) held = result
    else failedAt = users
  }
  return { score: held?.users ?? 0, confirmed: held ?? last }
}
