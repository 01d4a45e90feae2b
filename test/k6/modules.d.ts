// The k6 stand-ins under test/k6, resolved by test/load.test.ts.
declare module 'k6' {
  export const recorded: { checks: { name: string; ok: boolean }[]; sleeps: number[] }
}
declare module 'k6/http'
