#!/usr/bin/env bash
# Install podhealth and what it needs on Debian/Ubuntu. --test adds the real components the test
# suite starts (Prometheus, Alertmanager, node_exporter, Slurm, VictoriaMetrics, Chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
APT_TEST="slurmctld slurmd slurm-client munge prometheus prometheus-alertmanager
  prometheus-node-exporter victoria-metrics chromium systemd"
want=(python3-venv)
if [ "${1:-}" = "--test" ]; then want+=($APT_TEST); fi
missing=()
for p in "${want[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# The real kubectl checks the Kubernetes fencer's work against the in-memory apiserver.
if [ "${1:-}" = "--test" ] && ! command -v kubectl >/dev/null 2>&1; then missing+=(kubectl); fi
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
extras="."
[ "${1:-}" = "--test" ] && extras=".[test]"
$PY -m pip install -q --disable-pip-version-check -e "$extras"
if [ "${1:-}" = "--test" ]; then
  # CPU build of PyTorch for the burn-in and NCCL/Gloo runner tests (podhealth[burnin] on a GPU node).
  $PY -c 'import torch' 2>/dev/null || $PY -m pip install -q --disable-pip-version-check 'torch==2.13.0'
fi
