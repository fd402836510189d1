"""Real hardware variants through the real pynvml, the simulated NVML library, the nvml and nvlink
collectors and the passive checks: what a SKU or driver generation cannot answer is UNKNOWN (or
absent), never FAIL; only a GPU that NVML says is lost (GPU_IS_LOST) fails.

Variants: MIG on some or all GPUs (utilisation and volatile ECC NOT_SUPPORTED on the parent, as in
the A100-SXM4 MIG capture), per-call and per-field errors (NOT_SUPPORTED, NO_PERMISSION, UNKNOWN,
INVALID_ARGUMENT, TIMEOUT, GPU_IS_LOST, a driver without a function or with an older struct
version), GPUs without NVLink or with fewer links, NVLink5 without the legacy counters, row
remapping pending / failed / not supported, pre-Ampere retired pages, and clocks-event reason
bits newer than the project knows.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pynvml
import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.collectors.base import Collection
from podhealth.collectors.nvlink import NvlinkCollector
from podhealth.collectors.nvml import NvmlCollector
from podhealth.collectors.nvml_session import NvmlSession
from podhealth.config import ChecksConfig, DampingConfig
from podhealth.sim import faults, nvidia_smi, nvml_lib
from podhealth.sim.node import SimNode
from podhealth.sim.state import GpuSpec, NodeState, default_state
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Sample, Status

pytestmark = pytest.mark.timeout(60)

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH

GpuEdit = Callable[[GpuSpec], GpuSpec]


class Run:
    """One simulated node read by both NVML collectors and judged by the passive checks."""

    def __init__(self, node: SimNode, profile: profiles.Profile) -> None:
        self.node = node
        self.profile = profile
        self.session = NvmlSession()
        self.nvml = NvmlCollector(self.session)
        self.nvlink = NvlinkCollector(self.session, profile.nvlink_links)
        self.evaluator = Evaluator(profile, ChecksConfig(damping=DampingConfig(fail_after=1, recover_after=1), grace=0),
                                   enabled=["nvml", "nvlink"])
        self.cols: dict[str, Collection] = {}

    def close(self) -> None:
        self.nvml.close()
        self.nvlink.close()
        self.session.shutdown()

    def judge(self) -> dict[tuple[str, str], CheckResult]:
        now = time.time()
        self.cols = {"nvml": self.nvml.collect(), "nvlink": self.nvlink.collect()}
        states = {name: CollectorState(name, samples=c.samples, errors=c.errors, stale=False,
                                       last_success=now, last_attempt=now)
                  for name, c in self.cols.items()}
        # Undamped: a FAIL shows at the first reading (rules.yaml would hold some for 3-5), so a
        # variant that would ever FAIL shows here.
        res = self.evaluator.evaluate(Snapshot(now, states, ()), now, damped=False)
        return {(r.check, r.entity): r for r in res}

    def samples(self, name: str, gpu: int | None = None, **labels: str) -> list[Sample]:
        return [s for c in self.cols.values() for s in c.samples if s.name == name
                and (gpu is None or s.label("gpu") == str(gpu)) and all(s.label(k) == v for k, v in labels.items())]

    def value(self, name: str, gpu: int, **labels: str) -> float:
        (s,) = self.samples(name, gpu, **labels)
        return s.value


@pytest.fixture
def build(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def make(profile: str = "dgx-h100", edit: Mapping[int, GpuEdit] | GpuEdit | None = None,
             overrides: Mapping[str, Any] | None = None, state: NodeState | None = None) -> Run:
        base = state or default_state("var01", profile)
        if edit is not None:
            per = edit if isinstance(edit, Mapping) else {g.index: edit for g in base.gpus}
            base = replace(base, gpus=tuple(per[g.index](g) if g.index in per else g for g in base.gpus))
        node = SimNode.create(tmp_path / f"n{len(runs)}", "var01", seed=base)
        nvml_lib.install(node)
        run = Run(node, profiles.load(state.profile if state else profile, overrides))
        runs.append(run)
        return run

    try:
        yield make
    finally:
        for r in runs:
            r.close()
        nvml_lib.uninstall()


def fails(res: Mapping[tuple[str, str], CheckResult]) -> list[str]:
    return [f"{c}/{e}: {r.summary}" for (c, e), r in res.items() if r.status is Status.FAIL]


def status(res: Mapping[tuple[str, str], CheckResult], check: str, entity: str) -> Status:
    return res[(check, entity)].status


def errors(code: int, *names: str) -> GpuEdit:
    return lambda g: replace(g, nvml_errors={**g.nvml_errors, **{n: code for n in names}})


# --- 1. MIG -----------------------------------------------------------------------------------------

H100_MIG_LAYOUTS = {
    "7x1g": ("1g.10gb",) * 7,
    "3g+2g+1g+1g": ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
    "7g": ("7g.80gb",),
}


@pytest.mark.parametrize("layout", sorted(H100_MIG_LAYOUTS))
@pytest.mark.parametrize("which", ["all", "some"])
def test_mig_keeps_eight_gpus_and_fails_nothing(build: Callable[..., Run], layout: str, which: str) -> None:
    def mig(g: GpuSpec) -> GpuSpec:
        return replace(g, mig_mode=True, mig_devices=H100_MIG_LAYOUTS[layout])

    run = build("dgx-h100", edit=mig if which == "all" else {0: mig, 5: mig})
    res = run.judge()
    assert fails(res) == []
    assert status(res, "gpu_count", "node") is Status.OK
    assert run.samples("gpu_devices")[0].value == 8
    assert len(run.samples("gpu_up")) == 8 and all(s.value == 1 for s in run.samples("gpu_up"))
    assert {s.label("uuid") for s in run.samples("gpu_up")} == {g.uuid for g in run.node.state.gpus}
    for i in (0, 5):
        # The parent answers no utilisation in MIG mode (NOT_SUPPORTED): absent, not 0, not an error.
        assert not run.samples("gpu_utilization_ratio", i)
        assert not run.samples("gpu_ecc_errors", i, scope="volatile")
        assert run.samples("gpu_ecc_errors", i, scope="aggregate")
        for check in ("ecc", "pcie", "row_remap", "temperature", "gpu_lost", "nvlink"):
            assert status(res, check, f"gpu{i}") is Status.OK, (check, res[(check, f"gpu{i}")])
    assert run.cols["nvml"].errors == () and run.cols["nvlink"].errors == ()
    mig_on = set(range(8)) if which == "all" else {0, 5}
    assert {i for i in range(8) if run.value("gpu_mig_mode", i) == 1} == mig_on
    # The MIG devices exist behind the parents and are not counted as GPUs of their own.
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k) for k in range(len(H100_MIG_LAYOUTS[layout]))]
        assert [str(pynvml.nvmlDeviceGetName(m)) for m in migs] == [
            f"NVIDIA H100 80GB HBM3 MIG {p}" for p in H100_MIG_LAYOUTS[layout]]
        assert pynvml.nvmlDeviceGetCount() == 8
    finally:
        pynvml.nvmlShutdown()


def test_mig_on_a100_with_invalid_argument_for_whole_gpu_queries(build: Callable[..., Run]) -> None:
    # Some driver generations answer INVALID_ARGUMENT (not NOT_SUPPORTED) on a MIG parent for
    # utilisation and the encoder/decoder: the readings are absent, the GPU is up, nothing fails.
    edit = errors(INVALID_ARGUMENT, "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetEncoderUtilization",
                  "nvmlDeviceGetDecoderUtilization")
    run = build("dgx-a100", edit=lambda g: edit(replace(g, mig_mode=True, mig_devices=("3g.40gb", "4g.40gb"))))
    res = run.judge()
    assert fails(res) == []
    assert all(s.value == 1 for s in run.samples("gpu_up"))
    for i in range(8):
        assert status(res, "gpu_lost", f"gpu{i}") is Status.OK
        assert status(res, "pcie", f"gpu{i}") is Status.OK
    assert run.cols["nvml"].errors  # still said, for the operator
    # utilisation is no reading any check needs: it is not reported as unreadable for a verdict
    assert {s.label("field") for s in run.samples("gpu_field_unreadable", 0)} == {
        "utilization", "encoder_utilization", "decoder_utilization"}


# --- 2. per-call and per-field errors ---------------------------------------------------------------

# (call or field, the check that needs it): a reading a check depends on that cannot be read makes
# that check UNKNOWN on that GPU; every other check stays OK.
READINGS = [
    ("nvmlDeviceGetTotalEccErrors", "ecc"),
    ("nvmlDeviceGetRemappedRows", "row_remap"),
    ("nvmlDeviceGetCurrPcieLinkWidth", "pcie"),
    ("nvmlDeviceGetTemperatureV", "temperature"),  # the current call; older drivers: nvmlDeviceGetTemperature
    (f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}", "temperature"),
    ("nvmlDeviceGetGpuFabricInfoV", "fabric"),
    ("nvmlDeviceGetPersistenceMode", "persistence"),
]


@pytest.mark.parametrize("code", [UNKNOWN, INVALID_ARGUMENT, NO_PERMISSION, pynvml.NVML_ERROR_CORRUPTED_INFOROM])
@pytest.mark.parametrize("call, check", READINGS)
def test_an_unreadable_reading_is_unknown_for_its_check_never_fail(build: Callable[..., Run], call: str, check: str,
                                                                    code: int) -> None:
    run = build("dgx-h100", edit={3: errors(code, call)})
    res = run.judge()
    assert fails(res) == []
    assert status(res, check, "gpu3") is Status.UNKNOWN, res[(check, "gpu3")]
    assert status(res, check, "gpu2") is Status.OK
    assert run.value("gpu_up", 3) == 1 and run.value("gpu_lost", 3) == 0
    assert status(res, "gpu_lost", "gpu3") is Status.OK
    for other in ("ecc", "row_remap", "temperature", "fabric", "persistence"):
        if other != check:
            assert status(res, other, "gpu3") is Status.OK, (other, res[(other, "gpu3")])


@pytest.mark.parametrize("fault, call, check, action", [
    (("fault=thermal", "gpu=3"), f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}", "temperature", Action.DRAIN),
    (("fault=pcie-degraded", "gpu=3", "width=8"), "nvmlDeviceGetCurrPcieLinkGeneration", "pcie", Action.DRAIN),
])
def test_a_fault_read_stands_when_another_reading_is_refused(build: Callable[..., Run], fault: tuple[str, ...],
                                                             call: str, check: str, action: Action) -> None:
    # What was read decides a FAIL; a refused sibling reading only stops the check clearing the GPU.
    run = build("dgx-h100", edit={3: errors(UNKNOWN, call)})
    run.node.inject(faults.parse(list(fault), time.time()))
    res = run.judge()
    assert res[(check, "gpu3")].status is Status.FAIL and res[(check, "gpu3")].action is action


@pytest.mark.parametrize("call, check", READINGS)
def test_not_supported_is_absent_and_not_unreadable(build: Callable[..., Run], call: str, check: str) -> None:
    run = build("dgx-h100", edit={3: errors(NOT_SUPPORTED, call)})
    res = run.judge()
    assert fails(res) == []
    assert not run.samples("gpu_field_unreadable")
    assert run.value("gpu_up", 3) == 1
    assert run.cols["nvml"].errors == ()


def test_a_gpu_whose_calls_time_out_is_unknown_not_failed(build: Callable[..., Run]) -> None:
    run = build("dgx-h100", edit={4: errors(TIMEOUT, "nvmlDeviceGetUtilizationRates")})
    res = run.judge()
    assert fails(res) == []
    assert run.value("gpu_up", 4) == 0 and run.value("gpu_lost", 4) == 0
    assert status(res, "gpu_lost", "gpu4") is Status.UNKNOWN
    assert status(res, "ecc", "gpu4") is Status.UNKNOWN
    assert status(res, "gpu_lost", "gpu3") is Status.OK


def test_a_gpu_that_answers_nothing_but_errors_is_unknown(build: Callable[..., Run]) -> None:
    # Every reading of the collection refuses with UNKNOWN: the GPU does not answer. That is not
    # "fallen off the bus" (NVML did not say GPU_IS_LOST): UNKNOWN, the checks cannot judge it.
    every = [n for n in nvml_lib._IMPLS if n.startswith("nvmlDevice") and "Handle" not in n
             and n not in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo_v3",
                           "nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo")]
    run = build("dgx-h100", edit={6: errors(UNKNOWN, *every)})
    res = run.judge()
    assert fails(res) == []
    assert run.value("gpu_up", 6) == 0 and run.value("gpu_lost", 6) == 0
    assert status(res, "gpu_lost", "gpu6") is Status.UNKNOWN


@pytest.mark.parametrize("call", ["nvmlDeviceGetTemperatureV", "nvmlDeviceGetRemappedRows",
                                  f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}"])
def test_gpu_is_lost_still_fails_the_gpu(build: Callable[..., Run], call: str) -> None:
    run = build("dgx-h100", edit={2: errors(GPU_IS_LOST, call)})
    res = run.judge()
    assert run.value("gpu_lost", 2) == 1
    r = res[("gpu_lost", "gpu2")]
    assert r.status is Status.FAIL and r.action is Action.REBOOT
    assert fails(res) == [f"gpu_lost/gpu2: {r.summary}"]


def test_fabric_on_a_driver_without_the_versioned_call_or_struct(build: Callable[..., Run]) -> None:
    # R535 has no nvmlDeviceGetGpuFabricInfoV; a driver older than the binding's struct version
    # answers ARGUMENT_VERSION_MISMATCH: both fall back to nvmlDeviceGetGpuFabricInfo.
    run = build("dgx-h100", edit={0: errors(FUNCTION_NOT_FOUND, "nvmlDeviceGetGpuFabricInfoV"),
                                  1: errors(VERSION_MISMATCH, "nvmlDeviceGetGpuFabricInfoV")})
    res = run.judge()
    assert fails(res) == []
    for i in (0, 1):
        assert status(res, "fabric", f"gpu{i}") is Status.OK
        assert run.value("gpu_fabric_state", i) == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert run.cols["nvml"].errors == ()


# What older driver generations lack next to the binding (nvidia-ml-py 13): the call's symbol
# (FUNCTION_NOT_FOUND) or the struct version the binding asks for (ARGUMENT_VERSION_MISMATCH).
# nvmlDeviceGetTemperatureV and nvmlDeviceGetMarginTemperature are the newest temperature calls:
# drivers without them answer with nvmlDeviceGetTemperature and the GPU_MAX threshold.
_OLD_TEMPERATURE = {"nvmlDeviceGetTemperatureV": FUNCTION_NOT_FOUND, "nvmlDeviceGetMarginTemperature": FUNCTION_NOT_FOUND}
DRIVER_GENERATIONS: dict[str, dict[str, int]] = {
    "R525": {"nvmlDeviceGetCurrentClocksEventReasons": FUNCTION_NOT_FOUND,
             "nvmlDeviceGetSupportedClocksEventReasons": FUNCTION_NOT_FOUND,
             "nvmlDeviceGetGpuFabricInfoV": FUNCTION_NOT_FOUND, **_OLD_TEMPERATURE},
    "R535": {"nvmlDeviceGetGpuFabricInfoV": FUNCTION_NOT_FOUND, **_OLD_TEMPERATURE},
    "R550": {"nvmlDeviceGetGpuFabricInfoV": VERSION_MISMATCH, "nvmlDeviceGetTemperatureV": FUNCTION_NOT_FOUND},
    "R570": {},
}


@pytest.mark.parametrize("generation", sorted(DRIVER_GENERATIONS))
def test_driver_generations_read_the_same_verdicts(build: Callable[..., Run], generation: str) -> None:
    missing = DRIVER_GENERATIONS[generation]
    run = build("dgx-h100", edit=lambda g: replace(g, nvml_errors=dict(missing)))
    res = run.judge()
    assert fails(res) == [] and run.cols["nvml"].errors == ()
    for i in range(8):
        assert status(res, "fabric", f"gpu{i}") is Status.OK
        assert run.value("gpu_clocks_event_active", i, reason="gpu_idle") == 1
        g = run.node.state.gpu(i)
        assert run.value("gpu_temperature_celsius", i) == g.temperature_c
        assert run.value("gpu_thermal_margin_celsius", i) == g.temp_max_operating_c - g.temperature_c
    assert status(res, "clocks", "node") is Status.OK


@pytest.mark.parametrize("code, verdict", [(UNKNOWN, Status.UNKNOWN), (NO_PERMISSION, Status.UNKNOWN),
                                           (GPU_IS_LOST, Status.FAIL)])
def test_a_refused_handle(build: Callable[..., Run], code: int, verdict: Status) -> None:
    # nvmlDeviceGetHandleByIndex refused: NO_PERMISSION where a container's device cgroup hides the
    # GPU, UNKNOWN from a confused driver: the GPU cannot be judged. GPU_IS_LOST: it is gone.
    run = build("dgx-h100", edit={7: errors(code, "nvmlDeviceGetHandleByIndex_v2")})
    res = run.judge()
    assert run.samples("gpu_devices")[0].value == 8
    assert run.value("gpu_up", 7) == 0
    assert status(res, "gpu_lost", "gpu7") is verdict
    assert status(res, "ecc", "gpu7") is Status.UNKNOWN and status(res, "nvlink", "gpu7") is Status.UNKNOWN
    assert [k for k, r in res.items() if r.status is Status.FAIL and k != ("gpu_lost", "gpu7")] == []


def test_memory_info_v2_version_mismatch_falls_back_to_v1(build: Callable[..., Run]) -> None:
    run = build("dgx-h100", edit={0: errors(VERSION_MISMATCH, "nvmlDeviceGetMemoryInfo_v2")})
    run.judge()
    assert run.value("gpu_memory_total_bytes", 0) == run.node.state.gpu(0).memory_total_mib << 20
    assert run.cols["nvml"].errors == ()


# --- NVLink variants ----------------------------------------------------------------------------------


def test_pcie_gpus_without_nvlink(build: Callable[..., Run]) -> None:
    # H100 PCIe without bridges: no NVLink, no NVSwitch fabric (a site profile says nvlink_links 0).
    run = build("dgx-h100", edit=lambda g: replace(g, name="NVIDIA H100 PCIe", nvlink_count=0, has_fabric=False),
                overrides={"nvlink_links": 0, "has_nvswitch_fabric": False, "gpu_model": "NVIDIA H100 PCIe"})
    res = run.judge()
    assert fails(res) == []
    assert not run.samples("nvlink_up")
    assert run.cols["nvlink"].errors == ()


def down_links(run: Run, gpus: range | list[int], links: range) -> None:
    for g in gpus:
        for n in links:
            run.node.inject(faults.parse(["fault=nvlink-down", f"gpu={g}", f"link={n}"], time.time()))


def test_gpus_reporting_no_nvlink_under_an_nvlink_profile_are_unknown(build: Callable[..., Run]) -> None:
    # A PCIe build or a VM run with an SXM profile: NVML answers NOT_SUPPORTED for every link. No link
    # is seen down (a failed link still exists and reads inactive): UNKNOWN, never "0 of 18 up".
    run = build("dgx-h100", edit={2: lambda g: replace(g, nvlink_count=0)})
    res = run.judge()
    assert fails(res) == []
    assert status(res, "nvlink", "gpu2") is Status.UNKNOWN and run.value("nvlink_links_up", 2) == 0
    assert status(res, "nvlink", "gpu1") is Status.OK


def test_pcie_gpus_whose_links_exist_but_have_no_bridge(build: Callable[..., Run]) -> None:
    # An A100/H100 PCIe card without its bridge reports its 12 links, all inactive (NVSentinel PR
    # #1481, A100 80GB PCIe, driver 570.133.20): with a profile that expects no NVLink, no verdict.
    run = build("dgx-h100", edit=lambda g: replace(g, name="NVIDIA H100 PCIe", nvlink_count=12, has_fabric=False),
                overrides={"nvlink_links": 0, "has_nvswitch_fabric": False, "gpu_model": "NVIDIA H100 PCIe"})
    down_links(run, range(8), range(12))
    res = run.judge()
    assert fails(res) == []
    assert all(run.value("nvlink_links_up", i) == 0 for i in range(8))
    assert not any(c == "nvlink" for c, _ in res)


def test_links_of_a_mig_gpu_are_not_judged_others_are(build: Callable[..., Run]) -> None:
    # MIG instances use no NVLink (no GPU-to-GPU P2P in MIG mode): should a driver show the links of
    # a MIG GPU inactive, that is no fence reason (UNKNOWN); the same on a non-MIG GPU fails.
    run = build("dgx-h100", edit={3: lambda g: replace(g, mig_mode=True, mig_devices=("7g.80gb",))})
    down_links(run, [3, 4], range(18))
    res = run.judge()
    assert status(res, "nvlink", "gpu3") is Status.UNKNOWN
    assert res[("nvlink", "gpu4")].status is Status.FAIL and res[("nvlink", "gpu4")].action is Action.REBOOT
    assert status(res, "nvlink", "gpu2") is Status.OK


@pytest.mark.parametrize("code", [NOT_SUPPORTED, INVALID_ARGUMENT])
def test_a_driver_without_the_link_state_field_reads_links_per_call(build: Callable[..., Run], code: int) -> None:
    # Field values work, but this driver answers the link-state field per field with an error it
    # also uses for "no such link": that says nothing of the links, which the per-link call knows.
    run = build("dgx-h100", edit=errors(code, f"field:{pynvml.NVML_FI_DEV_NVLINK_GET_STATE}"))
    for _ in range(2):
        res = run.judge()
        assert fails(res) == []
        assert all(run.value("nvlink_links_up", i) == 18 for i in range(8))
        assert status(res, "nvlink", "gpu0") is Status.OK
    down_links(run, [6], range(2))
    res = run.judge()
    assert res[("nvlink", "gpu6")].status is Status.FAIL and run.value("nvlink_links_up", 6) == 16


def test_nvlink_bridged_pairs_with_fewer_links(build: Callable[..., Run]) -> None:
    # H100 NVL pairs bridged over fewer links than an SXM part: links past the GPU's count answer
    # INVALID_ARGUMENT and do not exist; with the profile saying so, every link is up.
    run = build("dgx-h100", edit=lambda g: replace(g, nvlink_count=12, has_fabric=False),
                overrides={"nvlink_links": 12, "has_nvswitch_fabric": False})
    res = run.judge()
    assert fails(res) == []
    assert all(run.value("nvlink_links_up", i) == 12 for i in range(8))
    assert status(res, "nvlink", "gpu0") is Status.OK


LEGACY_COUNTERS = (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
                   pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX,
                   pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX,
                   *[getattr(pynvml, f"NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L{n}") for n in range(12)])


@pytest.mark.parametrize("code", [NOT_SUPPORTED, UNKNOWN])
def test_nvlink5_without_the_legacy_counters(build: Callable[..., Run], code: int) -> None:
    # B200: 18 NVLink5 links; a driver that moved the error counters to the NVLink5 fields answers
    # the legacy ones per field, inside an OK nvmlDeviceGetFieldValues: counters absent, links judged.
    run = build("dgx-b200", edit=errors(code, "nvmlDeviceGetNvLinkErrorCounter",
                                        *[f"field:{f}" for f in LEGACY_COUNTERS]))
    res = run.judge()
    assert fails(res) == []
    assert all(run.value("nvlink_links_up", i) == 18 for i in range(8))
    assert not run.samples("nvlink_errors")
    assert status(res, "nvlink", "gpu7") is Status.OK


@pytest.mark.parametrize("code", [UNKNOWN, NO_PERMISSION, TIMEOUT])
def test_unreadable_link_state_is_unknown_not_a_link_down(build: Callable[..., Run], code: int) -> None:
    state = pynvml.NVML_FI_DEV_NVLINK_GET_STATE
    run = build("dgx-h100", edit={1: errors(code, f"field:{state}", "nvmlDeviceGetNvLinkState")})
    res = run.judge()
    assert fails(res) == []
    assert status(res, "nvlink", "gpu1") is Status.UNKNOWN
    assert status(res, "nvlink", "gpu0") is Status.OK


def test_a_link_really_down_still_fails(build: Callable[..., Run]) -> None:
    run = build("dgx-h100")
    run.node.inject(faults.parse(["fault=nvlink-down", "gpu=2", "link=4"], time.time()))
    res = run.judge()
    assert status(res, "nvlink", "gpu2") is Status.FAIL


# --- 3. row remapping and retired pages -------------------------------------------------------------


def test_row_remap_pending_and_failure_flags(build: Callable[..., Run]) -> None:
    run = build("dgx-h100", edit={1: lambda g: replace(g, remap_pending=True, remap_correctable=1),
                                  2: lambda g: replace(g, remap_failure=True, remap_uncorrectable=3)})
    res = run.judge()
    pending, failure = res[("row_remap", "gpu1")], res[("row_remap", "gpu2")]
    assert pending.status is Status.FAIL and pending.action is Action.RESET_GPU
    assert failure.status is Status.FAIL and failure.action is Action.REPLACE
    assert status(res, "row_remap", "gpu0") is Status.OK


def test_gpus_without_row_remapping_are_not_judged_on_it(build: Callable[..., Run]) -> None:
    # A GPU (or a VM's passthrough, as in the A100 MIG capture: "remapped_rows N/A") that answers
    # NOT_SUPPORTED has no row-remap verdict at all; the rest of the node is unaffected.
    run = build("dgx-a100", edit=lambda g: replace(g, remap_correctable=None, remap_uncorrectable=None))
    res = run.judge()
    assert fails(res) == []
    assert not any(c == "row_remap" for c, _ in res)
    assert not run.samples("gpu_remapped_rows")


def test_pre_ampere_retired_pages(build: Callable[..., Run]) -> None:
    def volta(g: GpuSpec) -> GpuSpec:
        return replace(g, architecture="volta", remap_correctable=None, remap_uncorrectable=None,
                       retired_pages_sbe=0, retired_pages_dbe=0, has_fabric=False)

    run = build("dgx-a100", edit={**{i: volta for i in range(8)},
                                  3: lambda g: replace(volta(g), retired_pages_dbe=1, retired_pages_pending=True),
                                  4: lambda g: replace(volta(g), retired_pages_pending=True)})
    res = run.judge()
    assert not any(c == "row_remap" for c, _ in res)
    assert status(res, "retired_pages", "gpu0") is Status.OK
    assert res[("retired_pages", "gpu3")].action is Action.REPLACE
    assert res[("retired_pages", "gpu4")].status is Status.FAIL and res[("retired_pages", "gpu4")].action is Action.RESET_GPU
    assert {e for (c, e) in res if c == "retired_pages" and res[(c, e)].status is Status.FAIL} == {"gpu3", "gpu4"}


# --- 4. clocks-event reasons --------------------------------------------------------------------------

BOARD_LIMIT, RELIABILITY, FUTURE = 0x200, 0x400, 1 << 40


@pytest.mark.parametrize("bits", [BOARD_LIMIT, RELIABILITY, FUTURE, BOARD_LIMIT | RELIABILITY | FUTURE | 0x1])
def test_clock_reason_bits_the_project_does_not_know_do_not_fail(build: Callable[..., Run], bits: int) -> None:
    run = build("dgx-h100", edit=lambda g: replace(g, clocks_event_reasons=bits, clocks_event_supported=0x7FF | FUTURE))
    res = run.judge()
    assert fails(res) == []
    assert status(res, "clocks", "node") is Status.OK
    known = {s.label("reason") for s in run.samples("gpu_clocks_event_active", 0)}
    assert "gpu_idle" in known and all(s.value in (0, 1) for s in run.samples("gpu_clocks_event_active"))


def test_known_bad_reason_among_unknown_bits_still_counts(build: Callable[..., Run]) -> None:
    run = build("dgx-h100", edit={5: lambda g: replace(g, clocks_event_reasons=0x8 | 0x40 | FUTURE)})
    res = run.judge()
    r = res[("clocks", "node")]
    assert r.status is Status.FAIL and "5" in dict(r.evidence)["gpus"]


# --- real captures ------------------------------------------------------------------------------------


def test_every_real_capture_fails_only_what_it_shows(shared_fixtures: Path, build: Callable[..., Run]) -> None:
    """Nodes seeded from the real nvidia-smi -q corpus (H100 535/565, H200 VM, GH200 C2C, A100 with a
    pending remap, a truncated capture), judged with their model's profile sized to the capture:
    the only FAIL is the remap a capture shows pending."""
    captures = sorted(p for p in (shared_fixtures / "nvidia_smi").glob("nvidia-smi-q_*.txt")
                      if not p.name.endswith(".source.txt"))
    assert len(captures) >= 6
    for path in captures:
        text = path.read_text(errors="replace")
        cap = nvidia_smi.parse(text)
        state = nvidia_smi.to_state(cap, "var01")
        run = build(state=state, overrides={"gpu_count": len(cap.gpus)})
        res = run.judge()
        # Independent of the parser: GPU sections whose "Remapped Rows" block says Pending: Yes.
        sections = re.split(r"^GPU [0-9A-F]{8}:", text, flags=re.M)[1:]
        pending = {f"gpu{i}" for i, sec in enumerate(sections)
                   if re.search(r"Remapped Rows(?:(?!\n    \S).)*?Pending\s+: Yes", sec, re.S)}
        assert {f"{c}/{e}" for (c, e), r in res.items() if r.status is Status.FAIL} == {
            f"row_remap/{g}" for g in pending}, path.name
        assert not [r for r in res.values() if r.status is Status.UNKNOWN], path.name
        run.close()


def test_fabric_state_not_supported_is_unknown_not_a_fabric_fault() -> None:
    prof = profiles.load("dgx-h100")
    now = time.time()
    samples = [Sample.of("gpu_devices", 2)]
    for i, state in ((0, 0), (1, 1)):  # NOT_SUPPORTED, NOT_STARTED
        lab = {"gpu": i, "uuid": f"GPU-{i}"}
        samples += [Sample.of("gpu_up", 1, **lab), Sample.of("gpu_lost", 0, **lab), Sample.of("gpu_fabric_state", state, **lab)]
    snap = Snapshot(now, {"nvml": CollectorState("nvml", samples=tuple(samples), stale=False, last_success=now,
                                                 last_attempt=now)}, ())
    res = {(r.check, r.entity): r for r in Evaluator(prof, ChecksConfig(grace=0), enabled=["nvml"]).evaluate(
        snap, now, damped=False)}
    assert status(res, "fabric", "gpu0") is Status.UNKNOWN
    assert status(res, "fabric", "gpu1") is Status.FAIL  # fabric manager never registered it: a real fault


def test_variant_state_survives_the_state_file() -> None:
    # The simulator's CLI and agent processes share the node through its JSON state file.
    base = default_state("var01", "dgx-h100")
    g0 = replace(base.gpus[0], mig_mode=True, mig_devices=("3g.40gb", "4g.40gb"), clocks_event_supported=0x7FF,
                 nvml_errors={"nvmlDeviceGetUtilizationRates": INVALID_ARGUMENT, f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}": UNKNOWN})
    state = replace(base, gpus=(g0,) + base.gpus[1:])
    back = NodeState.loads(state.dumps())
    assert back.gpus[0] == g0 and back.gpus[1] == base.gpus[1]
    assert isinstance(back.gpus[0].mig_devices, tuple)


# --- 6. warnings before the XID: T.Limit margin, spare-row availability ----------------------------

# The Temperature section of an R550 `nvidia-smi -q` (1x L4, driver 550.90.07: the capture
# ../shared/fixtures/nvidia_smi/nvidia-smi-q_l4_1gpu_550.90.07_thamada.txt), where thresholds are
# offsets from T.Limit and no absolute threshold is printed.
L4_TEMPERATURE = """\
==============NVSMI LOG==============

