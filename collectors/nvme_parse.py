"""Pure parser for `nvme smart-log -o json` (nvme-cli), across the versions seen in the field.

nvme-cli's json_smart_log() changed shape over time (../shared/fixtures/host_errors/
nvme-cli_smart-log_json_keys_by_version.csv, derived from the v1.16, v2.0, v2.11 and v3.0-rc
sources):
  - `critical_warning` is an int (v1.16/v2.0 without --verbose) or an object whose "value" is
    the int (v2.0 with --verbose, v2.11+ always), with the bits spelled out beside it;
  - `temperature` and `temperature_sensor_N` are Kelvin;
  - counters (data units, media_errors, num_err_log_entries ...) are JSON doubles in v1.16/v2.0
    and uint128 in v2.11+, which json-c prints as a string of digits when it does not fit 64 bits.
Any of those shapes is read; a value of another shape is None (never 0: "not said" is not "no errors").
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

KELVIN_OFFSET = 273
# NVMe base spec, SMART / Health log byte 0 (Critical Warning).
CRITICAL_WARNING_BITS: tuple[tuple[int, str], ...] = (
    (0x01, "available spare below threshold"),
    (0x02, "temperature outside the thresholds"),
    (0x04, "reliability degraded (media or internal errors)"),
    (0x08, "media placed in read-only mode"),
    (0x10, "volatile memory backup failed"),
    (0x20, "persistent memory region read-only"),
)


@dataclass(frozen=True, slots=True)
class SmartLog:
    critical_warning: int | None
    temperature_c: float | None
    available_spare_pct: float | None
    spare_threshold_pct: float | None
    percentage_used: float | None
    media_errors: float | None
    error_log_entries: float | None
    power_on_hours: float | None
    unsafe_shutdowns: float | None


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return float(v) if 0 <= v < 1 << 128 else None  # a 128-bit counter at most; float() of more overflows
    if isinstance(v, float):
        return v if math.isfinite(v) and v >= 0 else None
    if isinstance(v, str) and re.fullmatch(r"[0-9]{1,40}", v.strip(), re.ASCII):
        return float(int(v.strip()))  # uint128 as a string; float keeps its magnitude
    return None


def _first(d: dict[str, object], *keys: str) -> float | None:
    for k in keys:
        if k in d:
            return _number(d[k])
    return None


def decode_critical_warning(value: int) -> list[str]:
    return [what for bit, what in CRITICAL_WARNING_BITS if value & bit] or ([f"bits 0x{value:02x}"] if value else [])


def parse_smart_log(text: str) -> SmartLog:
    """One controller's smart-log JSON -> SmartLog; ValueError when it is not a JSON object."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"smart-log is not JSON: {e.msg} at line {e.lineno}") from None
    except (RecursionError, ValueError) as e:  # nesting too deep, an integer of more than 4,300 digits
        raise ValueError(f"smart-log is not usable JSON: {type(e).__name__}") from None
    if isinstance(data, dict) and isinstance(data.get("smart_log"), dict):
        data = data["smart_log"]  # the `nvme list` + smart-log combination some tools print
    if not isinstance(data, dict):
        raise ValueError("smart-log JSON is not an object")
    cw_raw = data.get("critical_warning")
    if isinstance(cw_raw, dict):
        cw_raw = cw_raw.get("value")
    cw = _number(cw_raw)
    temp_k = _first(data, "temperature")
    return SmartLog(
        critical_warning=int(cw) if cw is not None and cw <= 0xFF else None,
        temperature_c=temp_k - KELVIN_OFFSET if temp_k is not None and temp_k > 0 else None,
        available_spare_pct=_first(data, "avail_spare", "available_spare"),
        spare_threshold_pct=_first(data, "spare_thresh", "available_spare_threshold"),
        percentage_used=_first(data, "percent_used", "percentage_used"),
        media_errors=_first(data, "media_errors"),
        error_log_entries=_first(data, "num_err_log_entries"),
        power_on_hours=_first(data, "power_on_hours"),
        unsafe_shutdowns=_first(data, "unsafe_shutdowns"),
    )
