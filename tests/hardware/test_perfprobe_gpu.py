"""On a real NVIDIA GPU: every fail-slow probe runs within its budget and gives a plausible
figure; GEMM is printed as a fraction of the profile's expected peak. Skipped clearly without CUDA.

Prints (run with -s): per GPU the GEMM TFLOPS, SM clock under load, HBM, PCIe H2D/D2H; per pair
NVLink; per HCA RDMA; each with its fraction of checks/data/perf_peaks.yaml's peak. The profile
is taken from the GPU's name (H100 / H200 / B200 / A100; others: the dgx-h100 peaks, printed as such).
"""

from __future__ import annotations

import time

import pytest

from podhealth.checks import perf_peaks
from podhealth.checks.active import perfprobe
from podhealth.vocab import Status

pytestmark = pytest.mark.hardware
torch = pytest.importorskip("torch", reason="needs PyTorch with CUDA")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: hardware tests need a real NVIDIA GPU", allow_module_level=True)

BUDGET = 120.0


def profile_of(name: str) -> tuple[str, bool]:
    """(profile, whether the GPU is that profile's part: only then is the fraction held to a range)."""
    for key, prof in (("GH200", "gh200"), ("GB200", "gb200-nvl72"), ("H200", "dgx-h200"), ("B200", "dgx-b200"),
                      ("A100", "dgx-a100"), ("H100 NVL", "h100-nvl"), ("H100 PCIe", "h100-pcie"), ("L40S", "l40s"),
                      ("H100", "dgx-h100")):
        if key in name:
            return prof, True
    return "dgx-h100", False


def test_every_probe_runs_within_its_budget_and_is_plausible() -> None:
    name = torch.cuda.get_device_name(0)
    prof, known = profile_of(name)
    pk = perf_peaks.peaks(prof)
    assert pk is not None
    started = time.monotonic()
    results = perfprobe.run_probes(perfprobe.ProbeOptions(profile=prof, budget=BUDGET))
    took = time.monotonic() - started
    print(f"\nperfprobe on {torch.cuda.device_count()} x {name} as {prof}: {took:.1f}s (budget {BUDGET:g}s)")
    for r in sorted(results, key=lambda r: (r.check, r.entity)):
        print(f"  {r.check:22} {r.entity:12} {r.status.value:8} {r.summary}")
    assert took <= BUDGET + perfprobe.WORKER_GRACE_S
    assert not [r for r in results if r.status is Status.FAIL]
    ok = {(r.entity, r.check): dict(r.evidence) for r in results if r.status is Status.OK}
    for i in range(torch.cuda.device_count()):
        for check in ("perfprobe_gemm", "perfprobe_hbm", "perfprobe_pcie_h2d", "perfprobe_pcie_d2h"):
            assert (f"gpu{i}", check) in ok, f"gpu{i} {check} not measured"
        gemm = float(ok[(f"gpu{i}", "perfprobe_gemm")]["fraction_of_peak"])
        print(f"  gpu{i} GEMM {gemm:.0%} of {prof}'s {pk.gemm_tflops:g} TFLOPS {pk.dtype} peak")
        # plausible: at least half of what a healthy part reaches, never above the datasheet peak
        if known:
            assert perf_peaks.typical("gemm_tflops") / 2 <= gemm <= 1.05
    for (entity, check), ev in ok.items():
        frac = float(ev.get("fraction_of_peak", "0.5"))
        assert 0.0 < frac and (frac <= 1.3 or not known), f"{entity} {check}: {ev}"
