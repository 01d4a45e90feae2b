#!/usr/bin/env bash
# Serves the API in the foreground. Configured by SQLITE_PATH, JWT_SECRET, HOST and PORT only.
set -euo pipefail
cd "$(dirname "$0")"

# exec: node takes this process's place, so the challenge's SIGTERM reaches it and it stops cleanly.
exec node dist/app.js
