"""One burn-in worker: GEMM stress on one GPU (or one CPU thread standing in for a GPU).

Runs in its own process (`python -m podhealth.checks.active.burnin_worker SPEC_JSON`, never forked:
CUDA does not survive fork), so a GPU that hangs or crashes takes down only its worker. It
prints one JSON object per line on stdout: {"progress": [fraction, dtype]} while it runs, then
{"result": WorkerResult}. For each dtype it builds seeded inputs (identical on every
worker), computes C0 = A @ B once, checks C0's first rows against a float64 reference, then
multiplies in timed batches for its share of the duration, comparing a result against C0 after
every batch. It reports achieved TFLOPS (timed batches only) and a float64 checksum of C0 that
the parent compares across GPUs.

Fault injection (the documented test seam; `WorkerSpec.fault`, CLI `--inject-fault KIND:INDEX`):
- "corrupt": every product this worker computes is wrong in one element, as a GPU with a stuck
  fault would be; caught by the reference check and the cross-GPU checksum.
- "flip":    one product after the first batch differs from C0, as a transient flip would;
  caught by the repeat comparison.
- "slow":    each timed batch takes `slow_factor` times as long (the worker sleeps inside the
  timed window), as a throttled GPU would; caught by the peer comparison.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Literal, Mapping

Fault = Literal["", "corrupt", "flip", "slow"]
FAULTS: tuple[str, ...] = ("corrupt", "flip", "slow")
DTYPES: tuple[str, ...] = ("bf16", "fp32")

# Reference check: max |C0 - ref| / max |ref| on the first rows. bf16 products are rounded to
# bf16 (8 significant bits, 2^-8 ~ 0.4% per element); fp32 accumulates n terms at 2^-24.
REF_TOL = {"bf16": 2e-2, "fp32": 1e-3}
# Repeat comparison against C0 on the same device: same kernel, same inputs, so results should be
# bit-identical; allow one rounding step in case a library picks a different reduction order.
REPEAT_TOL = {"bf16": 8e-3, "fp32": 1e-6}
REF_ROWS = 8


@dataclass(frozen=True)
class WorkerSpec:
    index: int                 # GPU index (CUDA device ordinal) or CPU stand-in number
    device: str                # "cuda" | "cpu"
    duration_s: float          # whole run; split evenly between dtypes
    size: int                  # n of the n x n matrices
    dtypes: tuple[str, ...] = DTYPES
    seed: int = 1234
    backend: str = "torch"     # "torch" | "cupy"
    fault: Fault = ""
    slow_factor: float = 4.0
    batch_target_s: float = 0.25


@dataclass(frozen=True)
class DtypeResult:
    dtype: str
    iterations: int
    seconds: float             # time inside timed batches
    tflops: float
    checksum: float            # sum(C0) in float64
    abs_checksum: float        # sum(|C0|) in float64, the scale for checksum tolerances
    ref_error: float           # max |C0 - ref| / max |ref| on the first rows
    ref_ok: bool
    repeat_checks: int
    repeat_mismatches: int
    max_repeat_error: float
    skipped: str = ""          # why this dtype did not run (backend cannot do it)


@dataclass(frozen=True)
class WorkerResult:
    index: int
    device_name: str
    results: tuple[DtypeResult, ...] = ()
    error: str = ""


def spec_to_json(spec: WorkerSpec) -> str:
    return json.dumps(asdict(spec))


def spec_from_json(text: str) -> WorkerSpec:
    d = json.loads(text)
    d["dtypes"] = tuple(d["dtypes"])
    return WorkerSpec(**d)


def result_from_json(d: Mapping[str, Any]) -> WorkerResult:
    return WorkerResult(int(d["index"]), str(d["device_name"]),
                        tuple(DtypeResult(**r) for r in d.get("results", ())), str(d.get("error", "")))


def main(argv: list[str] | None = None) -> int:
    """Process entry point: progress lines, then exactly one result line (errors included)."""
    args = sys.argv[1:] if argv is None else argv
    spec = spec_from_json(args[0])

    def emit(obj: object) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    try:
        res = run(spec, lambda frac, dt: emit({"progress": [frac, dt]}))
    except BaseException as e:  # noqa: BLE001 - report every failure, the parent decides
        res = WorkerResult(spec.index, "", error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"[:2000])
    emit({"result": asdict(res)})
    return 0


class _Torch:
    def __init__(self, spec: WorkerSpec) -> None:
        import torch

        self.t = torch
        if spec.device == "cuda":
            torch.cuda.set_device(spec.index)
            # fp32 must mean fp32: TF32 would be faster and would hide precision faults.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            self.dev = torch.device("cuda", spec.index)
            self.name = torch.cuda.get_device_name(spec.index)
        else:
            torch.set_num_threads(1)
            self.dev = torch.device("cpu")
            self.name = f"cpu stand-in {spec.index}"

    def dtype(self, name: str) -> Any:
        return {"bf16": self.t.bfloat16, "fp32": self.t.float32}[name]

    def inputs(self, seed: int, n: int, dtype: str) -> tuple[Any, Any]:
        g = self.t.Generator().manual_seed(seed)
        a = self.t.rand(n, n, generator=g, dtype=self.t.float32) * 2 - 1
        b = self.t.rand(n, n, generator=g, dtype=self.t.float32) * 2 - 1
        dt = self.dtype(dtype)
        return a.to(dtype=dt).to(self.dev), b.to(dtype=dt).to(self.dev)

    def sync(self) -> None:
        if self.dev.type == "cuda":
            self.t.cuda.synchronize(self.dev)

    def reference(self, a: Any, b: Any, c0: Any) -> float:
        ref = a[:REF_ROWS].double().cpu() @ b.double().cpu()
        got = c0[:REF_ROWS].double().cpu()
        return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))

    def checksums(self, c: Any) -> tuple[float, float]:
        d = c.double()
        return float(d.sum()), float(d.abs().sum())

    def max_rel_diff(self, c: Any, c0: Any) -> float:
        if self.t.equal(c, c0):
            return 0.0
        return float((c.float() - c0.float()).abs().max() / c0.float().abs().max().clamp_min(1e-30))

    def corrupt(self, c: Any) -> None:
        c[0, 0] += c.abs().max() + 1


class _Cupy:
    """CuPy alternative for hosts with CuPy but no PyTorch. CuPy has no bfloat16, so bf16 is skipped."""

    def __init__(self, spec: WorkerSpec) -> None:
        import cupy

        self.cp = cupy
        cupy.cuda.Device(spec.index).use()
        self.name = f"cuda:{spec.index} (cupy)"

    def dtype(self, name: str) -> Any:
        if name != "fp32":
            raise NotImplementedError("cupy has no bfloat16")
        return self.cp.float32

    def inputs(self, seed: int, n: int, dtype: str) -> tuple[Any, Any]:
        import numpy as np

        self.dtype(dtype)
        rng = np.random.default_rng(seed)
        a = (rng.random((n, n), dtype=np.float32) * 2 - 1)
        b = (rng.random((n, n), dtype=np.float32) * 2 - 1)
        return self.cp.asarray(a), self.cp.asarray(b)

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()

    def reference(self, a: Any, b: Any, c0: Any) -> float:
        import numpy as np

        ref = self.cp.asnumpy(a[:REF_ROWS]).astype(np.float64) @ self.cp.asnumpy(b).astype(np.float64)
        got = self.cp.asnumpy(c0[:REF_ROWS]).astype(np.float64)
        return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))

    def checksums(self, c: Any) -> tuple[float, float]:
        d = c.astype(self.cp.float64)
        return float(d.sum()), float(self.cp.abs(d).sum())

    def max_rel_diff(self, c: Any, c0: Any) -> float:
        return float(self.cp.abs(c - c0).max() / max(float(self.cp.abs(c0).max()), 1e-30))

    def corrupt(self, c: Any) -> None:
        c[0, 0] += self.cp.abs(c).max() + 1


def run(spec: WorkerSpec, progress: Any = None) -> WorkerResult:
    ops: Any = _Cupy(spec) if spec.backend == "cupy" else _Torch(spec)
    share = spec.duration_s / max(1, len(spec.dtypes))
    out: list[DtypeResult] = []
    for i, dt in enumerate(spec.dtypes):
        try:
            out.append(_one_dtype(ops, spec, dt, share, lambda f: progress and progress((i + f) / len(spec.dtypes), dt)))
        except NotImplementedError as e:
            out.append(DtypeResult(dt, 0, 0.0, 0.0, 0.0, 0.0, 0.0, True, 0, 0, 0.0, skipped=str(e)))
    return WorkerResult(spec.index, ops.name, tuple(out))


def _one_dtype(ops: Any, spec: WorkerSpec, dt: str, share_s: float, progress: Any) -> DtypeResult:
    n = spec.size
    a, b = ops.inputs(spec.seed, n, dt)
    c0 = a @ b
    if spec.fault == "corrupt":
        ops.corrupt(c0)
    ops.sync()
    ref_err = ops.reference(a, b, c0)
    checksum, abs_checksum = ops.checksums(c0)

    # Warm-up product to size the batches (first call pays for library and kernel selection).
    t0 = time.perf_counter()
    c = a @ b
    ops.sync()
    one = max(time.perf_counter() - t0, 1e-6)
    batch = max(1, min(4096, int(spec.batch_target_s / one)))

    flops_per = 2.0 * n ** 3
    iters = checks = mismatches = 0
    timed = 0.0
    worst = 0.0
    end = time.monotonic() + share_s
    while True:
        t0 = time.perf_counter()
        for _ in range(batch):
            c = a @ b
        ops.sync()
        dt_s = time.perf_counter() - t0
        if spec.fault == "slow":
            time.sleep(dt_s * (spec.slow_factor - 1))
            dt_s = time.perf_counter() - t0
        timed += dt_s
        iters += batch
        if spec.fault == "corrupt" or (spec.fault == "flip" and checks == 1):
            ops.corrupt(c)
        diff = ops.max_rel_diff(c, c0)
        checks += 1
        worst = max(worst, diff)
        if diff > REPEAT_TOL[dt]:
            mismatches += 1
        now = time.monotonic()
        if progress:
            progress(min(1.0, 1 - (end - now) / share_s) if share_s > 0 else 1.0)
        if now >= end:
            break
    tflops = flops_per * iters / timed / 1e12 if timed > 0 else 0.0
    return DtypeResult(dt, iters, timed, tflops, checksum, abs_checksum, ref_err, ref_err <= REF_TOL[dt],
                       checks, mismatches, worst)



if __name__ == "__main__":
    sys.exit(main())
