#!/usr/bin/env bash
# Run as a normal user after install.sh: installs the pinned dependencies and bundles dist/app.js.
set -euo pipefail
cd "$(dirname "$0")"

node -e 'if (+process.versions.node.split(".")[0] < 26) { console.error(`build.sh: Node 26 is needed, this is ${process.version}; run install.sh`); process.exit(1) }'
# Without the dev dependencies: install.sh brought Node, so npm does not fetch the pinned one again.
npm ci --omit=dev --ignore-scripts --no-audit --no-fund
node build.mjs
