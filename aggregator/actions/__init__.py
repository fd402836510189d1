"""Acting on decide()'s plan: the runner (runner.py) records each action in the journal first
(journal.py: typed pending records, begin/postpone/end, the one retrier) and hands it to its
kind's executor, one file per kind: fence.py (single and batch), release.py, handover.py,
ladder.py (reset_gpu, reboot, repair), evacuate.py, and jobs.py (the jobs a fence hurts).
An executor is given a Ctx (ctx.py), returns what happened (outcome.py) and writes nothing: the
journal's end applies the Outcome (apply.py, through lifecycle.settle). Executors import no
other executor, nor the runner (tests/unit/test_actions_layers.py)."""

from podhealth.aggregator.actions.journal import Marked, NotLeader, OperatorError, Pending, delay
from podhealth.aggregator.actions.runner import ActionRunner, slug

__all__ = ["ActionRunner", "Marked", "NotLeader", "OperatorError", "Pending", "delay", "slug"]
