#!/usr/bin/env bash
# Long fuzz run of every parser of outside input (tests/unit/test_fuzz_parsers.py).
#   scripts/fuzz.sh [EXAMPLES_PER_TEST] [SEED] [pytest args...]
# The unit suite runs the same tests with ~60 derandomized examples; here each test draws
# EXAMPLES_PER_TEST (default 5000) random ones. The seed is printed: rerun with it to reproduce
# a failure (hypothesis also prints the failing input and a @reproduce_failure blob).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
examples="${1:-5000}"
seed="${2:-$RANDOM$RANDOM}"
shift $(( $# < 2 ? $# : 2 ))
echo "fuzz: ${examples} examples per test, seed ${seed}" >&2
PODHEALTH_FUZZ_EXAMPLES="$examples" exec "$PY" -m pytest tests/unit/test_fuzz_parsers.py -q -p no:randomly \
  -p no:cacheprovider --timeout=0 --hypothesis-seed="$seed" "$@"
