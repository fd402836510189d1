#!/usr/bin/env bash
# Install podhealth and what it needs on Debian/Ubuntu. --test adds the real components the test
# suite starts (Prometheus, Alertmanager, node_exporter, Slurm, VictoriaMetrics, Chromium, PostgreSQL) and the
# Python test extras. Python packages go into the active virtualenv, or ./.venv when none is
# active (never into a global interpreter); scripts/podhealth and scripts/test.sh find it.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
want=(python3-venv python3-pip)
if [ "${1:-}" = "--test" ]; then
  want+=(slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager
         prometheus-node-exporter victoria-metrics chromium systemd postgresql)
fi
missing=()
for p in "${want[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# The real kubectl checks the Kubernetes fencer's work against the in-memory apiserver.
if [ "${1:-}" = "--test" ] && ! command -v kubectl >/dev/null 2>&1; then missing+=(kubectl); fi
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# Never pip-install into a global interpreter: use the caller's virtualenv if one is active,
# else ./.venv (scripts/podhealth and scripts/test.sh find it).
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PY="$VIRTUAL_ENV/bin/python"
else
  [ -x .venv/bin/python ] || $PY -m venv .venv
  PY=.venv/bin/python
fi
pip_install() { $PY -m pip install -q --disable-pip-version-check "$@"; }
if [ "${1:-}" = "--test" ]; then
  pip_install -e ".[test]"
  # checkov (the Kubernetes bundle's security scan) is heavy and pins its own versions: its own venv.
  [ -x .venv-checkov/bin/checkov ] || { ${PYTHON:-python3} -m venv .venv-checkov &&
    .venv-checkov/bin/python -m pip install -q --disable-pip-version-check checkov; } ||
    echo "note: checkov not installed; the bundle's checkov test will skip" >&2
  # CPU build of PyTorch for the burn-in and NCCL/Gloo runner tests (podhealth[burnin] on a GPU node).
  $PY -c 'import torch, numpy' 2>/dev/null || pip_install 'torch==2.13.0' numpy || echo "note: torch not installed; burn-in tests will skip" >&2
else
  pip_install -e .
fi
echo "podhealth installed: $($PY -m podhealth --version)"
