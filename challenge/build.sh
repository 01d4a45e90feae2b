#!/usr/bin/env bash
# Run as a normal user after install.sh: installs the pinned dependencies and bundles dist/app.js.
set -euo pipefail
cd "$(dirname "$0")"

node -e 'if (+process.versions.node.split(".")[0] < 24) { console.error(`build.sh: Node 24 is needed, this is ${process.version}; run install.sh`); process.exit(1) }'
npm ci --ignore-scripts --no-audit --no-fund
node build.mjs
