"""DCGM diagnostics: parsers on every real capture and our own fixtures; the runner against fake
`dcgmi` scripts on PATH (replaying a fixture, hanging, failing)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podhealth.checks.active import dcgm
from podhealth.vocab import Action, Status

REAL = {
    # file: (format, entries, {(check, entity): (status, action)} that must hold)
    # cuInit 'system not yet initialized' on all 8 GPUs: the fabric manager, one node-level FAIL.
    "dcgmi_diag_r3_fail_h100_cuinit_no_fabricmanager.txt": ("text", 41, {
        ("dcgm_diag.gpu_memory", "node"): (Status.FAIL, Action.DRAIN),
        ("dcgm_diag.pcie", "gpu3"): (Status.OK, Action.NONE),
        ("dcgm_diag.persistence_mode", "node"): (Status.OK, Action.NONE)}),
    "dcgmi_diag_r3_v_pass_v100_dcgm3.3.9.txt": ("text", 16, {
        ("dcgm_diag.diagnostic", "gpu0"): (Status.OK, Action.NONE),
        ("dcgm_diag.eud_test", "gpu0"): (Status.OK, Action.NONE)}),
    # DCGM 4.2.3's own harness broke (NVIDIA/DCGM#253), every GPU passed: could not judge.
    "dcgmi_diag_dcgm4.2.3_4gpu_pcie_fail_internal_error.txt": ("text", 13, {
        ("dcgm_diag.pcie", "node"): (Status.UNKNOWN, Action.NONE),
        ("dcgm_diag.pcie", "gpu2"): (Status.OK, Action.NONE),
        ("dcgm_diag.memory", "gpu3"): (Status.OK, Action.NONE)}),
    "dcgmi_diag_j_legacy_format_v1.7_4gpu_sm_stress_fail_dcgm_teststring.json": ("legacy-json", 68, {
        ("dcgm_diag.sm_stress", "gpu0"): (Status.FAIL, Action.REBOOT),     # STRESS_LEVEL: NVSentinel RESTART_VM
        ("dcgm_diag.sm_stress", "gpu1"): (Status.OK, Action.NONE),
        ("dcgm_diag.memory", "gpu0"): (Status.WARN, Action.DRAIN),         # skipped: ECC off (severity 2)
        ("dcgm_diag.memory_bandwidth", "gpu0"): (Status.OK, Action.NONE),  # skipped, severity 1
        ("dcgm_diag.denylist", "gpu3"): (Status.OK, Action.NONE)}),
}


def _by_key(results: list) -> dict:  # type: ignore[type-arg]
    return {(r.check, r.entity): r for r in results}


def test_corpus_is_covered(shared_fixtures: Path) -> None:
    files = {p.name for p in (shared_fixtures / "dcgm").glob("dcgmi_diag*") if not p.name.endswith(".source.txt")}
    assert files == set(REAL)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_captures(shared_fixtures: Path, name: str) -> None:
    fmt, n, expect = REAL[name]
    rep = dcgm.parse((shared_fixtures / "dcgm" / name).read_text())
    assert rep.format == fmt and len(rep.entries) == n
    results = dcgm.results(rep)
    res = _by_key(results)
    assert len(res) == len(results), "one result per (test, entity), no duplicates"
    gpu_fails_merged = sum(1 for r in results if r.entity == "node" and "gpus" in dict(r.evidence))
    assert len(res) == n - sum(len(str(dict(r.evidence)["gpus"]).split(",")) - 1 for r in results
                               if r.entity == "node" and "gpus" in dict(r.evidence)), gpu_fails_merged
    for key, (status, action) in expect.items():
        assert (res[key].status, res[key].action) == (status, action), key


def test_h100_text_warnings_are_unwrapped_per_gpu(shared_fixtures: Path) -> None:
    rep = dcgm.parse((shared_fixtures / "dcgm" / "dcgmi_diag_r3_fail_h100_cuinit_no_fabricmanager.txt").read_text())
    assert (rep.version, rep.driver) == ("3.3.8", "560.35.03")
    mem = [e for e in rep.entries if e.test == "GPU Memory"]
    assert [e.gpu for e in mem] == list(range(8)) and all(e.status == "fail" for e in mem)
    w = mem[5].warnings[0].text
    assert w.startswith("GPU 5 Error using CUDA API cuInit")
    assert "Restart DCGM. Rerun diagnostics. Unable to initialize CUDA library: 'system not yet initialized'" in w


def test_dcgm4_text_internal_error_is_test_level(shared_fixtures: Path) -> None:
    rep = dcgm.parse((shared_fixtures / "dcgm" / "dcgmi_diag_dcgm4.2.3_4gpu_pcie_fail_internal_error.txt").read_text())
    node = [e for e in rep.entries if e.test == "pcie" and e.gpu is None]
    assert len(node) == 1 and len(node[0].warnings) == 4
    assert node[0].warnings[0].text == ("There was an internal error during the test: 'A child process (152) "
                                        "exited with non-zero status 1' Check DCGM and system logs for errors. "
                                        "Reset GPU. Restart DCGM. Rerun diagnostics.")


def test_legacy_json_codes(shared_fixtures: Path) -> None:
    rep = dcgm.parse((shared_fixtures / "dcgm" / "dcgmi_diag_j_legacy_format_v1.7_4gpu_sm_stress_fail_dcgm_teststring.json").read_text())
    r = _by_key(dcgm.results(rep))[("dcgm_diag.sm_stress", "gpu2")]
    assert dict(r.evidence)["codes"] == "DCGM_FR_STRESS_LEVEL" and "1096.5" in r.summary


def test_schema_matches_own_dcgm4_fixture(shared_fixtures: Path, own_fixtures: Path) -> None:
    """Our DCGM 4 JSON fixture follows the official schema's required keys (no jsonschema here)."""
    schema = json.loads((shared_fixtures / "dcgm" / "dcgm4_diag_json_schema.json").read_text())
    doc = json.loads((own_fixtures / "dcgm" / "dcgm4_diag_4gpu_memory_fail.json").read_text())
    assert set(schema["required"]) <= set(doc)
    test_req = schema["properties"]["DCGM Diagnostic"]["properties"]["test_categories"]["items"]["properties"]["tests"]["items"]
    res_req = test_req["properties"]["results"]["items"]["required"]
    for cat in doc["DCGM Diagnostic"]["test_categories"]:
        for t in cat["tests"]:
            assert set(test_req["required"]) <= set(t)
            for r in t["results"]:
                assert set(res_req) <= set(r)


