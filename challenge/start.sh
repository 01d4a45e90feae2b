#!/usr/bin/env bash
# Serves the API in the foreground. Configured by SQLITE_PATH, JWT_SECRET, HOST and PORT only.
set -euo pipefail
cd "$(dirname "$0")"

# exec: node takes this process's place, so the challenge's SIGTERM reaches it and it stops cleanly.
# The Node flags are the image's (see the Dockerfile's CMD for why).
exec node --max-semi-space-size=4 dist/app.js
