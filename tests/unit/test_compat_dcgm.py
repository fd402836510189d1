"""`--compat dcgm-exporter`: the pure mapping from podhealth samples to DCGM_FI_* series."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from podhealth import pci
from podhealth.collectors.compat_dcgm import FIELDS, METRICS, to_dcgm
from podhealth.vocab import Event, Sample

GPU0 = {"gpu": 0, "uuid": "GPU-aaaa", "pci_bus_id": "0000:18:00.0", "model": "NVIDIA H100 80GB HBM3"}
GPU1 = {"gpu": 1, "uuid": "GPU-bbbb", "pci_bus_id": "0000:db:00.0", "model": "NVIDIA H100 80GB HBM3"}
MIB = 1 << 20


def nvml_samples() -> list[Sample]:
    out: list[Sample] = []
    for g in (GPU0, GPU1):
        out += [
            Sample.of("gpu_up", 1, **g),
            Sample.of("gpu_info", 1, driver_version="565.57.01", cuda_driver_version="12.7",
                      vbios_version="96.00.74.00.01", serial="1654", **g),
            Sample.of("gpu_temperature_celsius", 40 + g["gpu"], **g),  # type: ignore[operator]
            Sample.of("gpu_sm_clock_hertz", 1_980_000_000, **g),
            Sample.of("gpu_memory_clock_hertz", 2_619_000_000, **g),
            Sample.of("gpu_utilization_ratio", 0.25, **g),
            Sample.of("gpu_memory_utilization_ratio", 0.5, **g),
            Sample.of("gpu_power_watts", 106.5, **g),
            Sample.of("gpu_energy_joules", 12.345, **g),
            Sample.of("gpu_memory_total_bytes", 81559 * MIB, **g),
            Sample.of("gpu_memory_used_bytes", 1000 * MIB, **g),
            Sample.of("gpu_memory_free_bytes", 80000 * MIB, **g),
            Sample.of("gpu_ecc_errors", 7, type="corrected", scope="volatile", **g),
            Sample.of("gpu_ecc_errors", 2, type="uncorrected", scope="volatile", **g),
            Sample.of("gpu_ecc_errors", 70, type="corrected", scope="aggregate", **g),
            Sample.of("gpu_ecc_errors", 20, type="uncorrected", scope="aggregate", **g),
            Sample.of("gpu_remapped_rows", 3, type="correctable", **g),
            Sample.of("gpu_remapped_rows", 1, type="uncorrectable", **g),
            Sample.of("gpu_remapped_rows_failure", 0, **g),
            Sample.of("gpu_pcie_replay", 15, **g),
        ]
        for link in range(3):
            ids = {"gpu": g["gpu"], "uuid": g["uuid"], "link": link}
            out += [Sample.of("nvlink_errors", link * 10, type="crc_flit", **ids),
                    Sample.of("nvlink_errors", 1, type="replay", **ids),
                    Sample.of("nvlink_up", 1, **ids)]
    return out


def get(out: tuple[Sample, ...], name: str, gpu: int) -> Sample:
    found = [s for s in out if s.name == name and s.label("gpu") == str(gpu)]
    assert len(found) == 1, f"{name} gpu {gpu}: {found}"
    return found[0]


def test_names_units_and_labels() -> None:
    out = to_dcgm(nvml_samples(), hostname="dgx01")
    temp = get(out, "DCGM_FI_DEV_GPU_TEMP", 1)
    assert temp.value == 41
    assert dict(temp.labels) == {
        "gpu": "1", "UUID": "GPU-bbbb", "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "dgx01", "pci_bus_id": "00000000:DB:00.0", "DCGM_FI_DRIVER_VERSION": "565.57.01",
    }
    assert get(out, "DCGM_FI_DEV_SM_CLOCK", 0).value == 1980  # MHz
    assert get(out, "DCGM_FI_DEV_MEM_CLOCK", 0).value == 2619
    assert get(out, "DCGM_FI_DEV_GPU_UTIL", 0).value == 25  # percent
    assert get(out, "DCGM_FI_DEV_MEM_COPY_UTIL", 0).value == 50
    assert get(out, "DCGM_FI_DEV_POWER_USAGE", 0).value == 106.5
    assert get(out, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0).value == pytest.approx(12345)  # mJ
    assert get(out, "DCGM_FI_DEV_FB_USED", 0).value == 1000  # MiB
    assert get(out, "DCGM_FI_DEV_FB_FREE", 0).value == 80000
    assert get(out, "DCGM_FI_DEV_FB_RESERVED", 0).value == 559
    assert get(out, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0).value == 15


def test_ecc_remap_and_nvlink_totals() -> None:
    out = to_dcgm(nvml_samples(), hostname="dgx01")
    assert get(out, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0).value == 7
    assert get(out, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0).value == 2
    assert get(out, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 0).value == 70
    assert get(out, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 0).value == 20
    assert get(out, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 1).value == 3
    assert get(out, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1).value == 1
    assert get(out, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1).value == 0
    # Per-link counters add up per GPU, as DCGM's *_TOTAL fields do.
    assert get(out, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0).value == 0 + 10 + 20
    assert get(out, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 1).value == 3


def test_absent_stays_absent() -> None:
    samples = [s for s in nvml_samples() if s.name != "gpu_ecc_errors" and not s.name.startswith("nvlink")]
    out = to_dcgm(samples, hostname="dgx01")
    names = {s.name for s in out}
    assert not any(n.startswith("DCGM_FI_DEV_ECC_") for n in names)
    assert not any(n.startswith("DCGM_FI_DEV_NVLINK_") for n in names)
    assert "DCGM_FI_DEV_RETIRED_SBE" not in names and "DCGM_FI_DEV_MEMORY_TEMP" not in names
    assert "DCGM_FI_DEV_XID_ERRORS" not in names  # no event source given
    # Samples of GPUs the nvml collector does not identify are not guessed at.
    assert to_dcgm([Sample.of("gpu_temperature_celsius", 40, gpu=9)], hostname="x") == ()


def test_last_xid_per_gpu_by_index_or_pci_address() -> None:
    now = time.time()
    events = [
        Event("xid", 31, now - 10, gpu=0),
        Event("xid", 79, now - 5, gpu=0),
        Event("xid", 13, now - 20, pci_bus_id="0000:db:00.0"),  # resolved by address
        Event("sxid", 20034, now, device="nvswitch0"),
    ]
    out = to_dcgm(nvml_samples(), hostname="dgx01", events=events)
    assert get(out, "DCGM_FI_DEV_XID_ERRORS", 0).value == 79
    assert get(out, "DCGM_FI_DEV_XID_ERRORS", 1).value == 13
    none = to_dcgm(nvml_samples(), hostname="dgx01", events=[])
    assert get(none, "DCGM_FI_DEV_XID_ERRORS", 0).value == 0


def test_every_output_name_has_a_spec_and_pci_ids_round_trip() -> None:
    out = to_dcgm(nvml_samples(), hostname="h", events=[])
    assert {s.name for s in out} <= set(METRICS)
    assert pci.dcgm_form("0000:18:00.0") == "00000000:18:00.0"
    assert pci.dcgm_form("0001:b1:00.0") == "00000001:B1:00.0"


def test_types_and_names_agree_with_dcgm_exporters_counters_file(shared_fixtures: Path) -> None:
    """Every field both we and dcgm-exporter's default-counters.csv define has the same type."""
    declared: dict[str, str] = {}
    for line in (shared_fixtures / "dcgm" / "dcgm-exporter_default-counters.csv").read_text().splitlines():
        text = line.lstrip("# ").strip()
        parts = [p.strip() for p in text.split(",")]
        if len(parts) >= 3 and parts[0].startswith("DCGM_FI_") and parts[1] in ("gauge", "counter", "label"):
            declared[parts[0]] = parts[1]
    assert len(declared) > 30
    mapped_dev = {f.field for f in FIELDS if f.field.startswith("DCGM_FI_DEV_")} | {
        "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_XID_ERRORS"}
    unknown = mapped_dev - set(declared)
    assert not unknown, f"not dcgm-exporter field names: {sorted(unknown)}"
    for name in mapped_dev:
        assert METRICS[name].kind == declared[name], name


