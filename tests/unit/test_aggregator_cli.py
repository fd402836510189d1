"""`podhealth fleet ...` and `podhealth aggregator` argument handling, as an operator runs them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from podhealth.netaddr import parse_listen
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_service import until

pytestmark = pytest.mark.timeout(90)


async def fleet(url: str, *args: str, token: str | None = "atok") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    if token:
        env["PODHEALTH_ADMIN_TOKEN"] = token
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "podhealth", "fleet", "--url", url, *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_fleet_commands_against_a_running_aggregator(tmp_path: Path) -> None:
    fencer = MemFencer(fenced={"dgx04": "ops: bad fan"})
    cfg = config(tmp_path, auth=AggAuthConfig(admin_token="atok"))
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await s.post(f"{url}/v1/reports", json={"node": "dgx02", "time": 5, "results": [
            {"check": "nvlink", "entity": "GPU1", "status": "WARN", "action": "NONE"}]})
        rc, out, err = await fleet(url, "fence", "dgx01", "--reason", "RMA 42")
        assert rc == 0 and "fence done: fenced" in out, err
        rc, out, _ = await fleet(url, "status")
        assert rc == 0 and "fence budget: 1/10" in out and "breaker: ok" in out
        await s.post(f"{url}/v1/reports", json={"node": "dgx05", "time": 5, "results": [
            {"check": "ecc", "entity": "gpu2", "status": "FAIL", "action": "DRAIN"}]})
        await until(lambda: "dgx05" in fencer.fenced)
        rc5, out5, err5 = await fleet(url, "release", "dgx05", "--reason", "looks fine")
        assert rc5 == 1 and "dgx05 still reports FAIL (ecc:gpu2)" in err5 and "--force" in err5 and out5 == ""
        assert "dgx05" in fencer.fenced  # asked, nothing changed
        rc5, out5, err5 = await fleet(url, "release", "dgx05", "--reason", "vendor says fine", "--force")
        assert rc5 == 0 and "release done" in out5 and "dgx05" not in fencer.fenced, err5
        lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("dgx")}
        assert lines["dgx01"][1] == "fenced" and lines["dgx02"][1:4] == ["WARN", "batch", "nvlink"]
        assert lines["dgx04"][1] == "drained" and lines["dgx03"][1] == "UNKNOWN"  # never reported
        # a fenced node with no failing check (the operator's fence; a reboot in flight) says why
        after = out.splitlines()[out.splitlines().index(next(ln for ln in out.splitlines() if ln.startswith("dgx01"))) + 1]
        assert after.startswith(" ") and "fence: podhealth: operator" in after and "held: fenced by an operator" in after, out
        rc, out, err = await fleet(url, "release", "dgx04", "--reason", "mine now")
        assert rc == 1 and "HTTP 409" in err and "only releases its own fences" in err
        rc, out, err = await fleet(url, "release", "dgx01", "--reason", "repaired", token="wrong")
        assert rc == 1 and "HTTP 401" in err and "dgx01" in fencer.fenced
        from podhealth.aggregator.cmd_fleet import AUTH_HINT
        assert AUTH_HINT in err and "--token, $PODHEALTH_ADMIN_TOKEN, or --config" in AUTH_HINT
        rc, out, err = await fleet(url, "bundle", "dgx01", "--list", token=None)  # bundles need the token too
        assert rc == 1 and "HTTP 401" in err and AUTH_HINT in err, err
        rc, out, err = await fleet(url, "release", "dgx01", "--reason", "repaired", token=None)
        assert rc == 2 and "admin token is needed" in err  # nothing to ask with: could not decide
        rc, out, _ = await fleet(url, "release", "dgx01", "--reason", "repaired")
        assert rc == 0 and "release done" in out and "dgx01" not in fencer.fenced
        rc, out, _ = await fleet(url, "history", "dgx01")
        assert rc == 0 and "release done by operator:" in out and "RMA 42" in out
        rc, out, _ = await fleet(url, "breaker-reset", "--reason", "test")
        assert rc == 0 and "was not tripped" in out
        rc, out, _ = await fleet(url, "reset-order", "dgx02", "--reason", "forged seq")
        assert rc == 0 and "dgx02: order reset (was boot - seq 0)" in out
        rc, _, err = await fleet(url, "history", "dgx99")
        assert rc == 1 and "HTTP 404" in err


async def test_fleet_takes_the_admin_token_from_the_configs_token_file(tmp_path: Path) -> None:
    """The shipped configs (Kubernetes bundle, a head node's) keep the admin token in
    aggregator.auth.admin_token_file: `fleet --config` must read it, not ask for --token."""
    cfg = config(tmp_path, auth=AggAuthConfig(admin_token="atok-from-file"))
    (tmp_path / "admin-token").write_text("atok-from-file\n")
    (tmp_path / "aggregator.yaml").write_text(
        f"aggregator:\n  auth:\n    admin_token_file: {tmp_path / 'admin-token'}\n")
    async with running(cfg, [MemFencer()]) as (agg, url):
        rc, out, err = await fleet(url, "--config", str(tmp_path / "aggregator.yaml"), "fence", "dgx01",
                                   "--reason", "RMA 7", token=None)
        assert rc == 0 and "fence done: fenced" in out, err
        (tmp_path / "admin-token").unlink()
        rc, out, err = await fleet(url, "--config", str(tmp_path / "aggregator.yaml"), "release", "dgx01",
                                   "--reason", "back", token=None)
        assert rc == 2 and "admin-token" in err and out == "", err


async def test_fleet_format_json_and_the_deprecated_json_alias(tmp_path: Path) -> None:
    import json

    cfg = config(tmp_path, auth=AggAuthConfig(admin_token="atok"))
    async with running(cfg, [MemFencer()]) as (agg, url):
        for argv in (["--format", "json", "status"], ["status", "--format", "json"]):
            rc, out, err = await fleet(url, *argv)
            assert rc == 0 and err == "", err
            assert set(json.loads(out)) == {"fleet", "nodes"}
        rc, out, err = await fleet(url, "--json", "status")
        assert rc == 0 and set(json.loads(out)) == {"fleet", "nodes"}
        assert "--json is deprecated, use --format json" in err
        rc, out, err = await fleet(url, "status", "--format", "junit")  # no results to report: usage error
        assert rc == 64 and "invalid choice: 'junit'" in err and out == ""


async def test_fleet_says_when_the_aggregator_is_not_there() -> None:
    rc, _, err = await fleet("http://127.0.0.1:9", "status")
    assert rc == 2 and "cannot reach the aggregator" in err  # could not decide, as README says


def test_aggregator_refuses_a_bad_config_with_file_line_key(tmp_path: Path) -> None:
    cfg = tmp_path / "agg.yaml"
    cfg.write_text("aggregator:\n  caps:\n    max_fenced: many\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "aggregator", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == 'agg.yaml:3: aggregator.caps.max_fenced: expected a count >= 0, got "many"'
    r = subprocess.run([sys.executable, "-m", "podhealth", "aggregator", "--db", "rel.db"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and "--db: expected an absolute path" in r.stderr  # a usage error (EX_USAGE)


@pytest.mark.parametrize("text, want", [("127.0.0.1:9420", ("127.0.0.1", 9420)), (":80", ("0.0.0.0", 80)),
                                        ("9000", ("0.0.0.0", 9000)), ("[::1]:9", ("::1", 9))])
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text, any_host="0.0.0.0") == want  # the aggregator's --listen


@pytest.mark.parametrize("text", ["host:", "host:99999", "x:y"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--listen"):
        parse_listen(text, any_host="0.0.0.0")


def test_status_names_the_fence_reason_and_the_ladder_step() -> None:
    from podhealth.aggregator.cmd_fleet import _why_out

    row = {"fence_reason": "podhealth: xid GPU3 REBOOT (XID 79)", "hold_reason": "",
           "ladder": {"step": "verifying", "since": 0, "remedy": "REBOOT"}}
    assert _why_out(row) == ("fence: podhealth: xid GPU3 REBOOT (XID 79); "
                             "ladder: reboot done, waiting for the handover suite")
    assert _why_out({"fence_reason": "", "hold_reason": "", "ladder": {"step": "", "since": 0, "remedy": ""}}) == ""
