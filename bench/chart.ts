// The SVG chart that --record draws for BENCHMARKS.md and docs/performance.md: CPU per request and
// latency at saturation, endpoint by endpoint, ours against the node:http ceiling of the same run.

type Row = { endpoint: string; cpu_us: number; p50_ms: number; p99_ms: number }

const LABELS: Record<string, string> = {
  ceiling: 'node:http ceiling',
  feed: 'GET /feed',
  post: 'GET /posts/:id',
  like: 'POST /posts/:id/like',
  create: 'POST /posts',
  mix: 'k6 mix',
}

const escape = (text: string) => text.replace(/&/g, '&amp;').replace(/</g, '&lt;')

export function renderChart(rows: Row[], c0: number, caption: string): string {
  const rowHeight = 34
  const top = 70
  const labelWidth = 170
  const panelWidth = 230 // the longest bar; its value is written after it
  const valueWidth = 140
  const width = labelWidth + 2 * (panelWidth + valueWidth) + 20
  const height = top + rows.length * rowHeight + 40
  const maxCpu = Math.max(...rows.map((r) => r.cpu_us)) * 1.15
  const maxLatency = Math.max(...rows.map((r) => r.p99_ms)) * 1.15
  const x2 = labelWidth + panelWidth + valueWidth + 20
  const parts: string[] = []
  const text = (x: number, y: number, content: string, attrs = '') =>
    parts.push(`<text x="${x}" y="${y}" ${attrs}>${escape(content)}</text>`)

  text(16, 26, 'CPU per request and latency at saturation, one core', 'font-size="16" font-weight="bold"')
  text(16, 46, caption, 'font-size="12" fill="#555"')
  text(labelWidth, top - 10, 'server CPU per request (us); dashed: the ceiling c0', 'font-size="12"')
  text(x2, top - 10, 'latency (ms): p50 solid, p99 light', 'font-size="12"')

  rows.forEach((row, i) => {
    const y = top + i * rowHeight
    const ceiling = row.endpoint === 'ceiling'
    text(labelWidth - 10, y + 20, LABELS[row.endpoint] ?? row.endpoint, 'font-size="13" text-anchor="end"')
    const cpuWidth = (row.cpu_us / maxCpu) * panelWidth
    parts.push(
      `<rect x="${labelWidth}" y="${y + 6}" width="${cpuWidth.toFixed(1)}" height="20" fill="${ceiling ? '#9e9e9e' : '#1f77b4'}"/>`,
    )
    text(
      labelWidth + cpuWidth + 6,
      y + 21,
      `${row.cpu_us.toFixed(1)} us, ${(row.cpu_us / c0).toFixed(2)} x c0`,
      'font-size="12"',
    )
    const p99Width = (row.p99_ms / maxLatency) * panelWidth
    const p50Width = (row.p50_ms / maxLatency) * panelWidth
    parts.push(
      `<rect x="${x2}" y="${y + 6}" width="${p99Width.toFixed(1)}" height="20" fill="${ceiling ? '#d6d6d6' : '#ffbb78'}"/>`,
    )
    parts.push(
      `<rect x="${x2}" y="${y + 6}" width="${p50Width.toFixed(1)}" height="20" fill="${ceiling ? '#9e9e9e' : '#ff7f0e'}"/>`,
    )
    text(x2 + p99Width + 6, y + 21, `${row.p50_ms.toFixed(2)} / ${row.p99_ms.toFixed(2)}`, 'font-size="12"')
  })
  const c0x = labelWidth + (c0 / maxCpu) * panelWidth
  parts.push(
    `<line x1="${c0x.toFixed(1)}" y1="${top}" x2="${c0x.toFixed(1)}" y2="${top + rows.length * rowHeight}" stroke="#333" stroke-dasharray="4 3"/>`,
  )

  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif">
<rect width="100%" height="100%" fill="#fff"/>
${parts.join('\n')}
</svg>
`
}