@pytest.fixture
def sim_samples(tmp_path: Path) -> Iterator[list[Sample]]:
    from podhealth.collectors import nvlink, nvml
    from podhealth.collectors.nvml_session import NvmlSession
    from podhealth.config import Config
    from podhealth.sim import nvml_lib
    from podhealth.sim.node import SimNode

    nvml_lib.install(SimNode.create(tmp_path, "dgx01", "dgx-h100"))
    session = NvmlSession()
    try:
        a = nvml.create(Config(), session=session).collect()
        b = nvlink.create(Config(), links_expected=18, session=session).collect()
        yield list(a.samples + b.samples)
    finally:
        session.shutdown()
        nvml_lib.uninstall()


def test_on_the_collectors_output(sim_samples: list[Sample]) -> None:
    out = to_dcgm(sim_samples, hostname="dgx01", events=[])
    temps = [s for s in out if s.name == "DCGM_FI_DEV_GPU_TEMP"]
    assert sorted(int(s.label("gpu")) for s in temps) == list(range(8))
    assert all(s.label("pci_bus_id").startswith("00000000:") and s.label("UUID").startswith("GPU-") for s in temps)
    assert all(s.label("DCGM_FI_DRIVER_VERSION") for s in temps)
    assert not [s for s in out if s.name.startswith("DCGM_FI_DEV_RETIRED")]  # H100: not supported
    assert len([s for s in out if s.name == "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"]) == 8


