"""The hardware profiles, in one room: what a node of each kind should be, and how a site says so.

- `catalog.py`: the shipped profiles per SKU (checks/data/profiles.yaml), with overrides.
- `site.py`: a site's golden profile, which `extends` a shipped one (its schema derived from it).
- `node.py`: the profile a node is judged against (catalog or site, then policy), and what the
  collectors take from it: the one module that knows both kinds, so neither imports the other.
- `capture.py`, `render.py`, `source.py`, `network.py`, `nccl.py`: `podhealth profile capture/diff`
  (observe a node, write a site profile, compare), the node's metrics as a source, its network
  and its measured NCCL gate.

`from podhealth.checks import profiles` gives the catalog and `of_config`, as before the room.
"""

from __future__ import annotations

from podhealth.checks.profiles.catalog import DRIFT_VERDICTS, NvlinkDomain, Profile, ProfileError, load, names
from podhealth.checks.profiles.node import collector_seams, collectors_not_here, of_config

__all__ = ["DRIFT_VERDICTS", "NvlinkDomain", "Profile", "ProfileError", "collector_seams", "collectors_not_here",
           "load", "names", "of_config"]
