"""The process's open-file limit: raised at start by the agent and the aggregator alike.

systemd's default soft RLIMIT_NOFILE is 1024 while the hard one is far higher (Go raises the soft
one by itself, which is why node_exporter never meets this). The agent's infiniband collector
keeps every counter file open (collectors/infiniband.py: ~600 on a DGX H100, more with more HCAs);
the aggregator holds one socket per connected agent and UI client. Both also cap their HTTP
connections to a share of this limit (httpguard.py), so a connection flood cannot take it all.
"""

from __future__ import annotations

import resource

FD_LIMIT = 65536
# The aggregator's: every node keeps its connection between heartbeats (agent/heartbeat.py), and
# connections get 3/4 of the limit (aggregator/serve.py): 196,608, for 100,000 nodes with room to
# grow, the UI and scrapers; the rest for the store and fencers. systemd/podhealth-aggregator.service
# sets the same LimitNOFILE (a test holds them together).
AGGREGATOR_FD_LIMIT = 262144


def raise_fd_limit(want: int = FD_LIMIT) -> int:
    """Raise the soft RLIMIT_NOFILE towards `want` (never above the hard limit, never down).
    Returns the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def soft_limit() -> int:
    """The soft limit now (RLIM_INFINITY read as FD_LIMIT: a cap must be a number)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_LIMIT if soft == resource.RLIM_INFINITY else int(soft)
