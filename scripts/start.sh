#!/usr/bin/env bash
# Set everything up (first time only takes a while) and start Headroom in the tray.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh app
exec .venv/bin/headroom "$@"
