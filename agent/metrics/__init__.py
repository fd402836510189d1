"""The agent's /metrics: what is exported and how it is rendered, all in this package.

- `family.py`: `Family` (a MetricSpec and its Samples) and `MetricSource`, the way the checks
  engine, the sinks (agent/sink.py) and compat names add families beside the collectors' samples.
- `selfmetrics.py`: the agent's own per-collector series (enabled, success, duration, stale, ...).
- `detail.py`: detail levels and family switches (checks/data/export_detail.yaml): which samples
  are exported; the checks still see every sample.
- `exposition.py`: snapshot -> families (validation, naming, merging by name); `encode.py`:
  families -> text / OpenMetrics bytes. Together the from-nothing renderer.
- `blocks.py`: the renderer the agent uses, byte-identical to the above but reusing what did not
  change since the last render; `render.py`: the per-snapshot cache, content negotiation, gzip.
- `compat.py`: `--compat dcgm-exporter` names as a metric source.
"""
