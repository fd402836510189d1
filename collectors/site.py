"""A site check: the site's own program (config `checks.site.<name>`), run on its interval.

Each site check is a collector of its own, named `site_<name>`, so it gets everything a built-in
source gets from the one collector runtime (collectors/runtime.py) and the scheduler: its own
worker thread and interval, a run still going at its timeout marks it stale (its check UNKNOWN),
overruns counted, `podhealth_collector_*{collector="site_<name>"}` on /metrics. The program
itself runs through core/subproc.py: no shell, its own process group killed at `timeout`,
bounded output, the configured user where the agent can switch, and an environment of only what
the config gives (never the agent's, which may hold the node's token).

What it printed is handed on raw (a ProgramReport, collectors/site_parse.py); what it means is
checks/passive/site.py's: the exit code, and how far the config lets a FAIL go.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from podhealth import subproc
from podhealth.collectors import site_parse
from podhealth.collectors.base import Collection
from podhealth.config import CollectorConfig, Config
from podhealth.config_policy import SITE_PREFIX, SiteCheckConfig
from podhealth.vocab import MetricSpec

# The collector's own timeout is the program's plus this: the kill and the reap of a program that
# ran out its time happen inside the collection, which then reports "timed out" itself (UNKNOWN
# with the reason) instead of being abandoned as a hung collector.
KILL_GRACE = 3.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SiteCheck:
    name: ClassVar[str] = "site"
    # Its own thread: the site's program may run up to its timeout, every interval.
    own_worker: ClassVar[bool] = True
    # No series of its own: the verdict is check_status{check="site_<name>"} and the runs are the
    # runtime's podhealth_collector_* series; several site checks then never render one family twice.
    metrics: ClassVar[Mapping[str, MetricSpec]] = {}

    def __init__(self, check: str, cfg: SiteCheckConfig, env: Mapping[str, str]) -> None:
        self.check = check
        self.cfg = cfg
        self.env = dict(env)

    def collect(self) -> Collection:
        run = subproc.run(self.cfg.argv, self.cfg.timeout, env=self.env, user=self.cfg.user,
                          max_output=self.cfg.max_output)
        problem = run.why
        if run.truncated:
            problem = "; ".join(p for p in (problem, f"output cut at {self.cfg.max_output} bytes") if p)
        if run.exit_code is None and run.stderr.strip():
            problem += ": " + run.stderr.decode("utf-8", "replace").strip().splitlines()[-1][:160]
        report = site_parse.parse(run.exit_code, run.stdout, problem, run.ran_as, run.duration)
        return Collection((), reports=(report,))

    def close(self) -> None:
        pass


def environment(cfg: Config, check: SiteCheckConfig) -> dict[str, str]:
    """The program's environment: PATH and the agent's roots (so one script serves a real node and
    a fixture tree), under what the config gives."""
    return {"PATH": PATH, "LC_ALL": "C.UTF-8", "PODHEALTH_SYSFS_ROOT": str(cfg.paths.sysfs_root),
            "PODHEALTH_PROCFS_ROOT": str(cfg.paths.procfs_root), **check.env}


def collector_name(check: str) -> str:
    return SITE_PREFIX + check


def site_check(cfg: Config, collector: str) -> SiteCheckConfig | None:
    """The site check a collector name stands for (None: not a site check's)."""
    if not collector.startswith(SITE_PREFIX):
        return None
    return cfg.checks.site.get(collector[len(SITE_PREFIX):])


def collector_config(check: SiteCheckConfig) -> CollectorConfig:
    return CollectorConfig(enabled=check.enabled, interval=check.interval, timeout=check.timeout + KILL_GRACE)


def factories(cfg: Config) -> dict[str, Any]:
    """`site_<name>` -> factory, one per configured site check (the runtime's Factory shape)."""
    out: dict[str, Any] = {}
    for check in cfg.checks.site:
        def make(c: Config, _check: str = check, **_seams: Any) -> SiteCheck:
            sc = c.checks.site[_check]
            return SiteCheck(_check, sc, environment(c, sc))
        out[collector_name(check)] = make
    return out
