"""Jobs per node and GPU from `scontrol -d show job` / `squeue`: pure parsers on real records."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.fencing.slurmjobs import gpu_indices, parse_indices, parse_show_job, parse_squeue

OWN = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "scontrol_d_show_job_dgx_gpus.txt"


def test_own_fixture_every_form() -> None:
    jobs = {j.job_id: j for j in parse_show_job(OWN.read_text())}
    assert list(jobs) == ["4101", "4102", "4103", "4104"]
    big = jobs["4101"]
    assert (big.user, big.state, big.partition, big.name) == ("alice", "RUNNING", "gpu", "train llama 70b")
    assert big.nodes == ("dgx01", "dgx02", "dgx03")
    assert big.gpus == {n: tuple(range(8)) for n in ("dgx01", "dgx02", "dgx03")}
    assert jobs["4102"].gpus == {"dgx04": (3, 5)} and jobs["4102"].user == "bob"
    assert jobs["4103"].gpus == {} and jobs["4103"].nodes == ("dgx04",)
    assert jobs["4104"].state == "PENDING" and jobs["4104"].nodes == () and jobs["4104"].gpus == {}


def test_truncated_and_malformed_records() -> None:
    text = OWN.read_text()
    assert [j.job_id for j in parse_show_job(text[: text.index("JobId=4103")])] == ["4101", "4102"]
    cut = text[: text.index("GRES=gpu:h100:2(IDX:3") + len("GRES=gpu:h100:2(IDX:3")]
    assert parse_show_job(cut)[-1].gpus == {}  # an unclosed IDX list is no GPU, never a guess
    assert parse_show_job("") == [] and parse_show_job("garbage\nNodes=x\n") == []
    bad = "JobId=9 JobName=x\n   UserId=u(1)\n     Nodes=dgx[01 CPU_IDs=0 Mem=1 GRES=gpu(IDX:0)\n"
    assert parse_show_job(bad)[0].gpus == {}  # a broken hostlist is skipped


@pytest.mark.parametrize("text, want", [
    ("0", (0,)), ("0,2-3,5", (0, 2, 3, 5)), ("0-7", tuple(range(8))), ("N/A", ()), ("", ()), ("3-1", ()),
    ("1,x", ()), ("5,5", (5,)),
])
def test_parse_indices(text: str, want: tuple[int, ...]) -> None:
    assert parse_indices(text) == want


@pytest.mark.parametrize("gres, want", [
    ("gpu(IDX:0,2-3,5)", (0, 2, 3, 5)), ("gpu:1(IDX:0)", (0,)), ("gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)", (1,)),
    ("gg:g0(CNT:1),gpu:1(IDX:3)", (3,)), ("", ()), ("gpu:0(IDX:N/A)", ()), ("mps:100(IDX:0)", ()),
])
def test_gpu_indices(gres: str, want: tuple[int, ...]) -> None:
    assert gpu_indices(gres) == want


def test_squeue_lines() -> None:
    text = "4101|RUNNING|alice|gpu|train|with|bars\n\n4102|COMPLETING|bob|gpu|eval\nbroken line\n"
    jobs = parse_squeue(text)
    assert [(j.job_id, j.state, j.user, j.name) for j in jobs] == [
        ("4101", "RUNNING", "alice", "train|with|bars"), ("4102", "COMPLETING", "bob", "eval")]


def test_real_records_from_several_slurm_versions(shared_fixtures: Path) -> None:
    path = shared_fixtures / "slurm" / "scontrol_show_job_d_gres_idx_multi_slurm_versions_huji.txt"
    if not path.exists():
        pytest.skip(f"{path} is missing (../shared/fixtures is not beside this clone)")
    jobs = {j.job_id: j for j in parse_show_job(path.read_text())}
    assert jobs["1"].nodes == ("node-63", "node-64", "node-65") and jobs["1"].gpus == {}
    assert jobs["1"].user == "user1" and jobs["1"].state == "RUNNING"
    assert jobs["153291"].gpus == {"node-06": (0, 2, 3, 5)}  # GRES_IDX=gpu(IDX:0,2-3,5)
    assert jobs["2423559"].gpus == {"cortex-08": (5,)}  # GRES=gpu(IDX:5)
    assert jobs["1306093"].nodes == ("node-12",) and jobs["1306093"].gpus == {}  # CPU_IDs cut by Slurm
    assert jobs["25686416"].gpus == {"node-005": (3,)}
    assert jobs["25687666"].gpus == {"node-001": (1,)}
    assert jobs["134238037"].state == "PENDING" and jobs["134238037"].nodes == ()


def test_real_deepops_excerpt(shared_fixtures: Path) -> None:
    path = shared_fixtures / "slurm" / "squeue_and_scontrol_show_jobid_dd_1gpu_dgx_deepops_excerpt.txt"
    if not path.exists():
        pytest.skip(f"{path} is missing (../shared/fixtures is not beside this clone)")
    jobs = parse_show_job(path.read_text())
    assert [(j.job_id, j.user, j.gpus) for j in jobs] == [("106", "testuser", {"gpu01": (0,)})]
