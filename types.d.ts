// esbuild and `node --experimental-import-text` load .sql files as text.
declare module '*.sql' {
  const text: string
  export default text
}