def test_video_engines_nvlink_bandwidth_and_clock_reasons() -> None:
    g = {"gpu": 0, "uuid": "GPU-aaaa"}
    extra = [
        Sample.of("gpu_encoder_utilization_ratio", 0.12, **g),
        Sample.of("gpu_decoder_utilization_ratio", 0.5, **g),
        Sample.of("nvlink_transmitted_bytes", 1000, **g),
        Sample.of("nvlink_received_bytes", 234, **g),
        Sample.of("gpu_clocks_event_active", 0, reason="gpu_idle", **g),
        Sample.of("gpu_clocks_event_active", 1, reason="hw_slowdown", **g),
        Sample.of("gpu_clocks_event_active", 1, reason="hw_thermal_slowdown", **g),
        Sample.of("dcgm_gr_engine_active_ratio", 0.75, **g),
    ]
    out = to_dcgm(nvml_samples() + extra, hostname="dgx01")
    assert get(out, "DCGM_FI_DEV_ENC_UTIL", 0).value == 12
    assert get(out, "DCGM_FI_DEV_DEC_UTIL", 0).value == 50
    assert get(out, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 0).value == 1234  # both directions
    # nvml.h: HwSlowdown 0x8, HwThermalSlowdown 0x40; the old and the new field name.
    assert get(out, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0).value == 0x48
    assert get(out, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0).value == 0x48
    assert get(out, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0).value == 0.75  # a ratio, as DCGM's
    # GPU 1 reported none of these: absent, not zero.
    names1 = {s.name for s in out if s.label("gpu") == "1"}
    assert not names1 & {"DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                         "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}


def test_job_labels_hook() -> None:
    jobs = {"GPU-bbbb": {"pod": "train-0", "namespace": "ml", "container": "main", "evil": "x"}}
    out = to_dcgm(nvml_samples(), hostname="dgx01", jobs=jobs)
    one = dict(get(out, "DCGM_FI_DEV_GPU_TEMP", 1).labels)
    assert (one["pod"], one["namespace"], one["container"]) == ("train-0", "ml", "main") and "evil" not in one
    zero = dict(get(out, "DCGM_FI_DEV_GPU_TEMP", 0).labels)
    assert not {"pod", "namespace", "container"} & set(zero)  # a GPU nobody uses: no job labels


