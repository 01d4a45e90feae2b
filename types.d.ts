// esbuild and `node --experimental-import-text` load .sql files as text: this says so to TypeScript, and
// so to an editor, which finds it by app.ts's reference even in a folder with no tsconfig.json.
declare module '*.sql' {
  const text: string
  export default text
}
