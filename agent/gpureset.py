"""POST /v1/gpu-reset: reset one GPU for the aggregator's remediation ladder, never under a job.

The caller is the aggregator, its request signed with this node's agent key (`podhealth token
derive --agent`, held as this agent's auth.token_file; agent/nodeauth.py), as for the handover
suite; an agent without a key refuses every caller, local ones too. The agent then:

1. refuses (409) while NVML lists a compute or graphics process on that GPU: a reset kills
   whatever runs there, and a job must never be killed by accident. A GPU whose processes NVML
   cannot list (NVML down, the call timed out) is not reset either (503): "could not tell" is
   never "idle";
2. refuses (409) while a handover suite or another reset runs;
3. runs gpu_reset.command (`nvidia-smi -r -i N`; NVML's own reset call is not in the public API)
   as argv with a timeout, killed past it, and answers 200 with its output, or 500.

The answer is JSON: {"gpu", "ok", "output"} or {"error", ...}. The aggregator treats 409/503 as
"try later" and 500 as a failed attempt (the next rung of its ladder).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Awaitable, Callable, Iterable

import pynvml
from aiohttp import web

from podhealth import log, subproc, webguard
from podhealth.agent.plugin import Plugin
from podhealth.config import GpuResetConfig
from podhealth.worker import call_off_loop, call_with_timeout

_log = log.get("podhealth.agent.gpureset")
NVML_TIMEOUT_S = 10.0  # listing a GPU's processes; a wedged driver must not hold the request
MAX_GPU_INDEX = 63
# Seconds the body may take after its head (the idle timeout stops at the head): a caller with
# the token trickling a byte a second held the handler for as long as it liked.
BODY_TIMEOUT_S = 30.0
MAX_BODY = 64 * 1024  # decoded bytes: the body is {"gpu": N, "reason": ...} (reason cut to 200)
OUTPUT_CHARS = 4000


class Unreadable(Exception):
    """NVML could not say whether processes use the GPU."""


def gpu_pids(library_path: str, index: int) -> list[int]:
    """PIDs of the compute and graphics processes on GPU `index` (blocking: run off the loop).
    Raises Unreadable when NVML cannot tell, LookupError when there is no such GPU."""
    from podhealth.collectors.nvml_session import NvmlUnavailable, collect_with_reinit, error_text, shared

    session = shared(library_path)
    session.acquire()
    try:
        def once() -> list[int]:
            count, devices = session.devices()
            if not 0 <= index < count:
                raise LookupError(f"no GPU {index} (NVML counts {count})")
            handle = devices[index].handle
            if handle is None:
                raise Unreadable(f"GPU {index}: no NVML handle ({error_text(devices[index].error or Exception())})")
            procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            procs += pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
            return sorted({int(p.pid) for p in procs})
        try:
            return collect_with_reinit(session, once)
        except pynvml.NVMLError as e:
            raise Unreadable(f"GPU {index}: {error_text(e)}") from None
        except NvmlUnavailable as e:
            raise Unreadable(str(e)) from None
    finally:
        session.release()


# (request, body limit, body timeout) -> (the refusal, or None and the body): the judge's admit
# (agent/health.py), the handover suite's credential.
Admit = Callable[[web.Request, int, float], Awaitable[tuple[web.Response | None, bytes]]]


class GpuReset(Plugin):
    """The endpoint, given what it needs: its config section, the NVML library, the credential
    check (`admit`), whether a handover suite runs (`busy`), and /metrics' re-render."""

    name = "gpu-reset"

    def __init__(self, cfg: GpuResetConfig, nvml_library: str, admit: Admit, *, busy: Callable[[], bool],
                 invalidate: Callable[[], None]) -> None:
        self.cfg = cfg
        self.nvml_library = nvml_library
        self.admit = admit
        self.busy = busy
        self.invalidate = invalidate
        self._lock = asyncio.Lock()

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        return [web.post("/v1/gpu-reset", webguard.same_site_only(self.post))]

    async def post(self, request: web.Request) -> web.Response:
        refusal, raw = await self.admit(request, MAX_BODY, BODY_TIMEOUT_S)
        if refusal is not None:
            return refusal
        try:
            body = json.loads(raw or b"{}")
            gpu = body["gpu"]
            if not isinstance(gpu, int) or isinstance(gpu, bool) or not 0 <= gpu <= MAX_GPU_INDEX:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested ~1,000 deep
            return web.json_response({"error": f'expected {{"gpu": 0..{MAX_GPU_INDEX}}}'}, status=400)
        reason = str(body.get("reason", ""))[:200] if isinstance(body, dict) else ""
        if self._lock.locked() or self.busy():
            return web.json_response({"error": "a handover suite or another GPU reset is running"}, status=409)
        async with self._lock:
            return await self._reset(gpu, reason)

    async def _reset(self, gpu: int, reason: str) -> web.Response:
        library = self.nvml_library
        try:
            # A wedged NVML hangs the call: its own daemon thread, abandoned after the timeout.
            pids = await call_with_timeout("gpu-pids", lambda: gpu_pids(library, gpu), NVML_TIMEOUT_S)
        except LookupError as e:
            return web.json_response({"error": str(e), "gpu": gpu}, status=404)
        except (Unreadable, asyncio.TimeoutError) as e:
            why = str(e) or f"NVML did not answer within {NVML_TIMEOUT_S:g}s"
            return web.json_response({"error": f"cannot tell whether processes use GPU {gpu}: {why}", "gpu": gpu},
                                     status=503)
        if pids:
            _log.warning("GPU reset refused: processes use the GPU", gpu=gpu, pids=pids[:20])
            return web.json_response({"error": f"{len(pids)} process(es) use GPU {gpu}: not reset", "gpu": gpu,
                                      "pids": pids}, status=409)
        argv = [a.replace("{gpu}", str(gpu)) for a in self.cfg.command]
        started = time.monotonic()
        rc, output = await _run(argv, self.cfg.timeout)
        took = round(time.monotonic() - started, 3)
        if rc != 0:
            _log.error("GPU reset failed", gpu=gpu, rc=rc, output=output[:500], reason=reason)
            return web.json_response({"error": f"GPU {gpu} reset failed (rc {rc})", "gpu": gpu, "ok": False,
                                      "command": argv, "output": output, "seconds": took}, status=500)
        _log.warning("GPU reset", gpu=gpu, reason=reason, seconds=took)
        self.invalidate()
        return web.json_response({"gpu": gpu, "ok": True, "command": argv, "output": output, "seconds": took})


async def _run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit code, stdout+stderr); None when it could not start or was killed past `timeout`.
    Through the one program runner (core/subproc.py: its process group killed at the timeout,
    output bounded), on a thread of its own: the loop keeps serving meanwhile."""
    run = await call_off_loop("gpu-reset", lambda: subproc.run(
        argv, timeout, env=os.environ, cwd=os.getcwd(), merge_stderr=True, max_output=OUTPUT_CHARS * 16))
    if run.error:
        return None, run.error
    if run.timed_out:
        return None, f"{argv[0]} timed out after {timeout:g}s (killed)"
    out = run.stdout.decode(errors="replace")[-OUTPUT_CHARS:]
    return (run.exit_code if run.exit_code is not None else -run.signal if run.signal is not None else None), out

