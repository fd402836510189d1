"""Exit codes of every `podhealth` command, in one place.

0 pass, 1 fail, 2 could not decide (an UNKNOWN verdict, an unreachable agent, a bad config file:
the systemd units' RestartPreventExitStatus=2 relies on config errors staying 2), 64 for a
command line that makes no sense (sysexits.h EX_USAGE), and 69 for an agent that cannot listen
on its port (EX_UNAVAILABLE), so a script can tell "you called me
wrong" from "the node could not be judged".
"""

from __future__ import annotations

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_UNKNOWN = 2
EXIT_USAGE = 64
# The agent cannot listen on its port (sysexits.h EX_UNAVAILABLE): held by another process, maybe
# one waiting to answer in its place. Restarting every few seconds fixes nothing and hides it:
# the unit's RestartPreventExitStatus= names it, so the agent stays down and PodhealthAgentDown pages.
EXIT_CANNOT_BIND = 69


class UsageError(ValueError):
    """A command-line value that makes no sense (`--listen nonsense`): the command prints it and
    exits EXIT_USAGE. A bad config *file* is a ConfigError and exits EXIT_UNKNOWN instead."""
