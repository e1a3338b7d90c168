#!/usr/bin/env bash
# Set everything up and run the checks: ruff (lint, and the format of trayapp), mypy and the
# test suite.
#   HEADROOM_TEST_PACKAGING=1 also builds the installers and tests them (slow; CI sets it).
#   HEADROOM_TEST_WORKERS=N runs the tests in N processes (default 2; 0 runs them in this one).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
echo "== ruff"
.venv/bin/ruff check trayapp tests benchmarks scripts packaging
.venv/bin/ruff format --check trayapp
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/python -m pytest -n "${HEADROOM_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
