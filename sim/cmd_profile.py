"""`podhealth profile`, registered through the simulator: the agent's command (agent/cmd_profile.py)
with `--simulate`, which reads a simulated node (sim/agentnode.py) as `podhealth agent --simulate`
does. The agent never imports the simulator; the simulator fills its seam (agent/simmode.py)."""

from __future__ import annotations

import argparse

from podhealth.agent import cmd_profile
from podhealth.sim.agentnode import SIMULATOR


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    return cmd_profile.add_parser(sub, simulator=SIMULATOR)
