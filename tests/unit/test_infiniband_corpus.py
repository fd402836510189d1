"""The infiniband collector on the real-capture corpus (../shared/fixtures/infiniband).

The corpus holds prometheus/procfs' and node_exporter's sysfs fixtures both as .ttar archives and
as expanded trees; a tiny ttar reader here checks that both give the same samples.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.vocab import Sample

TREES = {"procfs_tree": "procfs_sys_class_infiniband.ttar",
         "node_exporter_tree": "node_exporter_sys_class_infiniband.ttar"}


def extract_ttar(text: str, dest: Path) -> int:
    """Expand a ttar archive (prometheus' text tar: Directory:/Path:+Lines:/SymlinkTo:/Mode:
    entries; a last line ending in 'EOF' has no trailing newline). Returns files written."""
    lines = text.split("\n")
    i, files = 0, 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("Directory: "):
            (dest / line[len("Directory: "):]).mkdir(parents=True, exist_ok=True)
        elif line.startswith("Path: "):
            path = dest / line[len("Path: "):]
            header = lines[i]
            i += 1
            if header.startswith("SymlinkTo: "):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(header[len("SymlinkTo: "):])
                continue
            if not header.startswith("Lines: "):
                raise ValueError(f"ttar line {i}: expected 'Lines:', got {header[:40]!r}")
            n = int(header[len("Lines: "):])
            body = lines[i:i + n]
            i += n
            content = "\n".join(body) + "\n" if n else ""
            if body and body[-1].endswith("EOF"):
                content = "\n".join(body)[:-3]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content.replace("NULLBYTE", "\0"))
            files += 1
    return files


def _sys_dir(root: Path) -> Path:
    hits = [p.parent.parent for p in root.rglob("class/infiniband") if p.parent.name == "class"]
    assert len(hits) == 1, hits
    return hits[0]


def _series(samples: tuple[Sample, ...]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for s in samples}


def _one(samples: tuple[Sample, ...], name: str, **labels: str) -> float:
    want = set(labels.items())
    hits = [s.value for s in samples if s.name == name and want <= set(s.labels)]
    assert len(hits) == 1, f"{name}{labels}: {hits}"
    return hits[0]


@pytest.mark.parametrize("tree", sorted(TREES))
def test_expanded_tree_equals_ttar(shared_fixtures: Path, tmp_path: Path, tree: str) -> None:
    base = shared_fixtures / "infiniband"
    n = extract_ttar((base / TREES[tree]).read_text(), tmp_path)
    assert n > 50
    from_ttar = InfinibandCollector(_sys_dir(tmp_path)).collect()
    expanded = InfinibandCollector(base / tree / "sys").collect()
    assert from_ttar.errors == expanded.errors == ()
    assert _series(from_ttar.samples) == _series(expanded.samples)
    assert len(from_ttar.samples) == len(_series(from_ttar.samples))  # no duplicate series


def test_procfs_tree_values(shared_fixtures: Path) -> None:
    r = InfinibandCollector(shared_fixtures / "infiniband" / "procfs_tree" / "sys").collect()
    s = r.samples
    assert {x.label("device") for x in s if x.name == "infiniband_info"} == {"hfi1_0", "mlx4_0", "mlx5_0"}
    assert _one(s, "infiniband_info", device="hfi1_0", hca_type="", firmware_version="1.27.0") == 1
    assert _one(s, "infiniband_port_rate_bytes_per_second", device="hfi1_0") == 1.25e10
    assert _one(s, "infiniband_port_rate_bytes_per_second", device="mlx4_0", port="2") == 5e9
    assert _one(s, "infiniband_port_rate_bytes_per_second", device="mlx5_0") == 3.125e9  # 25 Gb/sec (1X EDR)
    # this capture's mlx5_0 says "4: ACTIVE" in phys_state: exported as it is, not corrected
    assert _one(s, "infiniband_port_physical_state", device="mlx5_0", state="ACTIVE") == 4
    assert _one(s, "infiniband_port_data_transmitted_bytes", device="mlx5_0") == 2880761508848 * 4
    assert _one(s, "infiniband_port_data_received_bytes", device="hfi1_0") == 345091702026 * 4
    assert _one(s, "infiniband_port_hw_stat", device="mlx5_0", counter="req_cqe_error") == 3481
    assert len([x for x in s if x.name == "infiniband_port_hw_stat"]) == 25
    assert _one(s, "infiniband_port_stat", device="mlx4_0", port="2", counter="port_xmit_wait") == 3846
    # mlx4_0 port 2's link_layer file has a blank second line
    assert _one(s, "infiniband_port_link_layer_info", device="mlx4_0", port="2", link_layer="InfiniBand") == 1


def test_node_exporter_tree_values(shared_fixtures: Path) -> None:
    r = InfinibandCollector(shared_fixtures / "infiniband" / "node_exporter_tree" / "sys").collect()
    s = r.samples
    assert _one(s, "infiniband_port_rate_bytes_per_second", device="i40iw0") == 1.25e9  # "10 Gb/sec (4X)"
    assert _one(s, "infiniband_port_stat", device="mlx4_0", port="1", counter="port_xmit_wait") == 4294967295
    assert _one(s, "infiniband_port_packets_received", device="mlx4_0", port="1") == 6825908347
    assert _one(s, "infiniband_port_data_transmitted_bytes", device="mlx4_0", port="1") == 3733440 * 4
    # counters_ext/ (mlx4's 64-bit duplicates) is not a counters/ file and is not read
    assert not [x for x in s if "_64" in x.label("counter")]


def test_truncated_ttar_extract_is_handled(shared_fixtures: Path, tmp_path: Path) -> None:
    """Half an archive gives half a tree: devices with missing files, never an exception."""
    text = (shared_fixtures / "infiniband" / TREES["procfs_tree"]).read_text()
    cut = text[: len(text) // 2]
    cut = cut[: cut.rfind("\nPath: ")]  # stop at an entry boundary so the reader stays valid
    extract_ttar(cut, tmp_path)
    r = InfinibandCollector(_sys_dir(tmp_path)).collect()
    assert any(x.name == "infiniband_info" for x in r.samples)
    full = InfinibandCollector(shared_fixtures / "infiniband" / "procfs_tree" / "sys").collect()
    assert 0 < len(r.samples) < len(full.samples)


def test_ttar_reader_eof_marker(tmp_path: Path) -> None:
    text = ("Directory: sys/x\nMode: 755\n# ttar - -\nPath: sys/x/a\nLines: 1\n0a7f:bc12EOF\nMode: 644\n"
            "# ttar - -\nPath: sys/x/b\nLines: 2\nInfiniBand\n\nMode: 644\n")
    assert extract_ttar(text, tmp_path) == 2
    assert (tmp_path / "sys/x/a").read_text() == "0a7f:bc12"
    assert (tmp_path / "sys/x/b").read_text() == "InfiniBand\n\n"
    shutil.rmtree(tmp_path / "sys")