Driver Version                            : 550.90.07
CUDA Version                              : 12.4

Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA L4
    Product Architecture                  : Ada Lovelace
    Remapped Rows
        Correctable Error                 : 0
        Uncorrectable Error               : 0
        Pending                           : No
        Remapping Failure Occurred        : No
        Bank Remap Availability Histogram
            Max                           : 96 bank(s)
            High                          : 0 bank(s)
            Partial                       : 0 bank(s)
            Low                           : 0 bank(s)
            None                          : 0 bank(s)
    Temperature
        GPU Current Temp                  : 33 C
        GPU T.Limit Temp                  : 53 C
        GPU Shutdown T.Limit Temp         : -5 C
        GPU Slowdown T.Limit Temp         : -2 C
        GPU Max Operating T.Limit Temp    : 0 C
        GPU Target Temperature            : N/A
        Memory Current Temp               : N/A
        Memory Max Operating T.Limit Temp : N/A
"""


def test_t_limit_thresholds_are_seeded_and_read_back_through_nvml(build: Callable[..., Run]) -> None:
    state = nvidia_smi.to_state(nvidia_smi.parse(L4_TEMPERATURE), "var01", "generic")
    g = state.gpu(0)
    # T.Limit = 33 + 53 = 86 C; shutdown 5 C past it, slowdown 2 C past it
    assert (g.temp_max_operating_c, g.temp_slowdown_c, g.temp_shutdown_c) == (86, 88, 91)
    assert g.remap_histogram == (96, 0, 0, 0, 0)
    run = build(state=state)
    res = run.judge()
    assert run.value("gpu_thermal_margin_celsius", 0) == 53
    assert run.value("gpu_row_remap_banks", 0, availability="max") == 96
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMarginTemperature(h) == 53
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == 33
    assert pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) == 88
    assert status(res, "temperature", "gpu0") is Status.OK and status(res, "row_remap", "gpu0") is Status.OK


def test_a_gpu_near_its_t_limit_warns_before_any_absolute_threshold(build: Callable[..., Run]) -> None:
    # 84 C is below the profile's 85 C warn, but 2 C from this GPU's own T.Limit (86 C, an L4's)
    run = build("dgx-h100", edit={3: lambda g: replace(g, temperature_c=84, temp_max_operating_c=86)})
    res = run.judge()
    r = res[("temperature", "gpu3")]
    assert r.status is Status.WARN and "T.Limit" in r.summary, r
    assert dict(r.evidence)["t_limit_margin_c"] == "2.0"
    assert status(res, "temperature", "gpu2") is Status.OK
    assert fails(res) == []


def test_banks_low_on_spare_rows_warn_before_the_remap_fails(build: Callable[..., Run]) -> None:
    run = build("dgx-h100")
    assert status(run.judge(), "row_remap", "gpu5") is Status.OK  # read once healthy: the agent's case
    run.node.inject(faults.parse("fault=row-remap-low gpu=5 count=2".split(), time.time()))
    run.node.inject(faults.parse("fault=row-remap-failure gpu=6".split(), time.time()))
    res = run.judge()
    assert run.value("gpu_row_remap_banks", 5, availability="low") == 2
    assert run.value("gpu_row_remap_banks", 6, availability="none") == 1
    r = res[("row_remap", "gpu5")]
    assert r.status is Status.WARN and "low on spare rows" in r.summary, r
    assert res[("row_remap", "gpu6")].status is Status.FAIL  # the failure itself still fails
    assert status(res, "row_remap", "gpu4") is Status.OK
    h = pynvml.nvmlDeviceGetHandleByIndex(5)
    hist = pynvml.nvmlDeviceGetRowRemapperHistogram(h)
    assert (hist.max, hist.low, hist.none) == (2558, 2, 0)


# --- 7. GB200 NVL72: NVLink5 fabric state per GPU and the rack's NVLink domain ---------------------


def test_gb200_gpus_register_in_the_racks_domain(build: Callable[..., Run]) -> None:
    run = build("gb200-nvl72")
    res = run.judge()
    infos = run.samples("gpu_fabric_info")
    assert len(infos) == 4 and len({(s.label("cluster_uuid"), s.label("clique_id")) for s in infos}) == 1
    assert all(run.value("gpu_fabric_degraded_bandwidth", i) == 0 for i in range(4))
    assert [status(res, "fabric", f"gpu{i}") for i in range(4)] == [Status.OK] * 4
    assert fails(res) == []


def test_an_8_gpu_board_reports_no_domain(build: Callable[..., Run]) -> None:
    run = build("dgx-h100")
    run.judge()
    assert run.samples("gpu_fabric_info") == [] and run.samples("gpu_fabric_degraded_bandwidth") == []


def test_gb200_gpu_in_another_domain_fails_and_degraded_bandwidth_warns(build: Callable[..., Run]) -> None:
    run = build("gb200-nvl72")
    run.node.inject(faults.parse("fault=fabric-wrong-cluster gpu=2".split(), time.time()))
    run.node.inject(faults.parse("fault=fabric-degraded-bw gpu=1".split(), time.time()))
    res = run.judge()
    r = res[("fabric", "gpu2")]
    assert r.status is Status.FAIL and r.action is Action.REBOOT and "its tray's other GPUs" in r.summary, r
    assert res[("fabric", "gpu1")].status is Status.WARN
    assert status(res, "fabric", "gpu0") is Status.OK and status(res, "fabric", "gpu3") is Status.OK
