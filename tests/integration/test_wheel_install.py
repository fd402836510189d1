"""The built wheel, installed into a clean virtual environment (no system site-packages, only its
declared dependencies from the configured package index), runs the agent on the simulator and
exports its operations files; the optional Kubernetes and InfluxDB clients are not pulled in.

One venv per test session (building and installing takes ~40 s here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness.proc import free_port, http_get, service, wait_until

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _clean_env() -> dict[str, str]:
    # Nothing from this checkout may leak in: no PYTHONPATH, not run from the repo root.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
            and not k.startswith("PODHEALTH_")}


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("wheel")
    env = _clean_env()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(REPO)],
                   check=True, timeout=300, env=env, cwd=base, capture_output=True)
    (wheel,) = (base / "dist").glob("podhealth-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=120, env=env, cwd=base)
    py = base / "venv" / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], timeout=400, env=env, cwd=base,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    yield wheel, base / "venv"


def test_wheel_carries_license_assets_and_no_heavy_dependencies(wheel_venv: tuple[Path, Path]) -> None:
    wheel, _ = wheel_venv
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = next(z.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    for must in ("podhealth/alerts/podhealth-rules.yml", "podhealth/alerts/alertmanager.yml",
                 "podhealth/alerts/runbooks/xid.md", "podhealth/dashboards/podhealth-gpu.json",
                 "podhealth/units/podhealth-agent.service"):
        assert must in names, must
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    core = [ln for ln in requires if "extra ==" not in ln]
    assert not any("kubernetes" in ln or "influxdb" in ln for ln in core), core
    assert 'Requires-Dist: kubernetes>=28.1; extra == "kubernetes"' in requires
    assert 'Requires-Dist: influxdb-client>=1.40; extra == "influx"' in requires


def test_agent_from_the_wheel_serves_metrics_and_health(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = wheel_venv
    py = venv / "bin" / "python"
    for missing in ("kubernetes", "influxdb_client"):  # the agent runs without the extras
        r = subprocess.run([str(py), "-c", f"import {missing}"], capture_output=True, timeout=60, cwd=tmp_path)
        assert r.returncode != 0
    port = free_port()
    argv = [str(venv / "bin" / "podhealth"), "agent", "--simulate", "dgx-h100", "--listen", f"127.0.0.1:{port}",
            "--sim-root", str(tmp_path / "sim")]
    with service("agent-from-wheel", argv, tmp_path, port=port, ready_timeout=60, cwd=tmp_path, env={"PYTHONPATH": ""},
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200):
        def temps() -> list[str]:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            return [ln for ln in body.decode().splitlines() if ln.startswith("podhealth_gpu_temperature_celsius{")]

        # the first NVML collection may land after /health first answers: wait for it
        wait_until(lambda: temps(), 30, what="GPU series on /metrics")
        assert len(temps()) == 8  # the simulated H100's eight GPUs through the real pynvml
        text = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        assert 'podhealth_build_info{' in text and 'profile="dgx-h100"' in text
        status, body = http_get(f"http://127.0.0.1:{port}/health")
        health = json.loads(body)
        assert status == 200 and health["node"] == "dgx01" and health["profile"] == "dgx-h100"
    # it really ran from the venv: the installed package, not this checkout
    where = subprocess.run([str(py), "-c", "import podhealth; print(podhealth.__file__)"], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert where.stdout.strip().startswith(str(venv)), where.stdout


def test_assets_export_from_the_wheel(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    _, venv = wheel_venv
    out = tmp_path / "ops"
    r = subprocess.run([str(venv / "bin" / "podhealth"), "assets", "export", str(out)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert r.returncode == 0, r.stderr
    got = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    want = ({f"dashboards/{p.name}" for p in (REPO / "dashboards").glob("*.json")}
            | {"alerts/podhealth-rules.yml", "alerts/alertmanager.yml"}
            | {f"alerts/runbooks/{p.name}" for p in (REPO / "alerts" / "runbooks").glob("*.md")}
            | {f"systemd/{p.name}" for p in (REPO / "systemd").glob("*.service")})
    assert got == want
    assert (out / "alerts/podhealth-rules.yml").read_bytes() == (REPO / "alerts/podhealth-rules.yml").read_bytes()
    # a second export refuses to overwrite (a site's edited copy survives), --force overwrites
    r = subprocess.run([str(venv / "bin" / "podhealth"), "assets", "export", str(out)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert r.returncode == 1 and "--force" in r.stderr


def test_a_config_that_needs_a_missing_extra_names_it(wheel_venv: tuple[Path, Path], tmp_path: Path) -> None:
    """In the venv without the extras: the real absence, not a stand-in."""
    _, venv = wheel_venv
    cfg = tmp_path / "podhealth.yaml"
    cfg.write_text("aggregator:\n  auth:\n    cluster_secret: 0123456789abcdef0123456789abcdef\n"
                   "  fencers:\n    kubernetes:\n      enabled: true\n")
    r = subprocess.run([str(venv / "bin" / "podhealth"), "config", "check", str(cfg)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=_clean_env())
    assert r.returncode == 2 and r.stderr.strip() == (
        "podhealth.yaml:6: aggregator.fencers.kubernetes.enabled: the Kubernetes fencer needs the kubernetes "
        "package, which is not installed: pip install 'podhealth[kubernetes]'")
