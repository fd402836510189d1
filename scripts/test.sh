#!/usr/bin/env bash
# The test command: the whole suite, unit and integration (real components started by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m pytest -q "$@"
