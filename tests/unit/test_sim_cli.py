"""`podhealth simulate ...`: in-process through cli.main, and once as a real separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from podhealth.cli import main
from podhealth.sim import nvml_lib
from podhealth.sim.node import SimNode
from tests.harness.proc import wait_until


def run(root: Path, *args: str) -> int:
    return main(["simulate", *args, "--root", str(root)])


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_node_inject_clear_show_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, "node", "dgx01") == 0
    assert "created dgx01 (dgx-h100, 8 GPUs, 9 HCAs" in capsys.readouterr().out
    assert run(tmp_path, "inject", "dgx01", "xid=79", "gpu=3") == 0
    assert "dgx01: injected xid=79 gpu=3 (#1)" in capsys.readouterr().out
    assert run(tmp_path, "inject", "dgx01", "fault=nvlink-crc", "gpu=0", "link=5", "rate=50") == 0
    capsys.readouterr()
    assert run(tmp_path, "show", "dgx01") == 0
    shown = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in shown["faults"]] == ["xid", "nvlink-crc"]
    assert shown["faults"][1]["rate"] == 50.0 and shown["dir"] == str(tmp_path / "dgx01")
    assert len(shown["gpus"]) == 8
    assert run(tmp_path, "list") == 0
    assert "dgx01\tdgx-h100\t8 GPUs\txid=79 gpu=3, fault=nvlink-crc gpu=0 link=5 rate=50" in capsys.readouterr().out
    assert run(tmp_path, "clear", "dgx01", "xid") == 0
    assert "cleared 1 fault(s) of kind xid" in capsys.readouterr().out
    assert run(tmp_path, "clear", "dgx01") == 0
    assert SimNode.open(tmp_path, "dgx01").state.faults == ()


def test_node_from_nvidia_smi(tmp_path: Path, own_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = own_fixtures / "nvidia_smi" / "nvidia-smi-q_2gpu_sample.txt"
    assert run(tmp_path, "node", "dgx07", "--from-nvidia-smi", str(capture)) == 0
    st = SimNode.open(tmp_path, "dgx07").state
    # 2x H100 SXM is no shipped build (the DGX and HGX have 8): generic, and the CLI says why
    assert st.profile == "generic" and len(st.gpus) == 2
    assert st.gpus[0].uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert st.gpus[0].nvlink_count == 18  # the H100 SXM's own facts fill what the capture leaves out
    err = capsys.readouterr().err
    assert "not the GPU count of dgx-h100 (8 GPUs)" in err and "podhealth profile capture" in err
    # --profile is the operator's word: kept even where the count differs
    assert run(tmp_path, "node", "dgx08", "--profile", "dgx-h100", "--from-nvidia-smi", str(capture)) == 0
    assert SimNode.open(tmp_path, "dgx08").state.profile == "dgx-h100"


@pytest.mark.parametrize("args,message", [
    (["inject", "dgx01", "fault=bogus", "gpu=1"], "bad token 'fault=bogus': unknown fault kind"),
    (["inject", "dgx01", "xid=79", "gpu=8"], "bad token 'gpu=8': node dgx01 has GPUs 0..7"),
    (["inject", "dgx01", "xid=79"], "fault xid needs gpu=<value>"),
    (["inject", "dgx09", "xid=79", "gpu=1"], "no simulated node 'dgx09'"),
    (["inject", "../x", "xid=79", "gpu=1"], "bad node name '../x'"),
    (["clear", "dgx01", "bogus"], "unknown fault kind 'bogus'"),
    (["show", "dgx09"], "no simulated node 'dgx09'"),
    (["node", "dgx01"], "node 'dgx01' already exists"),
    (["node", "dgx02", "--profile", "dgx-z100"], "unknown profile 'dgx-z100'"),
    (["node", "bad name"], "bad node name 'bad name'"),
    (["node", "dgx02", "--from-nvidia-smi", "/nonexistent/q.txt"], "/nonexistent/q.txt: [Errno 2]"),
])
def test_bad_input_exits_2_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               args: list[str], message: str) -> None:
    assert run(tmp_path, "node", "dgx01") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=dbe", "gpu=1") == 0
    capsys.readouterr()
    before = files(tmp_path)
    assert run(tmp_path, *args) == 64
    err = capsys.readouterr().err
    assert message in err and err.startswith(f"podhealth simulate {args[0]}: error:")
    assert files(tmp_path) == before


def test_not_a_capture_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\n")
    assert run(tmp_path / "nodes", "node", "dgx01", "--from-nvidia-smi", str(junk)) == 64
    assert "no 'GPU <bus id>' section found" in capsys.readouterr().err
    assert not (tmp_path / "nodes" / "dgx01").exists()


def test_inject_help_names_persist_and_it_survives_a_reboot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README's REPAIR walkthrough injects `persist=1`: the help that lists the kinds says so."""
    with pytest.raises(SystemExit):
        main(["simulate", "inject", "--help"])
    assert "persist=1" in " ".join(capsys.readouterr().out.split())
    assert run(tmp_path, "node", "dgx01") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=fallen-off-bus", "gpu=3", "persist=1") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=nvlink-down", "gpu=0", "link=5") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=reboot") == 0
    kinds = [f.kind for f in SimNode.open(tmp_path, "dgx01").state.faults]
    assert kinds == ["fallen-off-bus", "reboot"]


def test_no_subcommand_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 64
    assert "inject" in capsys.readouterr().out


def test_inject_from_another_process_reaches_a_running_nvml_view(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    nvml_lib.install(node)
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0) == 0
        env = dict(os.environ, PODHEALTH_SIM_DIR=str(tmp_path))
        done = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "dgx01", "fault=dbe", "gpu=1"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0) == 1, timeout=5,
                   what="DBE visible through NVML")
        pynvml.nvmlShutdown()
    finally:
        nvml_lib.uninstall()


def test_list_forgets_a_finished_reboot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, "node", "dgx01") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=reboot") == 0
    capsys.readouterr()
    assert run(tmp_path, "list") == 0
    line = capsys.readouterr().out.strip()
    assert line.split("\t")[3] == "healthy" and "reboot" not in line and "\tbooted " in line, line
    assert run(tmp_path, "inject", "dgx01", "fault=dbe", "gpu=1") == 0
    capsys.readouterr()
    assert run(tmp_path, "list") == 0
    assert "dbe" in capsys.readouterr().out.split("\t")[3]
