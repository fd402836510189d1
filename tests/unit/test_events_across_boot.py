"""Kernel records from before the node's current boot no longer count.

A fresh /dev/kmsg never shows the last boot's records; an agent that outlives a boot (the
simulator's `fault=reboot`, which `simulate fleet`'s remediation ladder uses) must forget them too,
or an XID 79 the reboot cured keeps the node failing its verification for checks.rate_window.
"""

from __future__ import annotations

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.config import ChecksConfig, DampingConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Event, Sample, Status

pytestmark = pytest.mark.timeout(60)

H100 = profiles.load("dgx-h100")
T0 = 1_000_000.0
PCI3 = "0000:1b:00.0"


def gpus() -> list[Sample]:
    out = [Sample.of("gpu_devices", 8)]
    for i in range(8):
        lab = dict(gpu=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"0000:{0x18 + i:02x}:00.0", model=H100.gpu_model)
        out += [Sample.of("gpu_up", 1, **lab), Sample.of("gpu_lost", 0, **lab)]
    return out


def xid79(at: float) -> Event:
    return Event(kind="xid", code=79, time=at, pci_bus_id=PCI3,
                 text="NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus.")


def snap(now: float, uptime: float | None, events: tuple[Event, ...] = ()) -> Snapshot:
    host = (Sample.of("host_uptime_seconds", uptime),) if uptime is not None else ()
    cols = {
        "nvml": CollectorState("nvml", samples=tuple(gpus()), stale=False, last_success=now, last_attempt=now),
        "host": CollectorState("host", samples=host, stale=False, last_success=now, last_attempt=now),
        "kmsg": CollectorState("kmsg", samples=(), stale=False, last_success=now, last_attempt=now),
    }
    return Snapshot(now, cols, events)


def xid_gpu3(res: tuple[CheckResult, ...]) -> Status:
    return next(r.status for r in res if (r.check, r.entity) == ("xid", "gpu3"))


def evaluator() -> Evaluator:
    return Evaluator(H100, ChecksConfig(damping=DampingConfig(fail_after=1, recover_after=1), grace=300.0),
                     enabled=["nvml", "host", "kmsg"])


def test_an_xid_from_before_the_reboot_no_longer_fails_the_node() -> None:
    ev = evaluator()
    assert xid_gpu3(ev.evaluate(snap(T0, uptime=30 * 86400.0, events=(xid79(T0 - 1),)), T0)) is Status.FAIL
    # The node rebooted at T0 + 5 (within checks.rate_window of the XID); the agent kept running.
    assert xid_gpu3(ev.evaluate(snap(T0 + 10, uptime=5.0), T0 + 10)) is Status.OK


def test_an_xid_after_the_boot_still_fails_it() -> None:
    ev = evaluator()
    assert xid_gpu3(ev.evaluate(snap(T0 + 10, uptime=5.0, events=(xid79(T0 + 8),)), T0 + 10)) is Status.FAIL
    assert xid_gpu3(ev.evaluate(snap(T0 + 20, uptime=15.0), T0 + 20)) is Status.FAIL


def test_without_a_boot_time_the_events_are_kept() -> None:
    ev = evaluator()
    ev.evaluate(snap(T0, uptime=None, events=(xid79(T0 - 1),)), T0)
    assert xid_gpu3(ev.evaluate(snap(T0 + 10, uptime=None), T0 + 10)) is Status.FAIL
