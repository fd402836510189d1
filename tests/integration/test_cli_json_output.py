"""Every command that offers `--format json` (and `check --format junit`) prints only its document
on stdout: logs go to stderr through main()'s prologue (issue 30 §5). Before it, only 3 of 13
commands set up logging and the rest logged to stdout, so `check --format json` began with a
"collector disabled" line and did not parse.

The commands run as a person runs them, against a one-node simulated pod (`simulate fleet
--nodes 1 --no-slurm`: a simulated agent and an aggregator with the dry-run fencer). The list of
commands is read from the parser itself, so a command added later is covered without an edit
here (its required arguments are filled from ARGS).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from podhealth import cli
from tests.harness.proc import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

READY_LINE = "Ctrl-C (or SIGTERM) stops the whole pod."
NODE = "dgx01"


def json_leaves() -> list[tuple[str, ...]]:
    """Every command path whose --format offers json, in --help order."""
    out: list[tuple[str, ...]] = []

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            fmt = next((a for a in p._actions if "--format" in a.option_strings), None)
            if fmt is not None and "json" in (fmt.choices or ()):
                out.append(path)
            return
        for s in subs:
            for name, sp in s.choices.items():
                walk(sp, (*path, name))
    walk(cli.build_parser(), ())
    return out


def required(path: tuple[str, ...]) -> list[argparse.Action]:
    p: argparse.ArgumentParser = cli.build_parser()
    for word in path:
        sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = sub.choices[word]
    return [a for a in p._actions if a.dest != "help" and (not a.option_strings or a.required)
            and a.nargs not in ("?", "*")]


@dataclass
class Pod:
    root: Path
    aggregator: str
    admin_token: str
    agent: str
    aggregator_config: Path


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    root = tmp_path_factory.mktemp("jsonpod")
    log = root.parent / f"{root.name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "podhealth", "simulate", "fleet", "--nodes", "1", "--no-slurm",
                                 "--root", str(root)], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        try:
            def ready() -> bool:
                assert proc.poll() is None, log.read_text(errors="replace")
                return READY_LINE in log.read_text(errors="replace")
            wait_until(ready, timeout=150, interval=0.2, what="the pod's banner")
            info = json.loads((root / "_fleet" / "fleet.json").read_text())
            yield Pod(root, info["aggregator"]["url"], info["admin_token"], info["agents"][0]["url"],
                      Path(info["aggregator"]["config"]))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


def argv_for(path: tuple[str, ...], pod: Pod, tmp: Path) -> list[str]:
    """How a person runs `path` on this pod, with --format json."""
    fill = {"node": NODE, "check": "xid", "reason": "json output test", "duration": "1h", "dir": str(tmp / "assets"),
            "file": str(tmp / "profile.yaml"), "tokens": "xid=13", "id": "1", "gpus": "0"}
    argv = list(path)
    for a in required(path):
        value = fill[a.dest]
        argv += [a.option_strings[0], value] if a.option_strings else [value]
    top = path[0]
    if top == "fleet":  # the fleet's own options go before the action
        argv[1:1] = ["--url", pod.aggregator, f"--token={pod.admin_token}"]  # a token may begin with "-"
    extra = {
        "check": ["--node", NODE, "--aggregator", pod.aggregator, "--config", str(pod.aggregator_config)],
        "burnin": ["--duration", "1", "--device", "cpu", "--gpus", "0", "--size", "64", "--watch", "none"],
        "nccl": ["--device", "cpu", "--nproc", "2", "--min-bytes", "1024", "--max-bytes", "4096", "--iters", "1",
                 "--warmup", "0"],
        "profile": ["--url", pod.agent],
        "perfprobe": ["--budget", "10", "--gpus", "0"],
    }
    return argv + extra.get(top, []) + ["--format", "json"]


def run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    # --log-level info: a command that logged to stdout would now surely break its JSON
    return subprocess.run([sys.executable, "-m", "podhealth", "--log-level", "info", *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp, stdin=subprocess.DEVNULL)


LEAVES = json_leaves()


def test_the_commands_with_json_output_are_found() -> None:
    # the discovery itself can fail: these are known to offer --format json
    assert {("check",), ("fleet", "status"), ("profile", "diff"), ("assets", "list"), ("burnin",)} <= set(LEAVES)


@pytest.mark.parametrize("path", LEAVES, ids=[" ".join(p) for p in LEAVES])
def test_stdout_is_one_json_document(path: tuple[str, ...], pod: Pod, tmp_path: Path) -> None:
    (tmp_path / "profile.yaml").write_text("extends: dgx-h100\n")
    argv = argv_for(path, pod, tmp_path)
    r = run(argv, tmp_path)
    assert r.returncode not in (64, 70) and "Traceback" not in r.stderr, f"{argv}: rc {r.returncode}\n{r.stderr}"
    try:
        json.loads(r.stdout)
    except ValueError as e:
        raise AssertionError(f"podhealth {' '.join(argv)}: stdout is not JSON ({e}):\n{r.stdout[:2000]}\n"
                             f"--- stderr ---\n{r.stderr[-2000:]}") from None


def test_check_junit_parses(pod: Pod, tmp_path: Path) -> None:
    argv = argv_for(("check",), pod, tmp_path)[:-2] + ["--format", "junit"]
    r = run(argv, tmp_path)
    assert r.returncode in (0, 1), r.stderr
    ET.fromstring(r.stdout)


def test_a_local_check_logs_on_stderr_only(tmp_path: Path) -> None:
    # No agent listens at the config's port, so the suite runs here, in the process: its collectors
    # log (DCGM missing, NVML missing on this machine), and all of it must land on stderr.
    cfg = tmp_path / "podhealth.yaml"
    cfg.write_text(f"listen: {{port: {free_port()}}}\n")
    for fmt, parse in (("json", json.loads), ("junit", ET.fromstring)):
        r = run(["check", "--config", str(cfg), "--format", fmt], tmp_path)
        assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, r.stderr
        parse(r.stdout)
        assert r.stderr.strip(), "the prologue sent logs to stderr: there should be some at --log-level info"


def test_the_banners_fleet_status_works_as_pasted(pod: Pod, tmp_path: Path) -> None:
    # issue 31 §3: `fleet status` from the banner tried port 9420 and failed; now the banner
    # prints the export line that names this pod's aggregator, and the command after it works
    import shlex

    text = (pod.root.parent / f"{pod.root.name}.log").read_text()
    lines = [ln.strip() for ln in text.splitlines()]
    export = next(ln for ln in lines if ln.startswith("export "))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    env.update(dict(w.split("=", 1) for w in shlex.split(export)[1:]))
    assert env["PODHEALTH_AGGREGATOR_URL"] == pod.aggregator
    status = shlex.split(next(ln for ln in lines if ln.endswith(" fleet status")))
    r = subprocess.run(status, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "nodes: 1" in r.stdout, r.stdout + r.stderr
    # the deprecated name still works, and says which to set
    env["PODHEALTH_AGGREGATOR"] = env.pop("PODHEALTH_AGGREGATOR_URL")
    r = subprocess.run(status, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "nodes: 1" in r.stdout, r.stderr
    assert "$PODHEALTH_AGGREGATOR is deprecated: set $PODHEALTH_AGGREGATOR_URL" in r.stderr
