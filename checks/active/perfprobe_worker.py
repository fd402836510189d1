"""The fail-slow probes that need CUDA, in their own process (never forked: CUDA does not survive it).

`python -m podhealth.checks.active.perfprobe_worker SPEC_JSON` prints one JSON object:
{"readings": [{"entity", "metric", "value", "tool"}], "errors": [{"entity", "metric", "why"}]}.

Per GPU (one after the other, so a probe never shares a GPU with another probe):
- gemm_tflops: n x n GEMM at the profile's dtype (2 n^3 flops per product), timed batches for
  `seconds`, after a warm-up that lets clocks settle;
- sm_clock_mhz: NVML's SM clock sampled every 50 ms during that GEMM (mean): a GPU held at lower
  clocks under load is the classic fail-slow part;
- hbm_gbs: a device-to-device copy of `copy_mib` MiB (read + write: 2 bytes moved per byte copied);
- pcie_h2d_gbs / pcie_d2h_gbs: pinned host <-> device copies of `copy_mib` MiB (when nvbandwidth
  measured them, the parent does not ask for them here);
- nvlink_gbs per pair (i < j): a peer copy each way, the lower of the two (peer access needed).
Each figure comes from events timed on the GPU (torch.cuda.Event), not the host clock.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from typing import Any, Callable

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _timed(torch: Any, dev: int, fn: Callable[[], object], seconds: float) -> tuple[int, float]:
    """(iterations, GPU seconds) of running `fn` repeatedly for about `seconds`."""
    with torch.cuda.device(dev):
        fn()
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters, deadline = 0, time.monotonic() + seconds
        start.record()
        while time.monotonic() < deadline:
            for _ in range(4):
                fn()
            iters += 4
            torch.cuda.synchronize(dev)
        end.record()
        torch.cuda.synchronize(dev)
        return iters, start.elapsed_time(end) / 1000.0


class _ClockSampler:
    """SM clock of one GPU every 50 ms while a probe runs (NVML; none without pynvml)."""

    def __init__(self, index: int) -> None:
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.index = index
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            while not self.stop.wait(0.05):
                self.samples.append(float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)))
        except Exception:  # noqa: BLE001 - no NVML: the clock is simply not measured (UNKNOWN)
            return

    def __enter__(self) -> "_ClockSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(2.0)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    readings: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []

    def read(entity: str, metric: str, value: float) -> None:
        readings.append({"entity": entity, "metric": metric, "value": value, "tool": "torch"})

    try:
        import torch
    except ImportError as e:
        return {"readings": [], "errors": [{"entity": "node", "metric": "*", "why": f"torch missing: {e}"}]}
    if not torch.cuda.is_available():
        return {"readings": [], "errors": [{"entity": "node", "metric": "*", "why": "CUDA not available"}]}
    gpus: list[int] = spec.get("gpus") or list(range(torch.cuda.device_count()))
    seconds = float(spec.get("seconds", 2.0))
    n = int(spec.get("gemm_n", 8192))
    mib = int(spec.get("copy_mib", 1024))
    dtype = getattr(torch, DTYPES.get(spec.get("dtype", "bf16"), "bfloat16"))
    what = set(spec.get("what", ("gemm", "hbm", "pcie", "nvlink")))
    for i in gpus:
        ent = f"gpu{i}"
        try:
            if "gemm" in what:
                a = torch.randn(n, n, device=f"cuda:{i}", dtype=dtype)
                b = torch.randn(n, n, device=f"cuda:{i}", dtype=dtype)
                c = torch.empty(n, n, device=f"cuda:{i}", dtype=dtype)
                _timed(torch, i, lambda: torch.matmul(a, b, out=c), min(1.0, seconds / 2))  # warm-up
                with _ClockSampler(i) as clocks:
                    iters, secs = _timed(torch, i, lambda: torch.matmul(a, b, out=c), seconds)
                read(ent, "gemm_tflops", 2.0 * n ** 3 * iters / secs / 1e12)
                if clocks.samples:
                    read(ent, "sm_clock_mhz", statistics.mean(clocks.samples))
                else:
                    errors.append({"entity": ent, "metric": "sm_clock_mhz", "why": "NVML clock not readable"})
                del a, b, c
            if "hbm" in what:
                x = torch.empty(mib << 20, device=f"cuda:{i}", dtype=torch.uint8)
                y = torch.empty_like(x)
                iters, secs = _timed(torch, i, lambda: y.copy_(x), seconds / 2)
                read(ent, "hbm_gbs", 2.0 * (mib << 20) * iters / secs / 1e9)
                del x, y
            if "pcie" in what:
                host = torch.empty(mib << 20, dtype=torch.uint8).pin_memory()
                dev = torch.empty(mib << 20, device=f"cuda:{i}", dtype=torch.uint8)
                iters, secs = _timed(torch, i, lambda: dev.copy_(host, non_blocking=True), seconds / 2)
                read(ent, "pcie_h2d_gbs", (mib << 20) * iters / secs / 1e9)
                iters, secs = _timed(torch, i, lambda: host.copy_(dev, non_blocking=True), seconds / 2)
                read(ent, "pcie_d2h_gbs", (mib << 20) * iters / secs / 1e9)
                del host, dev
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - one GPU's failure is that GPU's UNKNOWN, the rest go on
            errors.append({"entity": ent, "metric": "*", "why": f"{type(e).__name__}: {str(e)[:200]}"})
    if "nvlink" in what:
        size = min(mib, 256) << 20
        for i in gpus:
            for j in gpus:
                if j <= i:
                    continue
                ent = f"gpu{i}-gpu{j}"
                if not torch.cuda.can_device_access_peer(i, j):
                    errors.append({"entity": ent, "metric": "nvlink_gbs", "why": "no peer access between the GPUs"})
                    continue
                try:
                    xi = torch.empty(size, device=f"cuda:{i}", dtype=torch.uint8)
                    xj = torch.empty(size, device=f"cuda:{j}", dtype=torch.uint8)
                    n1, s1 = _timed(torch, i, lambda: xj.copy_(xi, non_blocking=True), seconds / 4)
                    n2, s2 = _timed(torch, j, lambda: xi.copy_(xj, non_blocking=True), seconds / 4)
                    read(ent, "nvlink_gbs", min(size * n1 / s1, size * n2 / s2) / 1e9)
                    del xi, xj
                except Exception as e:  # noqa: BLE001
                    errors.append({"entity": ent, "metric": "nvlink_gbs", "why": f"{type(e).__name__}: {str(e)[:200]}"})
    return {"readings": readings, "errors": errors}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m podhealth.checks.active.perfprobe_worker SPEC_JSON", file=sys.stderr)
        return 64
    try:
        spec = json.loads(argv[1])
    except ValueError as e:
        print(f"bad spec: {e}", file=sys.stderr)
        return 64
    print(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
