// The seed's pseudo-random numbers (mulberry32): small, fast, and the same for the same seed on every
// platform. seed.ts draws the challenge's data from it; the benchmark's request sequences and the
// tests' fuzzed requests draw from the same one, so that there is one generator to trust.
export function mulberry32(seed: number): () => number {
  let state = seed | 0
  return () => {
    state = (state + 0x6d2b79f5) | 0
    let t = Math.imul(state ^ (state >>> 15), state | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}
