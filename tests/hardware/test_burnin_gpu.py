"""On a real NVIDIA GPU: the burn-in for 60 s next to a plain torch matmul loop's measured peak,
and the single-GPU NCCL runner. Skipped clearly without CUDA.

Prints (run with -s): bf16 / fp32 TFLOPS per GPU from the burn-in, the plain loop's peak at the
same size, and the ratio (target >= 95%).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from podhealth.checks.active import burnin, nccl
from podhealth.checks.active.burnin_watch import NvmlWatcher
from podhealth.vocab import Status

pytestmark = pytest.mark.hardware
torch = pytest.importorskip("torch", reason="needs PyTorch with CUDA")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible: hardware tests need a real NVIDIA GPU", allow_module_level=True)

SIZE = burnin.DEFAULT_SIZE["cuda"]
DURATION = 60.0


def plain_loop_tflops(dtype: "torch.dtype", n: int = SIZE, seconds: float = 8.0) -> float:
    """The reference: back-to-back torch matmuls in this process, nothing else."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    best = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        iters = 50
        t0 = time.perf_counter()
        for _ in range(iters):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 2 * n ** 3 * iters / (time.perf_counter() - t0) / 1e12)
    del a, b
    torch.cuda.empty_cache()
    return best


def test_burnin_reaches_the_plain_matmul_peak() -> None:
    peak = {"bf16": plain_loop_tflops(torch.bfloat16), "fp32": plain_loop_tflops(torch.float32)}
    ngpu = torch.cuda.device_count()
    out = burnin.run_burnin(burnin.BurninOptions(duration_s=DURATION, device="cuda"),
                            burnin.Thresholds(), NvmlWatcher(list(range(ngpu))))
    print(f"\nburn-in: {ngpu} GPU(s) {torch.cuda.get_device_name(0)}, n={out.size}, {out.duration_s:.1f}s wall, "
          f"telemetry {'on' if out.watch.available else 'off: ' + out.watch.reason}")
    for w in out.workers:
        assert not w.error, w.error
        for r in w.results:
            ratio = r.tflops / peak[r.dtype]
            print(f"  gpu{w.index} {r.dtype}: burn-in {r.tflops:.1f} TFLOPS, plain loop peak {peak[r.dtype]:.1f}, "
                  f"ratio {ratio:.1%}, {r.iterations} products, ref error {r.ref_error:.2g}, "
                  f"repeat mismatches {r.repeat_mismatches}/{r.repeat_checks}")
            assert ratio >= 0.95, f"gpu{w.index} {r.dtype} reached only {ratio:.1%} of the plain loop"
    for res in out.results:
        print(f"  {res.check} {res.entity} {res.status.value}: {res.summary}")
    assert all(r.status is not Status.FAIL for r in out.results if r.check == burnin.CHECK_CORRECT)


def test_single_gpu_nccl_runner() -> None:
    r = subprocess.run([sys.executable, "-m", "podhealth.checks.active.nccl_runner", "--nproc", "1", "--device", "cuda",
                        "--min-bytes", str(1 << 20), "--max-bytes", str(1 << 28), "--iters", "10", "--timeout", "120"],
                       capture_output=True, timeout=300, check=False)
    out = r.stdout.decode()
    print("\n" + out)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    run = nccl.parse(out)
    assert len(run.rows) == 9 and run.nccl_version and all(row.wrong == 0 for row in run.rows)
    # One rank: busbw = algbw * 2(n-1)/n = 0, as nccl-tests prints for -g 1; algbw measures the local copy.
    assert all(row.ip_algbw > 0 for row in run.rows)
