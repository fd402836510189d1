#!/usr/bin/env bash
# The test command: the whole suite, unit and integration (real components started by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -q "$@"
