"""The dcgm collector: disabled (with the reason) without bindings or hostengine; field mapping.

DCGM's Python bindings are not on PyPI (they ship in the datacenter-gpu-manager package), so the
mapping is tested against a minimal stand-in written into a temporary bindings directory. It
mimics only the pydcgm surface the collector calls (DcgmHandle, GetSystem().discovery,
DcgmGroup(...).samples.WatchFields/GetLatest, DcgmFieldGroup, Shutdown) and the value shapes of
dcgm_field_helpers (values[gpuId][fieldId].values[-1].value / .isBlank).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from podhealth import config
from podhealth.collectors import dcgm
from podhealth.collectors.base import CollectorDisabled

pytestmark = pytest.mark.timeout(60)

STANDIN_FIELDS = """
DCGM_FI_PROF_SM_ACTIVE = 1002
DCGM_FI_PROF_SM_OCCUPANCY = 1003
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE = 1004
DCGM_FI_PROF_DRAM_ACTIVE = 1005
DCGM_FI_PROF_PCIE_TX_BYTES = 1009
DCGM_FI_PROF_PCIE_RX_BYTES = 1010
DCGM_FI_PROF_NVLINK_TX_BYTES = 1011
DCGM_FI_PROF_NVLINK_RX_BYTES = 1012
"""

STANDIN_STRUCTS = """
DCGM_GROUP_DEFAULT = 0
class DCGMError(Exception):
    pass
