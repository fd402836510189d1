"""Node-name validation and hostlist expansion/compression, checked against real `scontrol`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from podhealth.hostnames import (
    compress_hostlist,
    expand_hostlist,
    is_valid_node_name,
    validate_node_name,
)
from tests.harness.proc import need


@pytest.mark.parametrize("name", ["dgx01", "DGX-H100-07", "a", "node_1", "rack1.dgx02", "9node", "x" * 63])
def test_valid_names(name: str) -> None:
    assert validate_node_name(name) == name
    assert is_valid_node_name(name)


@pytest.mark.parametrize(("name", "why"), [
    ("", "empty"),
    ("x" * 64, "limit is 63"),
    ("dgx[01-04]", "hostlist expression"),
    ("dgx01,dgx02", "hostlist expression"),
    ("dgx01 State=RESUME", "contains ' ='"),
    ('dgx01"', "'\"'"),
    ("dgx01\n", "contains '\\n'"),
    ("dgx01=x", "'='"),
    ("-dgx01", "start and end"),
    ("dgx01.", "start and end"),
    ("dgx\u00e901", "'\u00e9'"),
    ("ALL", "keyword"),
    ("default", "keyword"),
])
def test_invalid_names_say_why(name: str, why: str) -> None:
    with pytest.raises(ValueError, match="node name") as e:
        validate_node_name(name)
    assert why in str(e.value)
    assert not is_valid_node_name(name)


def test_non_string_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        validate_node_name(7)  # type: ignore[arg-type]


@pytest.mark.parametrize(("expr", "want"), [
    ("dgx01", ("dgx01",)),
    ("dgx[01-04,07]", ("dgx01", "dgx02", "dgx03", "dgx04", "dgx07")),
    ("dgx[8-11]", ("dgx8", "dgx9", "dgx10", "dgx11")),
    ("dgx[01-3]", ("dgx01", "dgx02", "dgx03")),
    ("dgx[1-010]", tuple(f"dgx{i}" for i in range(1, 11))),
    ("a[1-2]b[1-2]", ("a1b1", "a1b2", "a2b1", "a2b2")),
    ("dgx[1-2],gpu[05-06]", ("dgx1", "dgx2", "gpu05", "gpu06")),
    ("dgx1 dgx2,,dgx3", ("dgx1", "dgx2", "dgx3")),
    ("  dgx[2,1,1],dgx2  ", ("dgx2", "dgx1")),
    ("rack1-node[1-2]", ("rack1-node1", "rack1-node2")),
])
def test_expand(expr: str, want: tuple[str, ...]) -> None:
    assert expand_hostlist(expr) == want


@pytest.mark.parametrize(("expr", "why"), [
    ("", "empty"),
    (" , ", "empty"),
    ("dgx[3-1]", "backwards"),
    ("dgx[]", "invalid range"),
    ("dgx[a-b]", "invalid range"),
    ("dgx[\u0663]", "invalid range"),  # a non-ASCII digit
    ("dgx[1-2-3]", "invalid range"),
    ("dgx[1", "never closed"),
    ("dgx1]", "without '['"),
    ("dgx[1[2]]", "nested"),
    ("x[1-2]-y", "after the last"),
    ("dgx[0-99999]", "more than 65536"),
    ("a[0-999]b[0-999]", "more than 65536"),
    ("dgx;rm[01-02]", "not a valid Slurm node name"),
    ("ALL", "keyword"),
])
def test_expand_rejects(expr: str, why: str) -> None:
    with pytest.raises(ValueError) as e:
        expand_hostlist(expr)
    assert why in str(e.value)


def test_expand_limit_is_configurable() -> None:
    assert len(expand_hostlist("n[1-5]", limit=5)) == 5
    with pytest.raises(ValueError, match="more than 4"):
        expand_hostlist("n[1-5]", limit=4)


@pytest.mark.parametrize(("names", "want"), [
    (["dgx01", "dgx02", "dgx03", "dgx07"], "dgx[01-03,07]"),
    (["dgx07", "dgx03", "dgx01", "dgx02", "dgx02"], "dgx[01-03,07]"),
    (["dgx9", "dgx10", "dgx11"], "dgx[9-11]"),
    (["dgx09", "dgx10"], "dgx[09-10]"),
    (["dgx1", "dgx02", "dgx3"], "dgx[1,02,3]"),
    (["dgx007", "dgx8"], "dgx[007,8]"),
    (["b", "a", "dgx1"], "a,b,dgx1"),
    (["gpu1", "dgx01", "dgx02"], "dgx[01-02],gpu1"),
    (["a1b1", "a1b2", "a2b1"], "a1b[1-2],a2b1"),
    (["dgx", "dgx1"], "dgx,dgx1"),
    ([], ""),
])
def test_compress(names: list[str], want: str) -> None:
    assert compress_hostlist(names) == want


def test_compress_rejects_bad_names() -> None:
    with pytest.raises(ValueError, match="hostlist expression"):
        compress_hostlist(["dgx01", "dgx[02-03]"])


def test_round_trip() -> None:
    names = ["dgx01", "dgx02", "dgx9", "dgx10", "dgx010", "n1x", "gpu-a7", "gpu-a8", "z"]
    assert set(expand_hostlist(compress_hostlist(names))) == set(names)


def _scontrol(tmp_path: Path, what: str, arg: str) -> str:
    # `scontrol show hostnames/hostlist` is local, but it reads a slurm.conf first (and retries
    # for a minute when there is none), so give it a minimal one.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hl\nSlurmctldHost=localhost\nNodeName=n1 State=UNKNOWN\nPartitionName=p Nodes=n1\n")
    r = subprocess.run([need("scontrol"), "show", what, arg], capture_output=True, text=True, timeout=20,
                       env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("expr", ["dgx[01-04,07]", "a[1-2]b[1-2]", "dgx[8-11],gpu[05-06]", "dgx[01-3]",
                                  "dgx[1-010]", "rack1-node[1-2],x"])
def test_expand_matches_scontrol(tmp_path: Path, expr: str) -> None:
    assert expand_hostlist(expr) == tuple(_scontrol(tmp_path, "hostnames", expr).split())


@pytest.mark.parametrize("names", [["dgx01", "dgx02", "dgx03", "dgx07"], ["dgx1", "dgx02", "dgx3"],
                                   ["dgx9", "dgx10", "dgx11", "gpu1", "a"], ["a1b1", "a1b2", "a2b1"]])
def test_compressed_form_means_the_same_to_scontrol(tmp_path: Path, names: list[str]) -> None:
    assert sorted(_scontrol(tmp_path, "hostnames", compress_hostlist(names)).split()) == sorted(names)
