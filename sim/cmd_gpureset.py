"""`podhealth simulate gpu-reset NODE GPU`: the simulator's `nvidia-smi -r -i GPU`.

The agent's POST /v1/gpu-reset runs gpu_reset.command; `podhealth agent --simulate` points it
here, so the remediation ladder resets a simulated GPU: its resettable faults are cleared
(podhealth.sim.faults.after_reset), or the reset fails as nvidia-smi's does (gpu-reset-fails,
fallen-off-bus, a process on the GPU) and nothing changes. Output and exit code follow nvidia-smi.
"""

from __future__ import annotations

import argparse
import sys

# nvidia-smi's exit code when a reset fails for a reason other than processes ("Unknown Error").
GPU_RESET_FAILED = 255


def _cmd_gpu_reset(args: argparse.Namespace) -> int:
    from podhealth.sim.cmd import _BadInput, _open

    node = _open(args)
    try:
        gpu = node.state.gpu(args.gpu)
    except KeyError:
        raise _BadInput(f"node {node.name} has no GPU {args.gpu}") from None
    if not node.reset_gpu(args.gpu):
        print(f"GPU {gpu.pci_bus_id}: Failed to reset the GPU: Unknown Error", file=sys.stderr)
        return GPU_RESET_FAILED
    print(f"GPU {gpu.pci_bus_id} was successfully reset.\nAll done.")
    return 0


def add_subcommand(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("gpu-reset", parents=[common],
                       help="reset one GPU as `nvidia-smi -r -i N` would (clears its resettable faults; "
                            "fails under fault=gpu-reset-fails, gpu-busy or fallen-off-bus)")
    p.add_argument("node")
    p.add_argument("gpu", type=int)
    p.set_defaults(sim_func=_cmd_gpu_reset)
