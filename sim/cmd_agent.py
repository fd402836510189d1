"""`podhealth agent`, registered through the simulator: the agent's command (agent/cmd.py) with
`--simulate`, which runs the real agent on a simulated node (sim/agentnode.py). The agent stands
below the simulator and never imports it; the simulator fills its seam (agent/simmode.py)."""

from __future__ import annotations

import argparse

from podhealth.agent import cmd
from podhealth.sim.agentnode import SIMULATOR


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    return cmd.add_parser(sub, simulator=SIMULATOR)
