"""podhealth.sim.tree_ib: the simulated node's /sys/class/infiniband, read back by the collector."""

from __future__ import annotations

from pathlib import Path

from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.sim import tree_ib
from podhealth.sim.state import Fault, NodeState, default_state
from podhealth.sim.tree_write import TMP_DIR
from podhealth.vocab import Sample

T0 = 1_700_000_000.0


def _state() -> NodeState:
    return default_state("dgx01", "dgx-h100", now=T0)


def _collect(sys_root: Path) -> tuple[Sample, ...]:
    r = InfinibandCollector(sys_root).collect()
    assert r.errors == ()
    return r.samples


def _v(samples: tuple[Sample, ...], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [s.value for s in samples if s.name == name and want <= set(s.labels)]
    assert len(hits) <= 1
    return hits[0] if hits else None


def test_healthy_dgx_h100_exact_formats(tmp_path: Path) -> None:
    tree_ib.write(_state(), tmp_path, T0 + 60)
    base = tmp_path / "class" / "infiniband"
    compute = ["mlx5_0", "mlx5_1"] + [f"mlx5_{i}" for i in range(4, 10)]
    assert sorted(p.name for p in base.iterdir()) == sorted(compute + ["mlx5_bond_0"])
    port = base / "mlx5_0" / "ports" / "1"
    assert (port / "state").read_text() == "4: ACTIVE\n"
    assert (port / "phys_state").read_text() == "5: LinkUp\n"
    assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
    assert (port / "link_layer").read_text() == "InfiniBand\n"
    assert (base / "mlx5_0" / "board_id").read_text() == "MT_0000000838\n"
    assert (base / "mlx5_0" / "fw_ver").read_text() == "28.41.1000\n"
    assert (base / "mlx5_0" / "hca_type").read_text() == "MT4129\n"
    assert sorted(p.name for p in (port / "counters").iterdir()) == sorted(tree_ib.COUNTERS)
    assert sorted(p.name for p in (port / "hw_counters").iterdir()) == sorted(tree_ib.HW_COUNTERS)
    s = _collect(tmp_path)
    assert len([x for x in s if x.name == "infiniband_port_state" and x.value == 4]) == 9
    assert {_v(s, "infiniband_port_rate_bytes_per_second", device=d) for d in compute} == {5e10}
    assert _v(s, "infiniband_port_rate_bytes_per_second", device="mlx5_bond_0") == 2.5e10
    assert _v(s, "infiniband_port_stat", device="mlx5_7", counter="symbol_error") == 0


def test_counters_grow_with_time(tmp_path: Path) -> None:
    st = _state()
    tree_ib.write(st, tmp_path, T0 + 10)
    a = _collect(tmp_path)
    tree_ib.write(st, tmp_path, T0 + 70)
    b = _collect(tmp_path)
    for name in ("infiniband_port_data_transmitted_bytes", "infiniband_port_data_received_bytes",
                 "infiniband_port_packets_transmitted"):
        va, vb = _v(a, name, device="mlx5_0"), _v(b, name, device="mlx5_0")
        assert va is not None and vb is not None and vb > va
        # a compute port moves ~6 GB/s on average: a realistic fraction of 50 GB/s
        if name == "infiniband_port_data_transmitted_bytes":
            assert 1e9 < (vb - va) / 60 < 5e10
    wa = _v(a, "infiniband_port_hw_stat", device="mlx5_0", counter="rx_write_requests")
    wb = _v(b, "infiniband_port_hw_stat", device="mlx5_0", counter="rx_write_requests")
    assert wa is not None and wb is not None and wb > wa
    assert not (tmp_path / TMP_DIR).exists() or list((tmp_path / TMP_DIR).iterdir()) == []


def test_faults(tmp_path: Path) -> None:
    st = (_state()
          .with_fault(Fault("ib-down", T0 + 100, device="mlx5_7"))
          .with_fault(Fault("ib-rate", T0 + 100, device="mlx5_4", rate=200.0))
          .with_fault(Fault("ib-symbol-errors", T0 + 100, device="mlx5_5", rate=10.0)))
    tree_ib.write(st, tmp_path, T0 + 50)  # before the faults
    before = _collect(tmp_path)
    assert _v(before, "infiniband_port_state", device="mlx5_7") == 4
    tree_ib.write(st, tmp_path, T0 + 160)
    after = _collect(tmp_path)
    port3 = tmp_path / "class/infiniband/mlx5_7/ports/1"
    assert (port3 / "state").read_text() == "1: DOWN\n"
    assert (port3 / "phys_state").read_text() == "2: Polling\n"
    assert _v(after, "infiniband_port_stat", device="mlx5_7", counter="link_downed") == 1
    assert _v(before, "infiniband_port_stat", device="mlx5_7", counter="link_downed") == 0
    # no traffic while down: data counters stop at the moment of the fault
    tree_ib.write(st, tmp_path, T0 + 400)
    later = _collect(tmp_path)
    assert _v(later, "infiniband_port_data_transmitted_bytes", device="mlx5_7") == \
        _v(after, "infiniband_port_data_transmitted_bytes", device="mlx5_7")
    assert (tmp_path / "class/infiniband/mlx5_4/ports/1/rate").read_text() == "200 Gb/sec (4X HDR)\n"
    assert _v(after, "infiniband_port_rate_bytes_per_second", device="mlx5_4") == 2.5e10
    assert _v(after, "infiniband_port_stat", device="mlx5_5", counter="symbol_error") == 600  # 10/s x 60 s
    assert _v(later, "infiniband_port_stat", device="mlx5_5", counter="symbol_error") == 3000
    # other ports untouched
    assert _v(later, "infiniband_port_stat", device="mlx5_0", counter="symbol_error") == 0
    assert _v(later, "infiniband_port_state", device="mlx5_0") == 4


def test_symbol_error_saturates_at_16_bits(tmp_path: Path) -> None:
    st = _state().with_fault(Fault("ib-symbol-errors", T0, device="mlx5_0", rate=100.0))
    tree_ib.write(st, tmp_path, T0 + 7 * 86400)
    assert _v(_collect(tmp_path), "infiniband_port_stat", device="mlx5_0", counter="symbol_error") == 65535


def test_rewrite_leaves_unchanged_files_alone(tmp_path: Path) -> None:
    st = _state()
    tree_ib.write(st, tmp_path, T0 + 10)
    f = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error"
    ino = f.stat().st_ino
    tree_ib.write(st, tmp_path, T0 + 20)
    assert f.stat().st_ino == ino  # same content, not replaced
    g = tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
    ino_g = g.stat().st_ino
    tree_ib.write(st, tmp_path, T0 + 30)
    assert g.stat().st_ino != ino_g  # replaced by rename, never rewritten in place
