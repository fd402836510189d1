"""The CLI's output conventions: exit 64 for usage errors on every subcommand, colour only on a
terminal and never under NO_COLOR, rich markup never eating text (`podhealth[burnin]`), and
progress of long work as plain periodic lines when stderr is not a terminal."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from podhealth import cli
from podhealth.checks.handover.report import SuiteReport, render
from podhealth.checks.passive.result import ok, unknown
from podhealth.console import colour_wanted, console
from podhealth.exitcodes import EXIT_USAGE
from podhealth.progress import LongWork

pytestmark = pytest.mark.timeout(120)

HINT = "PyTorch is not installed (pip install 'podhealth[burnin]')"


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _report() -> SuiteReport:
    return SuiteReport(node="dgx01", profile="dgx-h100",
                       results=(unknown("burnin", "node", HINT), ok("gpu", "gpu0", "fine [really]")),
                       notes=(f"telemetry: {HINT}",))


@pytest.fixture
def no_colour_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_install_hint_keeps_its_brackets_in_the_table(no_colour_env: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    render(_report(), "table", out, verbose=True)
    text = out.getvalue()
    assert text.count("podhealth[burnin]") >= 2, text  # the result's evidence and the note
    assert "pip install 'podhealth'" not in text
    assert "fine [really]" in text


def test_colour_only_on_a_terminal_and_never_with_no_color(no_colour_env: pytest.MonkeyPatch) -> None:
    tty, pipe = FakeTTY(), io.StringIO()
    assert colour_wanted(tty) and not colour_wanted(pipe)
    render(_report(), "table", tty)
    render(_report(), "table", pipe)
    assert "\x1b[" in tty.getvalue()  # colour on a terminal: the check below can fail
    assert "\x1b[" not in pipe.getvalue()
    no_colour_env.setenv("NO_COLOR", "1")
    tty2 = FakeTTY()
    render(_report(), "table", tty2)
    assert not colour_wanted(tty2) and "\x1b[" not in tty2.getvalue()
    assert console(FakeTTY()).color_system is None


def test_a_piped_table_stays_wide() -> None:
    assert console(io.StringIO(), min_width=100).width >= 100


# ---- exit codes -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["--no-such-flag"],
    ["config", "check"],                      # missing FILE
    ["check", "--format", "yaml"],
    ["check", "--timeout", "soon"],
    ["fleet", "status", "--format", "junit"],
    ["fleet"],                                # missing ACTION
    ["nccl", "--iters", "many"],
    ["dcgm-diag", "-r", "9"],
    ["dcgm-diag", "--progress-every", "0"],
    ["agent", "--simulate", "dgx-z9"],
    ["simulate", "--bogus"],
    ["token", "--bogus"],
    ["profile", "--bogus"],
    [],                                       # no command at all
])
def test_usage_errors_exit_64(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        rc = cli.main(argv)
        raise SystemExit(rc)
    assert e.value.code == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_check_help_names_the_exit_codes() -> None:
    r = subprocess.run([sys.executable, "-m", "podhealth", "check", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    for code, meaning in (("0", "pass"), ("1", "fail"), ("2", "could not decide"), ("64", "usage error")):
        assert any(line.split()[:1] == [code] and meaning in line for line in r.stdout.splitlines()), r.stdout
    assert "handover suite" in r.stdout


# ---- progress ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_plain_progress_lines_every_interval_off_a_tty() -> None:
    clock, out = Clock(), io.StringIO()
    with LongWork("dcgm-diag -r 3", stream=out, interval=30.0, clock=clock) as work:
        work.update(note="time limit 3600s")
        for t, wrote in ((10, False), (29.9, False), (30, True), (45, False), (61, True), (400, True)):
            clock.t = 1000.0 + t
            assert work.tick() is wrote, t
    assert out.getvalue().splitlines() == [
        "dcgm-diag -r 3: 30s elapsed, time limit 3600s",
        "dcgm-diag -r 3: 61s elapsed, time limit 3600s",
        "dcgm-diag -r 3: 400s elapsed, time limit 3600s"]


def test_progress_counts_and_tty_mode_writes_no_plain_lines() -> None:
    clock, out = Clock(), io.StringIO()
    with LongWork("nccl pair tests", total=8, stream=out, interval=5.0, clock=clock) as work:
        work.update(done=3, note="1 not passing")
        clock.t += 5
        assert work.tick()
    assert out.getvalue() == "nccl pair tests: 5s elapsed, 3/8 done, 1 not passing\n"
    tty = FakeTTY()
    with LongWork("x", stream=tty, interval=0.001, clock=clock, tty=True) as work:
        clock.t += 10
        assert not work.tick()
    assert "elapsed" not in tty.getvalue()


class _Lines(io.StringIO):
    """Sets `enough` once `n` lines were written."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.enough = n, threading.Event()

    def write(self, s: str) -> int:
        r = super().write(s)
        if self.getvalue().count("\n") >= self.n:
            self.enough.set()
        return r


def test_run_ticks_while_the_work_blocks() -> None:
    out = _Lines(2)
    with LongWork("work", stream=out, interval=0.01) as work:
        # the work ends only once two progress lines were written while it was running
        got = work.run(lambda: out.enough.wait(timeout=30) and 42, poll=0.01)
    assert got == 42 and out.getvalue().count("elapsed") >= 2


def test_dcgm_diag_writes_progress_lines_to_a_pipe(tmp_path: Path, own_fixtures: Path) -> None:
    """The real command against a fake dcgmi that answers only after two progress lines appeared
    in the command's stderr (so the test waits for the state it asserts, not for a clock)."""
    fixture = own_fixtures / "dcgm" / "dcgm4_diag_4gpu_memory_fail.json"
    err_file = tmp_path / "stderr.txt"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "dcgmi"
    fake.write_text(f"#!{sys.executable}\nimport sys, time\n"
                    f"end = time.monotonic() + 30\n"
                    f"while open({str(err_file)!r}).read().count('elapsed') < 2 and time.monotonic() < end:\n"
                    f"    time.sleep(0.05)\n"
                    f"sys.stdout.write(open({str(fixture)!r}).read())\nsys.exit(226)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    with open(err_file, "w") as err:
        r = subprocess.run([sys.executable, "-m", "podhealth", "dcgm-diag", "-r", "1", "--format", "json",
                            "--profile", "generic", "--progress-every", "0.2"],
                           stdout=subprocess.PIPE, stderr=err, env=env, timeout=90, check=False)
    lines = [ln for ln in err_file.read_text().splitlines() if "elapsed" in ln]
    assert len(lines) >= 2 and all(ln.startswith("dcgm-diag -r 1: ") and "time limit" in ln for ln in lines)
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "FAIL"
