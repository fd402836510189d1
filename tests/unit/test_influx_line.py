"""InfluxDB line protocol comes from influxdb-client's own Point: tag values holding a newline,
comma, space, equals sign or backslash are escaped exactly as the client escapes them, and a
newline never starts a second line (which the endpoint would read as a second, broken point)."""

from __future__ import annotations

import math

import pytest
from influxdb_client import Point
from influxdb_client.domain.write_precision import WritePrecision

from podhealth.agent.export_influx import InfluxExporter, to_line
from podhealth.config import InfluxConfig
from podhealth.vocab import MetricSpec, Sample

NASTY = ["a\nb", "a,b", "a b", "a=b", "a\\b", "ends\\", "tab\there", "all\n, =\\of\r them", "x\\\ny"]


def _point(value: str, v: float = 1.5) -> str:
    return (Point("podhealth_nfs").tag("mountpoint", value).tag("node", "dgx01").field("ops", v)
            .time(7, WritePrecision.NS).to_line_protocol())


@pytest.mark.parametrize("value", NASTY)
def test_tag_values_are_escaped_as_the_client_escapes_them(value: str) -> None:
    line = to_line(Sample.of("nfs_ops", 1.5, mountpoint=value), "dgx01", 7)
    assert line == _point(value)
    assert "\n" not in line and "\r" not in line  # one point, one line
    assert len(line.split(" ")) - line.count("\\ ") == 3  # measurement+tags, field, timestamp


def test_known_escapes() -> None:
    line = to_line(Sample.of("nfs_ops", 2, mountpoint="/mnt/a b,c=d\ne\\f"), "dgx01", 7)
    assert line == r"podhealth_nfs,mountpoint=/mnt/a\ b\,c\=d\ne\f,node=dgx01 ops=2 7"  # backslash not doubled


def test_label_names_and_empty_values() -> None:
    line = to_line(Sample.of("gpu_temp_c", 50, gpu="0", uuid=""), "dgx 01", 9)
    assert line == "podhealth_gpu,gpu=0,node=dgx\\ 01 temp_c=50 9"  # an empty tag value is left out


def test_values_that_have_no_line() -> None:
    assert to_line(Sample.of("gpu_temp_c", math.nan, gpu="0"), "n", 1) is None
    assert to_line(Sample.of("gpu_temp_c", math.inf, gpu="0"), "n", 1) is None
    assert to_line(Sample.of("gpu_info", 1, gpu="0"), "n", 1, "info") is None


def test_a_batch_is_one_line_per_sample() -> None:
    specs = {"nfs_ops": MetricSpec("nfs_ops", "counter", "ops"), "gpu_info": MetricSpec("gpu_info", "info", "i")}
    ex = InfluxExporter(InfluxConfig(enabled=True, url="http://127.0.0.1:9"), "dgx01")
    ex.offer([Sample.of("nfs_ops", i, mountpoint=v) for i, v in enumerate(NASTY)] + [Sample.of("gpu_info", 1)],
             specs, ts=1.0)
    sent: list[str] = []

    class Api:
        def write(self, bucket: str, org: str, record: str) -> None:
            sent.append(record)

    ex._write_api = lambda: Api()  # type: ignore[method-assign]
    ex._write(list(ex.buffer))
    lines = sent[0].split("\n")
    assert len(lines) == len(NASTY)  # the info series is not a point; no value made an extra line
    assert all(ln.startswith("podhealth_nfs,mountpoint=") and " ops_total=" in ln for ln in lines)
