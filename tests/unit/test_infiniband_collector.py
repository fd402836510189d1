"""The infiniband collector on the project's own DGX H100 fixture tree and broken copies of it."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.infiniband import InfinibandCollector, create
from podhealth.config import Config, PathsConfig
from podhealth.vocab import Sample


def _cfg(sys_root: Path) -> Config:
    return Config(paths=PathsConfig(sysfs_root=sys_root))


@pytest.fixture
def dgx_sys(own_fixtures: Path, tmp_path: Path) -> Path:
    """A writable copy of tests/fixtures/infiniband/dgx_h100/sys."""
    dst = tmp_path / "sys"
    shutil.copytree(own_fixtures / "infiniband" / "dgx_h100" / "sys", dst)
    return dst


def _index(samples: tuple[Sample, ...]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for s in samples:
        key = (s.name, s.labels)
        assert key not in out, f"duplicate series {key}"
        out[key] = s.value
    return out


def _get(samples: tuple[Sample, ...], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [s.value for s in samples if s.name == name and want <= set(s.labels)]
    assert len(hits) <= 1, f"{name}{labels} matched {len(hits)} series"
    return hits[0] if hits else None


def test_registered() -> None:
    assert REGISTRY["infiniband"] == "podhealth.collectors.infiniband:create"


def test_dgx_fixture(dgx_sys: Path) -> None:
    col = factory("infiniband")(_cfg(dgx_sys))
    r = col.collect()
    assert r.errors == ()
    _index(r.samples)  # no duplicate series
    info = [s for s in r.samples if s.name == "infiniband_info"]
    assert [dict(s.labels) for s in info][0] == {
        "device": "mlx5_0", "board_id": "MT_0000000838", "firmware_version": "28.39.1002", "hca_type": "MT4129"}
    assert len(info) == 3
    assert _get(r.samples, "infiniband_port_state", device="mlx5_0", port="1", state="ACTIVE") == 4
    assert _get(r.samples, "infiniband_port_state", device="mlx5_1", port="1", state="DOWN") == 1
    assert _get(r.samples, "infiniband_port_physical_state", device="mlx5_1", state="Polling") == 2
    assert _get(r.samples, "infiniband_port_rate_bytes_per_second", device="mlx5_0") == 5e10
    assert _get(r.samples, "infiniband_port_rate_bytes_per_second", device="mlx5_2") == 2.5e10
    assert _get(r.samples, "infiniband_port_link_layer_info", device="mlx5_0", link_layer="InfiniBand") == 1
    # data counters are 4-byte words on the wire
    assert _get(r.samples, "infiniband_port_data_transmitted_bytes", device="mlx5_0") == 48213375190664 * 4
    assert _get(r.samples, "infiniband_port_data_received_bytes", device="mlx5_0") == 47766291045312 * 4
    assert _get(r.samples, "infiniband_port_packets_transmitted", device="mlx5_0") == 47083374211
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_1", counter="symbol_error") == 65535
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_1", counter="link_downed") == 4
    assert _get(r.samples, "infiniband_port_hw_stat", device="mlx5_0", counter="local_ack_timeout_err") == 3
    # the dedicated data/packet counters are not repeated under infiniband_port_stat
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="port_xmit_data") is None
    # 21 counters = 4 dedicated + 17 generic, 20 hw counters, per port
    assert len([s for s in r.samples if s.name == "infiniband_port_stat"]) == 3 * 17
    assert len([s for s in r.samples if s.name == "infiniband_port_hw_stat"]) == 3 * 20
    assert {s.name for s in r.samples} <= set(col.metrics)


def test_hw_counters_can_be_left_unread(dgx_sys: Path) -> None:
    """collectors.infiniband.hw_counters: false reads what node_exporter reads, nothing of hw_counters/."""
    from podhealth.config import CollectorsConfig, InfinibandConfig

    full = InfinibandCollector(dgx_sys).collect().samples
    cfg = Config(paths=PathsConfig(sysfs_root=dgx_sys),
                 collectors=CollectorsConfig(infiniband=InfinibandConfig(hw_counters=False)))
    # a malformed hw_counters file would be a problem if it were read
    hw = next(dgx_sys.glob("class/infiniband/*/ports/*/hw_counters"))
    (hw / "duplicate_request").write_text("not a number\n")
    assert InfinibandCollector(dgx_sys).collect().errors != ()
    r = create(cfg).collect()
    assert r.errors == ()
    assert sum(1 for s in full if s.name == "infiniband_port_hw_stat") > 0
    assert [s for s in full if s.name != "infiniband_port_hw_stat"] == list(r.samples)


def test_malformed_counter_skips_that_counter_only(dgx_sys: Path) -> None:
    port = dgx_sys / "class/infiniband/mlx5_0/ports/1"
    (port / "counters/symbol_error").write_text("not-a-number\n")
    (port / "hw_counters/out_of_buffer").write_text("")  # truncated to nothing
    os.unlink(port / "counters/link_downed")
    os.symlink("/nonexistent/podhealth-test", port / "counters/link_downed")  # unreadable
    r = create(_cfg(dgx_sys)).collect()
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="symbol_error") is None
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="link_downed") is None
    assert _get(r.samples, "infiniband_port_hw_stat", device="mlx5_0", counter="out_of_buffer") is None
    # the rest of the device, and the other devices, still flow
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="port_xmit_wait") == 1286453357
    assert _get(r.samples, "infiniband_port_state", device="mlx5_0") == 4
    assert _get(r.samples, "infiniband_port_stat", device="mlx5_1", counter="symbol_error") == 65535
    assert len(r.errors) == 3
    assert any("mlx5_0/ports/1/counters/symbol_error" in e for e in r.errors)
    assert any("mlx5_0/ports/1/counters/link_downed" in e for e in r.errors)


def test_missing_port_attributes_and_board_id(dgx_sys: Path) -> None:
    dev = dgx_sys / "class/infiniband/mlx5_2"
    os.unlink(dev / "board_id")
    os.unlink(dev / "ports/1/rate")
    (dev / "ports/1/state").write_text("garbage\n")
    shutil.rmtree(dev / "ports/1/hw_counters")
    r = create(_cfg(dgx_sys)).collect()
    assert _get(r.samples, "infiniband_info", device="mlx5_2", board_id="") == 1
    assert _get(r.samples, "infiniband_port_rate_bytes_per_second", device="mlx5_2") is None
    assert _get(r.samples, "infiniband_port_state", device="mlx5_2") is None
    assert _get(r.samples, "infiniband_port_physical_state", device="mlx5_2") == 5
    assert [e for e in r.errors if "mlx5_2/ports/1/state" in e]
    assert not [s for s in r.samples if s.name == "infiniband_port_hw_stat" and s.label("device") == "mlx5_2"]


def test_no_infiniband_class_is_not_an_exception(tmp_path: Path) -> None:
    col = InfinibandCollector(tmp_path)
    r = col.collect()
    assert r.samples == ()
    assert len(r.errors) == 1 and "no InfiniBand devices" in r.errors[0]
    col.close()


def test_device_without_ports(tmp_path: Path) -> None:
    (tmp_path / "class/infiniband/mlx5_9").mkdir(parents=True)
    (tmp_path / "class/infiniband/mlx5_9/fw_ver").write_text("28.39.1002\n")
    r = create(_cfg(tmp_path)).collect()
    assert [s.name for s in r.samples] == ["infiniband_info"]
    assert r.errors == ("mlx5_9: no ports",)


def test_a_long_lived_collector_follows_the_tree(dgx_sys: Path) -> None:
    """The agent keeps one collector for its lifetime, and it remembers listings and values
    between collections: whatever changes in the tree, it must report exactly what a new
    collector reading the tree for the first time reports."""
    col = create(_cfg(dgx_sys))
    port = dgx_sys / "class/infiniband/mlx5_0/ports/1"
    changes = [
        lambda: (port / "counters/port_xmit_data").write_text("48213375190700\n"),  # in place
        lambda: (port / "counters/symbol_error").write_text("x\n"),  # malformed
        lambda: (port / "counters/symbol_error").write_text("7\n"),  # and back
        lambda: (port / "counters/new_counter").write_text("5\n"),  # a file appears
        lambda: os.unlink(port / "counters/link_downed"),  # and one goes
        lambda: (port / "state").write_text("1: DOWN\n"),
        lambda: shutil.rmtree(port / "hw_counters"),
        lambda: (dgx_sys / "class/infiniband/mlx5_1/fw_ver").write_text("28.40.1000\n"),
        lambda: shutil.rmtree(dgx_sys / "class/infiniband/mlx5_2"),  # a device goes
    ]
    first = col.collect()
    for i, change in enumerate([lambda: None, *changes]):
        change()
        again, fresh = col.collect(), InfinibandCollector(dgx_sys).collect()
        assert again.samples == fresh.samples, f"after change {i}"
        assert again.errors == fresh.errors, f"after change {i}"
    assert _get(again.samples, "infiniband_port_stat", device="mlx5_0", counter="new_counter") == 5
    assert _get(again.samples, "infiniband_port_stat", device="mlx5_0", counter="symbol_error") == 7
    assert _get(again.samples, "infiniband_port_state", device="mlx5_0", state="DOWN") == 1
    assert first.samples != again.samples


def test_unchanged_values_are_handed_on_as_the_same_samples(dgx_sys: Path) -> None:
    """What lets /metrics reuse the rendered line of a series (agent/metrics/blocks.py)."""
    col = create(_cfg(dgx_sys))
    a = col.collect().samples
    (dgx_sys / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").write_text("1\n")
    b = col.collect().samples
    assert len(a) == len(b)
    changed = [(x, y) for x, y in zip(a, b) if x is not y]
    assert [(y.name, y.value) for _, y in changed] == [("infiniband_port_data_transmitted_bytes", 4.0)]


def test_a_listing_taken_right_after_a_change_is_checked_again(dgx_sys: Path) -> None:
    """The kernel's mtime clock is coarse: a counter file added in the same tick as the last
    change leaves the directory's mtime as it was. A listing that recent is not trusted."""
    counters = dgx_sys / "class/infiniband/mlx5_0/ports/1/counters"
    stamp = time.time_ns()
    os.utime(counters, ns=(stamp, stamp))
    col = create(_cfg(dgx_sys))
    col.collect()
    (counters / "late_counter").write_text("3\n")
    os.utime(counters, ns=(stamp, stamp))  # as if written within the same tick
    assert _get(col.collect().samples, "infiniband_port_stat", device="mlx5_0", counter="late_counter") == 3


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _age_dirs(root: Path, seconds: float = 3600.0) -> None:
    """Make every directory look untouched for a while, as sysfs directories are after boot."""
    old = time.time() - seconds
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        os.utime(d, (old, old))


