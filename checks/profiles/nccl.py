"""A site's own multi-node NCCL gate, from a healthy all_reduce_perf run on its fabric.

Shipped profiles state a multi-node busbw gate only for the fabric it was measured on (the DGX's
8x NDR400 InfiniBand rails). Any other fabric (an OEM HGX on RoCE, a cloud's GPUDirect-TCPX) gets
UNKNOWN ("no gate"), never the DGX figure: a healthy GCP A3 Mega run passed that one with 10%
margin, so a slightly slower healthy node of that kind would be drained. `podhealth profile
capture --nccl FILE` reads a run the site knows is good and states its gate: GATE_FRACTION of
what the run measured, as the shipped gates sit at ~80% of a healthy run (profiles.yaml).

Pure: the run's text in, the gate and the comment that says where it came from out.
"""

from __future__ import annotations

from dataclasses import dataclass

from podhealth.checks.active import nccl

GATE_FRACTION = 0.8


@dataclass(frozen=True)
class MeasuredGate:
    gate_gbps: float
    comment: str


def measured_gate(text: str, source: str, min_bytes: int) -> MeasuredGate:
    """ValueError, saying why, for a run that cannot set a gate: it failed or did not finish,
    counted wrong values, ran on one node, or stopped short of `min_bytes` (the plateau)."""
    run = nccl.parse(text)
    if not run.started or not run.rows:
        raise ValueError(f"{source}: no all_reduce_perf results in it")
    if not run.complete or run.failure_lines:
        raise ValueError(f"{source}: the run did not complete cleanly ({(run.failure_lines or ('no summary',))[0]})")
    if run.out_of_bounds or any(r.oop_wrong for r in run.rows):
        raise ValueError(f"{source}: the run counted wrong values: not a healthy run")
    hosts = sorted({d.host for d in run.devices})
    if len(hosts) < 2:
        raise ValueError(f"{source}: the run used {len(hosts) or 'an unknown number of'} host(s); a multi-node "
                         "gate needs a run across nodes (2 or more)")
    biggest = max(r.size_bytes for r in run.rows)
    if biggest < min_bytes:
        raise ValueError(f"{source}: largest size {biggest} B is below the {min_bytes} B the gate is stated for "
                         "(run it with -e 1G or more)")
    measured = run.large_busbw()
    assert measured is not None
    gate = round(measured * GATE_FRACTION, 1)
    return MeasuredGate(gate, f"{GATE_FRACTION:.0%} of {measured:.1f} GB/s, all_reduce_perf on {len(hosts)} nodes x "
                              f"{len(run.devices) // len(hosts)} GPUs ({source}; mean busbw of the sizes within 4x "
                              f"of {biggest} B)")
