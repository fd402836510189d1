"""Prometheus text and OpenMetrics bytes from rendered families, with each series' label part cached.

Between two snapshots almost every series keeps its labels and only its value changes, so the
escaped `name{labels} ` prefix of a series is built once and reused: a render then costs one dict
lookup and one float formatting per series. prometheus-client's generate_latest formats every
label of every series on every call, which made rendering the largest part of the agent's CPU
per cycle. The output is byte-identical to prometheus-client's (the tests compare them), using
its float formatting; names and label names are already validated by exposition.families().
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client.utils import floatToGoString

from podhealth.agent.exposition import Rendered
from podhealth.vocab import Labels

_TEXT_TYPE = {"counter": "counter", "gauge": "gauge", "info": "gauge"}
MAX_CACHED_SERIES = 500_000


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Encoder:
    def __init__(self, node: str) -> None:
        self.node = node
        self._prefix: dict[tuple[str, Labels], str] = {}

    def _line_prefix(self, sample_name: str, labels: Labels) -> str:
        d = dict(labels)
        d.setdefault("node", self.node)
        inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(d.items()))
        return f"{sample_name}{{{inner}}} "

    def encode(self, fams: Sequence[Rendered], openmetrics: bool) -> bytes:
        cache = self._prefix
        if len(cache) > MAX_CACHED_SERIES:
            cache.clear()  # label churn (e.g. ever-new reason texts) must not grow memory forever
        out: list[str] = []
        for f in fams:
            if openmetrics:
                out.append(f"# HELP {f.name} {_label_value(f.help)}\n# TYPE {f.name} {f.type}\n")
                if f.unit:
                    out.append(f"# UNIT {f.name} {f.unit}\n")
            else:
                help_ = f.help.replace("\\", r"\\").replace("\n", r"\n")
                out.append(f"# HELP {f.sample_name} {help_}\n# TYPE {f.sample_name} {_TEXT_TYPE[f.type]}\n")
            sname = f.sample_name
            for labels, value in f.series:
                key = (sname, labels)
                prefix = cache.get(key)
                if prefix is None:
                    prefix = cache[key] = self._line_prefix(sname, labels)
                out.append(prefix)
                out.append(floatToGoString(value))
                out.append("\n")
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")
