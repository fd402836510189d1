"""A node's publishing side for the chaos test: the agent's real Publisher (spool + sender), fed
with a steady stream of XID events and one failing verdict, in a process of its own so the test
can SIGKILL it at any point and start it again on the same spool.

    python -m tests.harness.chaos_agent NODE AGGREGATOR_URL[,URL...] TOKEN WORKDIR FAIL_AT

Every event id it writes to WORKDIR/published.txt has been flushed to the spool first (what the
agent promises survives its own crash); the test checks each of them reaches the aggregator
exactly once. From FAIL_AT (epoch seconds) on, it reports a failing GPU (again after each
restart, as an agent re-judging its node would). It stops producing when WORKDIR/stop exists and
keeps delivering until killed.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

from podhealth.agent.publisher import Publisher
from podhealth.config import PublishConfig
from podhealth.vocab import Action, CheckResult, Event, NodeReport, Status

BURST = 5
PACE_S = 0.05  # between bursts: a production rate, not a wait for anything


async def main(node: str, url: str, token: str, work: Path, fail_at: float) -> None:
    # URL,URL,...: aggregator replicas (publish.aggregators), the agent fails over between them
    cfg = PublishConfig(aggregators=tuple(url.split(",")), token=token, spool_dir=work / "spool",
                        spool_max_bytes=8 << 20, timeout=2.0)
    failing = CheckResult("xid", Status.FAIL, "GPU0", action=Action.RESET_GPU, summary="chaos: XID 79")
    failed = False

    def report() -> NodeReport | None:
        # As the real agent (agent/wiring.py): after a burst of transitions the publisher also
        # sends the node's full report. A replica that is not the leader stores it, and the
        # leader takes conditions from other replicas' full reports (Memory.adopt), not from a
        # transition alone.
        return NodeReport(node, "chaos", "dgx-h100", (failing,)) if failed else None

    pub = Publisher(cfg, node, max_backoff=0.3, report=report)
    await pub.start()
    run = uuid.uuid4().hex[:8]  # ids stay unique across restarts of this node's process
    i = 0
    with open(work / "published.txt", "a", buffering=1) as out:
        while not (work / "stop").exists():
            if not failed and time.time() >= fail_at:
                # The storm: this node's GPU fails (a transition, as the agent publishes it).
                failed = True
                await pub.on_transition(None, failing, time.time())  # as the agent's sinks are fed
            ids = [f"{node}-{run}-{i + k:05d}" for k in range(BURST)]
            for eid in ids:
                pub.publish_event(Event(kind="xid", code=(79, 48, 94)[i % 3], time=time.time(), text=f"Xid {eid}",
                                        id=eid))
            i += BURST
            await pub._flush()  # the test's barrier: only ids that are on the spool are promised
            out.write("".join(f"{eid}\n" for eid in ids))
            await asyncio.sleep(PACE_S)
    while True:  # keep delivering what is spooled until the test stops this process
        await asyncio.sleep(1.0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), float(sys.argv[5])))