def test_own_dcgm4_json(own_fixtures: Path) -> None:
    rep = dcgm.parse((own_fixtures / "dcgm" / "dcgm4_diag_4gpu_memory_fail.json").read_text())
    assert rep.format == "dcgm4-json" and rep.version == "4.2.3"
    res = _by_key(dcgm.results(rep))
    mem2 = res[("dcgm_diag.memory", "gpu2")]
    assert (mem2.status, mem2.action) == (Status.FAIL, Action.REPLACE)      # FAULTY_MEMORY -> CONTACT_SUPPORT
    assert dict(mem2.evidence)["codes"] == "DCGM_FR_FAULTY_MEMORY"
    assert res[("dcgm_diag.memory", "gpu3")].status is Status.OK              # benign skip
    assert res[("dcgm_diag.pcie", "node")].status is Status.UNKNOWN           # test-level internal error:
    assert res[("dcgm_diag.pcie", "node")].action is Action.NONE              # the harness, not the GPU
    assert res[("dcgm_diag.cpu_eud", "node")].status is Status.OK


def test_own_text_and_legacy(own_fixtures: Path) -> None:
    res = _by_key(dcgm.results(dcgm.parse((own_fixtures / "dcgm" / "dcgmi_diag_r2_dcgm4_gpu1_fail.txt").read_text())))
    r = res[("dcgm_diag.memory", "gpu1")]
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)     # "double-bit" -> VOLATILE_DBE
    assert "3 volatile double-bit ECC error(s) in GPU 1." in r.summary
    assert res[("dcgm_diag.memory", "gpu0")].status is Status.OK
    assert ("dcgm_diag.memory", "node") not in res
    res = dcgm.results(dcgm.parse((own_fixtures / "dcgm" / "legacy_2gpu_pass.json").read_text()))
    assert len(res) == 6 and all(r.status is Status.OK for r in res)