def test_files_stay_open_and_are_read_again_from_the_start(dgx_sys: Path) -> None:
    """One pread per counter per collection in settled directories (sysfs regenerates a file
    read from offset 0): a value written in place is seen; a directory whose file was replaced
    by rename is read with open/read/close (its fds let go) until it settles; close() lets go."""
    from podhealth.collectors import infiniband

    files = sum(1 for p in (dgx_sys / "class/infiniband").rglob("*") if p.is_file())
    base, kept0 = _open_fds(), infiniband._Kept.open_fds
    col = create(_cfg(dgx_sys))
    try:
        _age_dirs(dgx_sys)
        first = col.collect()  # first look at each directory: nothing is settled yet
        assert _open_fds() == base
        col.collect()  # settled now: every file is opened once and kept
        held = _open_fds() - base
        assert held >= 0.9 * files and infiniband._Kept.open_fds - kept0 == held
        assert col.collect().samples == first.samples and _open_fds() - base == held
        counters = dgx_sys / "class/infiniband/mlx5_0/ports/1/counters"
        (counters / "symbol_error").write_text("11\n")  # in place, as the kernel's counters change
        r = col.collect()
        assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="symbol_error") == 11
        assert _open_fds() - base == held  # nothing opened again, nothing leaked
        tmp = counters / ".tmp"
        tmp.write_text("12\n")
        os.replace(tmp, counters / "symbol_error")  # replaced by rename: the directory changes
        r = col.collect()
        assert _get(r.samples, "infiniband_port_stat", device="mlx5_0", counter="symbol_error") == 12
        assert r.samples == InfinibandCollector(dgx_sys).collect().samples
        in_dir = sum(1 for _ in counters.iterdir())
        assert _open_fds() - base == held - in_dir
        _age_dirs(dgx_sys)
        col.collect()
        col.collect()
        assert _open_fds() - base == held
    finally:
        col.close()
    assert _open_fds() == base and infiniband._Kept.open_fds == kept0


def test_kept_fds_are_capped(dgx_sys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from podhealth.collectors import infiniband

    monkeypatch.setattr(infiniband, "MAX_KEPT_FDS", infiniband._Kept.open_fds + 7)
    base = _open_fds()
    _age_dirs(dgx_sys)
    col = create(_cfg(dgx_sys))
    try:
        for _ in range(4):
            r = col.collect()
        assert _open_fds() - base == 7
        assert r.samples == InfinibandCollector(dgx_sys).collect().samples and r.errors == ()
    finally:
        col.close()
    assert _open_fds() == base
