"""Pure parsers for host RAS lines in the kernel log: EDAC memory error summaries and MCE records.

  EDAC MC0: 16384 CE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#1 (channel:0 slot:1 ...)
  EDAC MC1: 1 UE memory read error on DIMM_B2 (...)
      edac_mc.c's summary line: count, CE/UE (or Fatal/Deferred on newer kernels), what, and the
      DIMM label the driver knows. The per-driver decode lines around it ("EDAC skx MC0: CPU 0:
      Machine Check Event ...", "TSC", "ADDR") describe the same error and are not events.
  mce: [Hardware Error]: Machine check events logged
  mce: [Hardware Error]: CPU 1: Machine Check Exception: 5 Bank 4: b200000000070005
      arch/x86 mce: a Bank's MCi_STATUS, when printed, says whether the error was corrected:
      bit 61 (UC) set = uncorrected (Intel SDM vol. 3B 15.3.2.2; the AMD layout agrees).
  pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0
  pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error message received from 0000:18:00.0
  nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)
      drivers/pci/pcie/aer.c: the root port names the device that sent ERR_FATAL (older kernels
      "error received:", 6.x "error message received from"), then the device's own line says
      severity=Uncorrected (Fatal). Only fatal ones become events (kind aer, source the device's
      address): the sysfs counters are polled every 30 s, these lines arrive at once. Correctable
      and non-fatal lines are counted by the pcie_aer collector, not here.

Text in, a RasLine out (or None for any other line): no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

RasKind = Literal["edac", "mce", "aer"]
MAX_TEXT = 512
_MCI_STATUS_UC = 1 << 61

_EDAC = re.compile(
    r"EDAC\s+MC(?P<mc>[0-9]{1,4}):\s+(?P<n>[0-9]{1,10})\s+(?P<sev>CE|UE|Fatal|Deferred)\s+(?P<what>.*?)\s*"
    r"\bon\s+(?P<label>.+?)(?:\s+\((?P<detail>.*))?$", re.ASCII)
_MCE = re.compile(r"\bmce:\s+\[Hardware Error\]:\s*(?P<rest>.*)$")
_BDF = r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
# Anchored on the addresses (bounded), never on the driver word before them: a `\S+` there made a
# long malformed record cost quadratic time.
_AER_FROM = re.compile(_BDF + r":\s+AER:\s+Uncorrected \(Fatal\) error (?:message )?received(?: from)?:?\s+"
                       r"(?P<bdf>" + _BDF + r")\b")
_AER_DEV = re.compile(r"(?P<bdf>" + _BDF + r"):\s+AER:\s+PCIe Bus Error:\s+severity=Uncorrected \(Fatal\)")
_BANK = re.compile(r"\bBank\s+(?P<bank>[0-9]{1,3}):\s*(?:0x)?(?P<status>[0-9a-fA-F]{1,16})\b")


@dataclass(frozen=True, slots=True)
class RasLine:
    kind: RasKind
    uncorrected: bool | None  # None: the line does not say (an MCE "events logged" notice)
    count: int  # errors this line reports (EDAC's count; 1 for an MCE record)
    source: str  # "mc0" for EDAC, "bank4" / "" for MCE
    label: str  # EDAC's DIMM label ("" for MCE)
    message: str  # from the marker on, bounded
    start: int  # where the message starts in the line (the prefix before it holds the timestamp)


def parse(line: str) -> RasLine | None:
    line = line.rstrip("\r\n")
    m = _EDAC.search(line)
    if m:
        sev = m.group("sev")
        return RasLine("edac", sev in ("UE", "Fatal"), int(m.group("n")), f"mc{int(m.group('mc'))}",
                       m.group("label").strip()[:128], line[m.start():][:MAX_TEXT], m.start())
    m = _MCE.search(line)
    if m:
        b = _BANK.search(m.group("rest"))
        uc = bool(int(b.group("status"), 16) & _MCI_STATUS_UC) if b else None
        return RasLine("mce", uc, 1, f"bank{int(b.group('bank'))}" if b else "", "",
                       line[m.start():][:MAX_TEXT], m.start())
    m = (_AER_FROM.search(line) or _AER_DEV.search(line)) if "AER:" in line else None
    if m:
        bdf = m.group("bdf").lower()
        # the message starts at the driver's name before the address ("pcieport 0000:...")
        start = max(line.rfind(" ", 0, max(0, m.start() - 1)), line.rfind(";", 0, m.start())) + 1
        return RasLine("aer", True, 1, bdf if bdf.count(":") == 2 else f"0000:{bdf}", "",
                       line[start:][:MAX_TEXT], start)
    return None