def test_sim_answers_the_new_nvml_calls(sim_samples: list[Sample]) -> None:
    out = to_dcgm(sim_samples, hostname="dgx01", events=[])
    # Seeded from an idle H100 capture: encoder and decoder 0 %, only gpu_idle active (bit 0x1).
    assert [s.value for s in out if s.name == "DCGM_FI_DEV_ENC_UTIL"] == [0.0] * 8
    assert [s.value for s in out if s.name == "DCGM_FI_DEV_DEC_UTIL"] == [0.0] * 8
    assert [s.value for s in out if s.name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == [1.0] * 8
    bw = [s.value for s in out if s.name == "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]
    assert len(bw) == 8 and all(v > 0 for v in bw)  # idle fabric management traffic
    assert not [s for s in out if s.name.startswith("DCGM_FI_PROF_")]  # no DCGM on the simulator


# ---- surviving dcgm-exporter's next release (issue 28 section 6) ---------------------------------


def test_the_host_label_is_a_setting() -> None:
    old = get(to_dcgm(nvml_samples(), "dgx01"), "DCGM_FI_DEV_GPU_TEMP", 0)
    assert old.label("Hostname") == "dgx01" and old.label("hostname") == ""
    new = get(to_dcgm(nvml_samples(), "dgx01", hostname_label="hostname"), "DCGM_FI_DEV_GPU_TEMP", 0)
    assert new.label("hostname") == "dgx01" and new.label("Hostname") == ""
    with pytest.raises(ValueError, match="hostname label"):
        to_dcgm(nvml_samples(), "dgx01", hostname_label="host")
    from podhealth import config

    assert config.Config().exporters.dcgm_exporter.hostname_label == "Hostname"
    assert config.loads("exporters: {dcgm_exporter: {hostname_label: hostname}}\n").exporters.dcgm_exporter \
        .hostname_label == "hostname"


def test_default_counters_are_counters(shared_fixtures: Path) -> None:
    # every field default-counters.csv types `counter` is one here, and renders as one
    csv = (shared_fixtures / "dcgm" / "dcgm-exporter_default-counters.csv").read_text()
    declared = {ln.split(",")[0].strip(): ln.split(",")[1].strip() for ln in csv.splitlines()
                if ln.strip() and not ln.startswith("#") and "," in ln}
    counters = {n for n, k in declared.items() if k == "counter"}
    assert len(counters) == 5
    assert {n for n in counters if METRICS[n].kind == "counter"} == counters
    from podhealth.agent.metrics.compat import _spec
    from podhealth.agent.metrics.exposition import names_of

    for n in counters:
        assert names_of(_spec(n), prefixed=False)[1:3] == (n, "counter")


def test_xid_series_carries_err_code_and_err_msg() -> None:
    ev = Event(kind="xid", code=79, time=1.0, gpu=1)
    out = to_dcgm(nvml_samples(), "dgx01", events=[ev], xid_texts={79: "GPU has fallen off the bus."})
    one = get(out, "DCGM_FI_DEV_XID_ERRORS", 1)
    assert (one.value, one.label("err_code"), one.label("err_msg")) == (79.0, "79", "GPU has fallen off the bus.")
    zero = get(out, "DCGM_FI_DEV_XID_ERRORS", 0)
    assert (zero.value, zero.label("err_code"), zero.label("err_msg")) == (0.0, "0", "")


def test_xid_err_msg_comes_from_nvidias_catalog() -> None:
    from podhealth.agent.metrics import compat

    texts = compat._xid_texts()
    assert "fallen off the bus" in texts[79].lower()


def test_hpc_job_from_the_prologs_job_record() -> None:
    jobs = [Sample.of("gpu_job_info", 1, gpu=0, job_id="4242", scheduler="slurm", user="alice", source="records"),
            Sample.of("gpu_job_info", 1, gpu=0, job_id="4243", scheduler="slurm", user="bob", source="records")]
    out = to_dcgm(nvml_samples() + jobs, "dgx01")
    assert get(out, "DCGM_FI_DEV_GPU_TEMP", 0).label("hpc_job") == "4242,4243"
    assert get(out, "DCGM_FI_DEV_GPU_TEMP", 1).label("hpc_job") == ""


def test_mig_instances_get_their_own_framebuffer_series() -> None:
    mig = [Sample.of(name, value * MIB, gpu_instance=gi, compute_instance="0", mig_profile=prof,
                     mig_uuid=f"MIG-{gi}", **GPU0)
           for gi, prof, used, total in (("1", "3g.40gb", 100, 40192), ("2", "1g.10gb", 5, 9728))
           for name, value in (("gpu_mig_memory_used_bytes", used), ("gpu_mig_memory_total_bytes", total))]
    out = to_dcgm(nvml_samples() + mig, "dgx01")
    used = {(s.label("GPU_I_ID"), s.label("GPU_I_PROFILE")): s.value for s in out
            if s.name == "DCGM_FI_DEV_FB_USED" and s.label("GPU_I_ID")}
    free = {s.label("GPU_I_ID"): s.value for s in out if s.name == "DCGM_FI_DEV_FB_FREE" and s.label("GPU_I_ID")}
    assert used == {("1", "3g.40gb"): 100.0, ("2", "1g.10gb"): 5.0}
    assert free == {"1": 40092.0, "2": 9723.0}
    # the whole GPU's series stay as they were
    assert [s.value for s in out if s.name == "DCGM_FI_DEV_FB_USED" and s.label("gpu") == "0"
            and not s.label("GPU_I_ID")] == [1000.0]


def test_vgpu_license_status_where_nvml_has_it() -> None:
    out = to_dcgm(nvml_samples() + [Sample.of("gpu_vgpu_license_state", 5, **GPU0)], "dgx01")
    assert get(out, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", 0).value == 5.0
    assert [s for s in out if s.name == "DCGM_FI_DEV_VGPU_LICENSE_STATUS" and s.label("gpu") == "1"] == []


def test_mig_and_vgpu_read_through_the_simulated_nvml(tmp_path: Path) -> None:
    from dataclasses import replace

    from podhealth.collectors.nvml import NvmlCollector
    from podhealth.collectors.nvml_session import NvmlSession
    from podhealth.sim import nvml_lib
    from podhealth.sim.node import SimNode
    from podhealth.sim.state import default_state

    st = default_state("mig01", "dgx-a100")
    gpus = list(st.gpus)
    gpus[0] = replace(gpus[0], mig_mode=True, mig_devices=("3g.40gb", "1g.10gb"))
    gpus[1] = replace(gpus[1], vgpu_license_state=5)
    node = SimNode.create(tmp_path, "mig01", seed=replace(st, gpus=tuple(gpus)))
    nvml_lib.install(node)
    session = NvmlSession()
    col = NvmlCollector(session)
    try:
        got = col.collect()
    finally:
        col.close()
        session.shutdown()
        nvml_lib.uninstall()
    mig = {(s.label("gpu_instance"), s.label("mig_profile")) for s in got.samples
           if s.name == "gpu_mig_memory_total_bytes"}
    assert mig == {("1", "3g.40gb"), ("2", "1g.10gb")}
    lic = [(s.label("gpu"), s.value) for s in got.samples if s.name == "gpu_vgpu_license_state"]
    assert lic == [("1", 5.0)]
    out = to_dcgm(got.samples, "mig01")
    assert {s.label("GPU_I_PROFILE") for s in out if s.name == "DCGM_FI_DEV_FB_USED" and s.label("GPU_I_ID")} \
        == {"3g.40gb", "1g.10gb"}
