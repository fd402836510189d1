"""`nvidia-smi` (no arguments): the summary table, read into a `nvidia_smi.Capture`.

Pure: text in, Capture out. The table is what sites paste most often; it carries less than `-q`
(per GPU: index, name, persistence mode, bus id, volatile uncorrectable ECC, temperature, power
draw and cap, memory used and total, utilisation), so the rest of a seeded node comes from its
profile, as for a `-q` excerpt. Both layouts are read: R525's narrow one and the R550+ wide one
(../shared/fixtures/nvidia_smi/nvidia-smi_default_*). A name nvidia-smi cut to fit its column
("NVIDIA GeForce ...") is kept as printed, and guesses no profile. ValueError without a GPU row.
"""

from __future__ import annotations

import re

from podhealth.sim.nvidia_smi import Capture, CapturedGpu, _cuda, _int, _na

_HEADER = re.compile(r"NVIDIA-SMI\s+\S+\s+Driver Version:\s*(?P<driver>\S+)\s+CUDA Version:\s*(?P<cuda>\S+)")
# "|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |"
_ROW1 = re.compile(r"^\|\s*(?P<idx>[0-9]{1,3})\s+(?P<name>.+?)\s+(?P<pm>On|Off)\s*\|\s*"
                   r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s+\S+\s*\|\s*(?P<ecc>\S+)\s*\|")
# "| N/A   30C    P0            100W /  700W |       1MiB /  81559MiB |      0%      Default |"
_ROW2 = re.compile(r"^\|\s*\S+\s+(?P<temp>[0-9]{1,3}|N/A)C?\s+P[0-9]{1,2}\s+(?P<draw>[0-9]{1,5}|N/A)W?\s*/\s*"
                   r"(?P<cap>[0-9]{1,5}|N/A)W?\s*\|\s*[0-9]+MiB\s*/\s*(?P<total>[0-9]+)MiB\s*\|")


def parse(text: str) -> Capture:
    head = _HEADER.search(text)
    lines = text.splitlines()
    gpus: list[CapturedGpu] = []
    for i, line in enumerate(lines):
        m = _ROW1.match(line.strip())
        if not m:
            continue
        row2 = _ROW2.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
        dbe = _int(m.group("ecc"))
        name = m.group("name").strip()
        gpus.append(CapturedGpu(
            pci_bus_id=m.group("bus").upper(),
            name=name,
            persistence_mode=m.group("pm") == "On",
            # "N/A": ECC off or not reported; a number is the volatile uncorrectable count
            ecc_enabled=None if dbe is None else True,
            ecc_dbe=(dbe, None),
            temperature_c=_int(row2.group("temp")) if row2 else None,
            power_draw_w=float(row2.group("draw")) if row2 and _na(row2.group("draw")) else None,
            power_limit_w=float(row2.group("cap")) if row2 and _na(row2.group("cap")) else None,
            memory_total_mib=_int(row2.group("total")) if row2 else None,
        ))
    if not gpus:
        raise ValueError("not an nvidia-smi capture: no GPU row of the summary table found")
    return Capture(driver_version=head.group("driver") if head else None,
                   cuda_version=_cuda(head.group("cuda")) if head else None, gpus=tuple(gpus))
