"""The InfluxDB v2 exporter against a real VictoriaMetrics on loopback, read back via its query API."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from pathlib import Path

import pytest

from podhealth.agent.export_influx import InfluxExporter, to_line
from podhealth.config import InfluxConfig
from podhealth.vocab import MetricSpec, Sample
from tests.harness.proc import free_port, http_get, need, service, wait_until

SPECS = {"gpu_temperature_celsius": MetricSpec("gpu_temperature_celsius", "gauge", "t"),
         "gpu_energy_joules": MetricSpec("gpu_energy_joules", "counter", "e"),
         "gpu_info": MetricSpec("gpu_info", "info", "i")}


def test_line_protocol_shape() -> None:
    s = Sample.of("gpu_temperature_celsius", 71.5, gpu=0, uuid="GPU-a b", model="NVIDIA H100 80GB HBM3")
    line = to_line(s, "dgx01", 123)
    assert line == r"podhealth_gpu,gpu=0,model=NVIDIA\ H100\ 80GB\ HBM3,node=dgx01,uuid=GPU-a\ b temperature_celsius=71.5 123"
    # influxdb-client's Point writes a whole float without ".0" (still a float: integers carry an "i")
    assert to_line(Sample.of("gpu_energy_joules", 5, gpu=0), "n", 1, "counter").split()[1] == "energy_joules_total=5"
    assert to_line(Sample.of("gpu_info", 1, gpu=0), "n", 1, "info") is None


def test_buffer_is_bounded_and_counts_drops() -> None:
    ex = InfluxExporter(InfluxConfig(enabled=True, url="http://127.0.0.1:9", buffer_points=10, batch_size=5), "n")
    ex.offer([Sample.of("gpu_temperature_celsius", i, gpu=i) for i in range(25)], SPECS)
    assert len(ex.buffer) == 10 and ex.stats.dropped == 15
    assert "gpu=24" in (ex.line(ex.buffer[-1]) or "")


async def test_unreachable_endpoint_keeps_points_and_never_blocks() -> None:
    ex = InfluxExporter(InfluxConfig(enabled=True, url=f"http://127.0.0.1:{free_port()}", batch_size=5), "n",
                        write_timeout=1.0)
    ex.offer([Sample.of("gpu_temperature_celsius", 1, gpu=0)], SPECS)
    assert await ex.flush_once() is False
    assert len(ex.buffer) == 1 and ex.stats.failures == 1


@pytest.fixture
def victoria(tmp_path: Path):  # type: ignore[no-untyped-def]
    vm = need("victoria-metrics")
    port = free_port()
    with service("victoria-metrics", [vm, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={tmp_path / 'vm'}",
                                      "-retentionPeriod=1d", "-search.latencyOffset=0s", "-search.disableCache",
                                      "-loggerLevel=WARN"], tmp_path, port=port,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200) as svc:
        yield svc


async def test_roundtrip_through_victoriametrics(victoria) -> None:  # type: ignore[no-untyped-def]
    ex = InfluxExporter(InfluxConfig(enabled=True, url=victoria.url, batch_size=100), "dgx01")
    ex.offer([Sample.of("gpu_temperature_celsius", 30 + i, gpu=i, uuid=f"GPU-{i}") for i in range(8)]
             + [Sample.of("gpu_energy_joules", 1000, gpu=0, uuid="GPU-0")], SPECS)
    assert await ex.flush_once() and ex.stats.written == 9 and not ex.buffer

    def query(q: str) -> list[dict]:  # type: ignore[type-arg]
        http_get(f"{victoria.url}/internal/force_flush")
        code, body = http_get(f"{victoria.url}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        return json.loads(body)["data"]["result"] if code == 200 else []

    res = await asyncio.get_running_loop().run_in_executor(
        None, lambda: wait_until(lambda: len(query("podhealth_gpu_temperature_celsius")) == 8 and query(
            "podhealth_gpu_temperature_celsius"), 20, 0.2, "VictoriaMetrics to show 8 GPU series"))
    by_gpu = {r["metric"]["gpu"]: float(r["value"][1]) for r in res}  # type: ignore[union-attr]
    assert by_gpu == {str(i): 30.0 + i for i in range(8)}
    assert all(r["metric"]["node"] == "dgx01" for r in res)  # type: ignore[union-attr]
    energy = query("podhealth_gpu_energy_joules_total")
    assert [float(r["value"][1]) for r in energy] == [1000.0]
    await ex.stop()


def test_agent_pushes_its_samples(victoria, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The running agent (simulated DGX H100) feeds the exporter once per collection."""
    import sys

    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"exporters:\n  influxdb: {{enabled: true, url: '{victoria.url}', flush_interval: 1, batch_size: 500}}\n"
                   "collectors:\n  nvml: {interval: 1, timeout: 2}\n")

    def query(q: str) -> list[dict]:  # type: ignore[type-arg]
        http_get(f"{victoria.url}/internal/force_flush")
        code, body = http_get(f"{victoria.url}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        return json.loads(body)["data"]["result"] if code == 200 else []

    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp_path / "sim"), "--node", "dgx07", "--listen", f"127.0.0.1:{port}"],
                 tmp_path, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, ready_timeout=60):
        res = wait_until(lambda: len(query('podhealth_gpu_temperature_celsius{node="dgx07"}')) == 8
                         and query('podhealth_gpu_temperature_celsius{node="dgx07"}'), 30, 0.3,
                         "the agent's GPU temperatures in VictoriaMetrics")
        assert {r["metric"]["gpu"] for r in res} == {str(i) for i in range(8)}  # type: ignore[union-attr]
        assert query('podhealth_infiniband_port_data_received_bytes_total{node="dgx07"}')