"""

STANDIN_PYDCGM = '''
import json, os
import dcgm_structs

_CONF = json.load(open(os.path.join(os.path.dirname(__file__), "standin.json")))
LOG = []

class _Value:
    def __init__(self, value, blank):
        self.value, self.isBlank, self.ts = value, blank, 1

class _Series:
    def __init__(self, values):
        self.values = values

class _Collection:
    def __init__(self, values):
        self.values = values

class _Ident:
    def __init__(self, d):
        self.uuid, self.pciBusId, self.deviceName = d["uuid"], d["pciBusId"].encode(), d["deviceName"]

class _Attrs:
    def __init__(self, d):
        self.identifiers = _Ident(d)

class _Discovery:
    def GetAllSupportedGpuIds(self):
        return [int(g) for g in _CONF["gpus"]]
    def GetGpuAttributes(self, gid):
        return _Attrs(_CONF["gpus"][str(gid)])

class _System:
    discovery = _Discovery()

class DcgmHandle:
    def __init__(self, handle=None, ipAddress=None, opMode=1, persistAfterDisconnect=False,
                 unixSocketPath=None, timeoutMs=0):
        if ipAddress != _CONF["hostengine"]:
            raise dcgm_structs.DCGMError("Host engine connection invalid/disconnected")
        LOG.append(("connect", ipAddress, timeoutMs))
    def GetSystem(self):
        return _System()
    def Shutdown(self):
        LOG.append(("shutdown",))

class DcgmFieldGroup:
    def __init__(self, dcgmHandle, name="", fieldIds=None, fieldGroupId=None):
        self.fieldIds = list(fieldIds or [])

class _Samples:
    def WatchFields(self, fieldGroup, updateFreq, maxKeepAge, maxKeepSamples):
        LOG.append(("watch", sorted(fieldGroup.fieldIds), updateFreq))
    def GetLatest(self, fieldGroup):
        out = {}
        for gid, fields in _CONF["values"].items():
            out[int(gid)] = {int(fid): _Series([_Value(v, v is None)]) for fid, v in fields.items()
                             if int(fid) in fieldGroup.fieldIds}
        return _Collection(out)

class DcgmGroup:
    def __init__(self, dcgmHandle, groupId=None, groupName=None, groupType=0):
        self.samples = _Samples()
'''


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_bindings inserts into sys.path and imports by plain names: undo both after each test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for mod in ("pydcgm", "dcgm_fields", "dcgm_structs"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    yield
    for mod in ("pydcgm", "dcgm_fields", "dcgm_structs"):
        sys.modules.pop(mod, None)


def standin(tmp_path: Path, values: dict[str, dict[str, float | None]], hostengine: str = "127.0.0.1:5555") -> Path:
    d = tmp_path / "bindings"
    d.mkdir()
    (d / "pydcgm.py").write_text(STANDIN_PYDCGM)
    (d / "dcgm_fields.py").write_text(STANDIN_FIELDS)
    (d / "dcgm_structs.py").write_text(STANDIN_STRUCTS)
    gpus = {str(i): {"uuid": f"GPU-{i:04d}", "pciBusId": f"00000000:{0x18 + i:02X}:00.0",
                     "deviceName": "NVIDIA H100 80GB HBM3"} for i in range(2)}
    (d / "standin.json").write_text(json.dumps({"hostengine": hostengine, "gpus": gpus, "values": values}))
    return d


def cfg_for(bindings: Path, hostengine: str = "127.0.0.1:5555") -> config.Config:
    cfg = config.Config()
    return replace(cfg, paths=replace(cfg.paths, dcgm_bindings=bindings),
                   collectors=replace(cfg.collectors, dcgm=replace(cfg.collectors.dcgm, hostengine=hostengine)))


def test_disabled_without_bindings_on_this_machine() -> None:
    # The real default path: this machine has no DCGM installed.
    if Path(config.Config().paths.dcgm_bindings, "pydcgm.py").exists():
        pytest.skip("DCGM is installed here")
    with pytest.raises(CollectorDisabled, match="DCGM Python bindings not found at /usr/share/datacenter-gpu-manager-4"):
        dcgm.create(config.Config())


def test_disabled_when_bindings_do_not_import(tmp_path: Path, isolated_imports: None) -> None:
    d = tmp_path / "bindings"
    d.mkdir()
    (d / "pydcgm.py").write_text("raise OSError('libdcgm.so.4: cannot open shared object file')\n")
    with pytest.raises(CollectorDisabled, match="cannot import DCGM bindings .*libdcgm.so.4"):
        dcgm.create(cfg_for(d))


def test_disabled_without_hostengine(tmp_path: Path, isolated_imports: None) -> None:
    d = standin(tmp_path, {}, hostengine="127.0.0.1:5555")
    with pytest.raises(CollectorDisabled, match=r"nv-hostengine at 127.0.0.1:5999 not reachable: DCGMError"):
        dcgm.create(cfg_for(d, hostengine="127.0.0.1:5999"))


def test_field_mapping(tmp_path: Path, isolated_imports: None) -> None:
    values = {
        "0": {"1002": 0.75, "1003": 0.5, "1004": 0.25, "1005": 0.125, "1009": 1e9, "1010": 2e9,
              "1011": 3e10, "1012": 4e10},
        "1": {"1002": None, "1004": 0.0},  # blank = not supported: absent, never 0
    }
    d = standin(tmp_path, values)
    c = dcgm.create(cfg_for(d))
    out = c.collect()
    got = {(s.name, s.label("gpu")): s.value for s in out.samples}
    assert got == {
        ("dcgm_sm_active_ratio", "0"): 0.75, ("dcgm_sm_occupancy_ratio", "0"): 0.5,
        ("dcgm_tensor_active_ratio", "0"): 0.25, ("dcgm_dram_active_ratio", "0"): 0.125,
        ("dcgm_pcie_tx_bytes_per_second", "0"): 1e9, ("dcgm_pcie_rx_bytes_per_second", "0"): 2e9,
        ("dcgm_nvlink_tx_bytes_per_second", "0"): 3e10, ("dcgm_nvlink_rx_bytes_per_second", "0"): 4e10,
        ("dcgm_tensor_active_ratio", "1"): 0.0,
    }
    s0 = next(s for s in out.samples if s.label("gpu") == "0")
    assert dict(s0.labels) == {"gpu": "0", "uuid": "GPU-0000", "pci_bus_id": "00000000:18:00.0",
                               "model": "NVIDIA H100 80GB HBM3"}
    assert {s.name for s in out.samples} <= set(c.metrics)
    log = sys.modules["pydcgm"].LOG
    assert log[0] == ("connect", "127.0.0.1:5555", dcgm.CONNECT_TIMEOUT_MS)
    assert log[1] == ("watch", [1002, 1003, 1004, 1005, 1009, 1010, 1011, 1012], 10_000_000)
    c.close()
    assert log[-1] == ("shutdown",)


def test_every_metric_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    for name in dcgm.DcgmCollector.metrics:
        assert name in doc, name