def test_runtime_error_is_unknown(own_fixtures: Path) -> None:
    res = dcgm.results(dcgm.parse((own_fixtures / "dcgm" / "dcgm4_diag_runtime_error.json").read_text()))
    assert [(r.status, r.check) for r in res] == [(Status.UNKNOWN, "dcgm_diag")]
    assert "host engine" in res[0].summary


@pytest.mark.parametrize("text", ["", "{", "[]", '{"foo": 1}', "no table here", "| a | b |"])
def test_bad_input_raises_parse_error(text: str) -> None:
    with pytest.raises(dcgm.DiagParseError):
        r = dcgm.parse(text)
        if not r.entries:
            raise dcgm.DiagParseError("empty")


def test_truncated_json_is_a_parse_error(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "dcgm" / "dcgmi_diag_j_legacy_format_v1.7_4gpu_sm_stress_fail_dcgm_teststring.json").read_text()
    with pytest.raises(dcgm.DiagParseError):
        dcgm.parse(text[: len(text) // 2])


def test_every_yaml_action_and_code_is_valid() -> None:
    m = dcgm.error_map()
    assert m.by_id[50] == "DCGM_FR_STRESS_LEVEL" and m.by_id[52] == "DCGM_FR_FAULTY_MEMORY"
    assert m.by_id[10] == "DCGM_FR_CLOCKS_EVENT_THERMAL"      # DCGM 4 name wins for a shared id
    assert m.actions["DCGM_FR_CUDA_FM_NOT_INITIALIZED"] is Action.DRAIN   # override: not an RMA
    assert m.actions["DCGM_FR_VOLATILE_DBE_DETECTED"] is Action.RESET_GPU
    assert m.classify(dcgm.DiagWarning("x", error_id=999, category=10))[1] is Action.REPLACE   # category fallback
    assert m.classify(dcgm.DiagWarning("nothing known"))[1] is m.default_action


def test_error_map_facts_match_nvsentinel(shared_fixtures: Path) -> None:
    import yaml
    from importlib import resources

    d = yaml.safe_load(resources.files("podhealth.checks.data").joinpath("dcgm_errors.yaml").read_text())
    rows = [line.split(",") for line in (shared_fixtures / "dcgm" / "nvsentinel_dcgmerrorsmapping.csv").read_text().split()]
    assert {name: bucket for name, bucket in rows} == {n: s["nvsentinel"] for n, s in d["codes"].items() if "nvsentinel" in s}


# --- runner against fake dcgmi ------------------------------------------------------------------

def _fake(tmp: Path, body: str) -> Path:
    d = tmp / "bin"
    d.mkdir(exist_ok=True)
    p = d / "dcgmi"
    p.write_text(f"#!{sys.executable}\n{body}")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return d


def _env(bindir: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_runner_replays_fixture_and_passes_argv(tmp_path: Path, own_fixtures: Path) -> None:
    fixture = own_fixtures / "dcgm" / "dcgm4_diag_4gpu_memory_fail.json"
    argv_file = tmp_path / "argv"
    bindir = _fake(tmp_path, "import sys\n"
                   f"open({str(argv_file)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
                   f"sys.stdout.write(open({str(fixture)!r}).read())\n"
                   "sys.exit(226)\n")   # dcgmi exits non-zero when a test fails
    run = dcgm.run_diag(2, env=_env(bindir))
    assert argv_file.read_text() == "diag -r 2 -j"
    assert run.returncode == 226 and run.report is not None
    res = _by_key(list(run.results))
    assert res[("dcgm_diag.memory", "gpu2")].status is Status.FAIL


def test_runner_timeout_is_unknown_and_kills(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    bindir = _fake(tmp_path, f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    t0 = time.monotonic()
    run = dcgm.run_diag(1, timeout_s=1.0, env=_env(bindir))
    assert time.monotonic() - t0 < 15
    assert [r.status for r in run.results] == [Status.UNKNOWN] and "timed out after 1s" in run.results[0].summary
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_runner_nonzero_exit_without_output_is_unknown_with_stderr(tmp_path: Path) -> None:
    bindir = _fake(tmp_path, "import sys\nsys.stderr.write('Error: unable to establish a connection to the "
                   "specified host: localhost\\n')\nsys.exit(255)\n")
    run = dcgm.run_diag(1, env=_env(bindir))
    assert [r.status for r in run.results] == [Status.UNKNOWN]
    assert "exit 255" in run.results[0].summary and "unable to establish a connection" in run.results[0].summary


def test_runner_missing_dcgmi_is_unknown(tmp_path: Path) -> None:
    run = dcgm.run_diag(1, dcgmi="dcgmi", env={"PATH": str(tmp_path)})
    assert [r.status for r in run.results] == [Status.UNKNOWN]
    assert "not installed" in run.results[0].summary


def test_cli_from_fake_dcgmi(tmp_path: Path, shared_fixtures: Path) -> None:
    fixture = shared_fixtures / "dcgm" / "dcgmi_diag_j_legacy_format_v1.7_4gpu_sm_stress_fail_dcgm_teststring.json"
    bindir = _fake(tmp_path, f"import sys\nsys.stdout.write(open({str(fixture)!r}).read())\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "dcgm-diag", "-r", "1", "--format", "json",
                        "--profile", "generic"], capture_output=True, env=_env(bindir), timeout=60, check=False)
    assert r.returncode == 1, r.stderr.decode()
    rep = json.loads(r.stdout)
    failed = sorted(x["entity"] for x in rep["results"] if x["status"] == "FAIL")
    assert failed == ["gpu0", "gpu2", "gpu3"]
    r = subprocess.run([sys.executable, "-m", "podhealth", "dcgm-diag", "--format", "json", "--profile", "generic"],
                       capture_output=True, env={**os.environ, "PATH": str(tmp_path / "empty")}, timeout=60, check=False)
    assert r.returncode == 2 and json.loads(r.stdout)["results"][0]["status"] == "UNKNOWN"


def test_node_wide_cause_is_one_node_result_naming_the_gpus(shared_fixtures: Path) -> None:
    rep = dcgm.parse((shared_fixtures / "dcgm" / "dcgmi_diag_r3_fail_h100_cuinit_no_fabricmanager.txt").read_text())
    res = _by_key(dcgm.results(rep))
    node = res[("dcgm_diag.gpu_memory", "node")]
    ev = dict(node.evidence)
    assert ev["gpus"] == "0,1,2,3,4,5,6,7" and ev["codes"] == "DCGM_FR_CUDA_FM_NOT_INITIALIZED"
    assert "fabricmanager" in node.summary
    assert not any(k[0] == "dcgm_diag.gpu_memory" and k[1].startswith("gpu") for k in res)


def test_a_gpu_fault_next_to_a_node_wide_one_stays_per_gpu() -> None:
    def entry(gpu: int, text: str) -> dcgm.DiagEntry:
        return dcgm.DiagEntry(test="memory", category="Hardware", gpu=gpu, status="fail",
                              warnings=(dcgm.DiagWarning(text=text),))
    mixed = dcgm.DiagReport(format="text", entries=(
        entry(0, "Unable to initialize CUDA library: 'system not yet initialized'"),
        entry(1, "3 volatile double-bit ECC error(s) in GPU 1.")))
    res = _by_key(dcgm.results(mixed))
    assert ("dcgm_diag.memory", "gpu0") in res and ("dcgm_diag.memory", "gpu1") in res
