"""NVLink state and error counters per GPU and link, through the NVML session shared with `nvml`.

Which links exist is learned by asking every link index up to NVML_NVLINK_MAX_LINKS once: a link
that answers INVALID_ARGUMENT or NOT_SUPPORTED does not exist on this GPU and is not asked again
until the next re-probe. A link that exists but is down answers state 0 and keeps its counters.

Each GPU is read with ONE nvmlDeviceGetFieldValues call (collectors/nvlink_fields.py): every
link's state and counters plus the throughput totals, instead of 5 calls per link. A field that
answers NOT_SUPPORTED gives no reading (and is not asked again until the re-probe), never a
failed GPU. Readings with no field id (CRC data errors on links 12-17) and drivers without
field values (FUNCTION_NOT_FOUND) or without the link-state field (every state answered
NOT_SUPPORTED / INVALID_ARGUMENT) use the per-link calls, which give the same samples. A link
state NVML refuses otherwise (UNKNOWN, NO_PERMISSION) leaves the count of links up unknown: no
nvlink_links_up, and the check says UNKNOWN rather than counting the link down. Link
state stays in every batch: it is the health signal (a down link), and inside the one call
it costs no extra round trip; what is slow-moving (which links exist, which fields the driver
supports) is learned once and re-probed every REPROBE_EVERY collections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable, Mapping

import pynvml

from podhealth.collectors import nvlink_fields
from podhealth.collectors.base import Collection, CollectorDisabled, specs
from podhealth.collectors.nvlink_fields import Ask
from podhealth.collectors.nvml import field_value
from podhealth.collectors.nvml_base import SessionCollector
from podhealth.collectors.nvml_session import (
    ABSENT_CODES, SLOW_CALL_S, Device, DeviceCalls, NvmlSession, error_text, shared,
)
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample, labels_of

# nvmlNvLinkErrorCounter_t, by contract name.
ERROR_COUNTERS: tuple[tuple[str, int], ...] = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
# A link index beyond what the GPU has answers INVALID_ARGUMENT (nvml.h, nvmlDeviceGetNvLinkState).
NO_SUCH_LINK = ABSENT_CODES | {pynvml.NVML_ERROR_INVALID_ARGUMENT}

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("nvlink_up", "gauge", "1 when the NVLink link (labels gpu, uuid, link) is active, else 0."),
    MetricSpec("nvlink_errors", "counter",
               "NVLink data-link errors by `type`: crc_flit, crc_data, replay, recovery."),
    MetricSpec("nvlink_links_up", "gauge", "Active NVLink links of the GPU (labels gpu, uuid)."),
    MetricSpec("nvlink_links_expected", "gauge",
               "NVLink links the node's hardware profile says the GPU must have up."),
    MetricSpec("nvlink_transmitted_bytes", "counter",
               "NVLink bytes the GPU sent over all links, headers included (NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX).",
               "bytes"),
    MetricSpec("nvlink_received_bytes", "counter",
               "NVLink bytes the GPU received over all links, headers included (NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX).",
               "bytes"),
)
# Throughput fields (NVML R525+, Hopper on): KiB, summed over all links when scopeId is UINT_MAX.
# The raw ones count headers too, as DCGM's DCGM_FI_DEV_NVLINK_BANDWIDTH_* fields do.
THROUGHPUT_FIELDS = (("nvlink_transmitted_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX"),
                     ("nvlink_received_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX"))
ALL_LINKS = 0xFFFFFFFF
# DeviceCalls key: this GPU's driver answers no NVML_FI_DEV_NVLINK_GET_STATE (see _batched).
STATE_FIELD = "state_field"


@dataclass
class _Plan:
    """What one batch asks of a GPU; rebuilt only when the set of unsupported keys changes."""

    unsupported: frozenset[str]
    links: list[int]
    asks: list[Ask]
    ids: list[tuple[int, int]]
    per_call: list[tuple[int, str, int]]


@dataclass
class _DeviceState:
    generation: int
    unsupported: set[str] = field(default_factory=set)
    plan: _Plan | None = None


def _links_known(calls: DeviceCalls) -> bool:
    """Whether the count of active links is known: the GPU answered and no link's state was
    refused (a state NVML would not give is no link down: the check says UNKNOWN, not FAIL)."""
    return not calls.down and not any(k.startswith("link") and "_" not in k for k in calls.unreadable)


# (name, value, gpu labels, link, type) -> the Sample (NvlinkCollector._one)
_One = Callable[[str, float, dict[str, object], "int | None", "str | None"], Sample]


def _link_samples(calls: DeviceCalls, gpu: dict[str, object], links: Iterable[int],
                  state_of: Callable[[int], float | None],
                  counter_of: Callable[[int, str, int], float | None], one: _One) -> tuple[list[Sample], int]:
    """nvlink_up and nvlink_errors per link that has a state, in link order, then nvlink_links_up
    when known; and the count of links up. Both paths (batch, per link) read through this, so
    they give the same samples; they differ only in where a state or counter comes from."""
    out: list[Sample] = []
    up = 0
    for n in links:
        state = state_of(n)
        if state is None:
            continue
        active = int(state == pynvml.NVML_FEATURE_ENABLED)
        up += active
        out.append(one("nvlink_up", active, gpu, n, None))
        for name, counter in ERROR_COUNTERS:
            v = counter_of(n, name, counter)
            if v is not None:
                out.append(one("nvlink_errors", v, gpu, n, name))
    if _links_known(calls):
        out.append(one("nvlink_links_up", up, gpu, None, None))
    return out, up


def _counter_call(calls: DeviceCalls, h: object, link: int, name: str, counter: int) -> int | None:
    return calls.get(f"link{link}_{name}", lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))


class NvlinkCollector(SessionCollector[_DeviceState]):
    name: ClassVar[str] = "nvlink"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, session: NvmlSession, links_expected: int, slow_call_s: float = SLOW_CALL_S,
                 batch: bool = True) -> None:
        """`batch=False` reads per link only (the equivalence tests compare the two ways)."""
        self._batch = batch
        self._expected = links_expected
        super().__init__(session, _DeviceState, slow_call_s)

    def _collect_once(self) -> Collection:
        _, devices = self._session.devices()
        self._next_run()
        samples: list[Sample] = []
        errors: list[str] = []
        for dev in devices:
            s, e = self._gpu(dev)
            samples.extend(s)
            errors.extend(e)
        return Collection(samples=tuple(samples), errors=tuple(errors))

    def _one(self, name: str, value: float, gpu: dict[str, object], link: int | None = None,
             kind: str | None = None) -> Sample:
        """Sample.of(name, value, link=link, type=kind, **gpu), the same object while the value holds
        (~700 readings per DGX every cycle, nearly all unchanged)."""
        return self._cache.one((name, gpu["gpu"], gpu["uuid"], link, kind), name, value,
                               lambda: labels_of(link=link, type=kind, **gpu))

    def _gpu(self, dev: Device) -> tuple[list[Sample], list[str]]:
        gpu = {"gpu": dev.index, "uuid": dev.identity.uuid or None}
        out = [self._one("nvlink_links_expected", self._expected, gpu)]
        if dev.handle is None:
            why = error_text(dev.error) if dev.error is not None else "no handle"
            return out, [f"gpu {dev.index}: nvmlDeviceGetHandleByIndex: {why}"]
        st = self._state(dev)
        calls = DeviceCalls(dev, st.unsupported, self._slow_s)
        h = dev.handle
        if self._batch and "field_values" not in st.unsupported:
            got = self._batched(calls, h, gpu, st)
            if got is not None:
                return out + got, calls.errors
        links, up = _link_samples(
            calls, gpu, range(pynvml.NVML_NVLINK_MAX_LINKS),
            lambda n: calls.get(f"link{n}", lambda: pynvml.nvmlDeviceGetNvLinkState(h, n), absent=NO_SUCH_LINK),
            lambda n, name, c: _counter_call(calls, h, n, name, c), self._one)
        out += links
        if up:
            out += self._throughput(calls, h, gpu)
        return out, calls.errors

    @staticmethod
    def _plan(unsupported: set[str]) -> _Plan | None:
        if STATE_FIELD in unsupported:
            return None  # this driver has no link-state field: read per link
        links = [n for n in range(pynvml.NVML_NVLINK_MAX_LINKS) if f"link{n}" not in unsupported]
        states = nvlink_fields.state_asks(tuple(links))
        if not states:
            return None
        asks: list[Ask] = list(states)
        per_call: list[tuple[int, str, int]] = []
        for n in links:
            for name, counter in ERROR_COUNTERS:
                a = nvlink_fields.counter_ask(n, name)
                if a is not None:
                    if a.key not in unsupported:
                        asks.append(a)
                else:
                    per_call.append((n, name, counter))
        asks += [a for a in nvlink_fields.total_asks(THROUGHPUT_FIELDS) if a.key not in unsupported]
        return _Plan(frozenset(unsupported), links, asks, [(a.field_id, a.scope) for a in asks], per_call)

    def _batched(self, calls: DeviceCalls, h: object, gpu: dict[str, object], st: _DeviceState) -> list[Sample] | None:
        """One GPU in one nvmlDeviceGetFieldValues call; None when the driver has no field values
        (or no field for link state), so the caller reads per link."""
        plan = st.plan
        if plan is None or plan.unsupported != calls.unsupported:
            plan = st.plan = self._plan(calls.unsupported)
        if plan is None:
            return None
        values = calls.get("field_values", lambda: pynvml.nvmlDeviceGetFieldValues(h, plan.ids))
        if values is None:
            # Lost or timed out: the per-link path would say the same. No field values at all
            # (an old driver): "field_values" is now unsupported, read per link.
            return [] if calls.down or "field_values" not in calls.unsupported else None
        got: dict[str, float] = {}
        answers = nvlink_fields.plain(values)
        if not calls.down and plan.links and all(
                int(v.nvmlReturn) in NO_SUCH_LINK for a, v in zip(plan.asks, answers) if a.kind == "state"):
            # The call answered, but not one link state: a driver that does not know the state
            # field (it answers per field NOT_SUPPORTED / INVALID_ARGUMENT) says nothing of the
            # links, and taking them for absent would count 0 up. nvmlDeviceGetNvLinkState tells
            # which links exist (a GPU without NVLink says so there, once per re-probe).
            calls.unsupported.add(STATE_FIELD)
            return None
        for a, v in zip(plan.asks, answers):
            if int(v.nvmlReturn) == pynvml.NVML_SUCCESS:
                got[a.key] = int(field_value(v)) if a.kind != "total" else field_value(v)
            elif a.kind == "state" or f"link{a.link}" in got or a.kind == "total":
                # A counter of a link that turned out not to exist is no error of its own.
                calls.note(a.key, pynvml.NVMLError(int(v.nvmlReturn)),
                           absent=NO_SUCH_LINK if a.kind == "state" else ABSENT_CODES)
        return self._samples(calls, h, gpu, plan.links, got, plan.per_call)

    def _samples(self, calls: DeviceCalls, h: object, gpu: dict[str, object], links: list[int],
                 got: dict[str, float], per_call: list[tuple[int, str, int]]) -> list[Sample]:
        """The batch's answers as samples, in the per-link path's order."""
        extra = {(n, name) for n, name, _ in per_call}  # no field id: asked per link, as the other path
        out, up = _link_samples(
            calls, gpu, links, lambda n: got.get(f"link{n}"),
            lambda n, name, c: _counter_call(calls, h, n, name, c) if (n, name) in extra else got.get(f"link{n}_{name}"),
            self._one)
        if up:
            for metric, _ in THROUGHPUT_FIELDS:
                if metric in got:
                    out.append(self._one(metric, got[metric] * 1024, gpu))
        return out

    def _throughput(self, calls: DeviceCalls, h: object, gpu: dict[str, object]) -> list[Sample]:
        ids = [(name, getattr(pynvml, const, None)) for name, const in THROUGHPUT_FIELDS]
        wanted = [(name, fid) for name, fid in ids if fid is not None]  # an older pynvml lacks them
        if not wanted:
            return []
        values = calls.get("throughput", lambda: pynvml.nvmlDeviceGetFieldValues(
            h, [(fid, ALL_LINKS) for _, fid in wanted]))
        out = []
        for (name, _), v in zip(wanted, values or ()):
            # A driver before R525 answers NOT_SUPPORTED per field: no series, not a zero.
            if v.nvmlReturn == pynvml.NVML_SUCCESS:
                out.append(self._one(name, field_value(v) * 1024, gpu))
        return out


def create(cfg: Config, *, links_expected: int | None = None, session: NvmlSession | None = None,
           slow_call_s: float = SLOW_CALL_S) -> NvlinkCollector:
    """The agent's nvlink collector. `links_expected` is the node's hardware profile's NVLink link
    count: a fact of checks/, which sits above the collectors, so whoever builds collectors passes it
    (checks/profiles.collector_seams; the agent and the handover suite both do). Other seams as for
    nvml.create: `session`, `slow_call_s`."""
    if links_expected is None:
        raise CollectorDisabled("no NVLink link count given (links_expected, from the hardware profile)")
    return NvlinkCollector(session if session is not None else shared(cfg.paths.nvml_library),
                           links_expected, slow_call_s)
