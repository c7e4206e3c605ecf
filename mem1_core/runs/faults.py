"""The errors with which a run stops when something it depends on fails.

A training run survives what it can inside the process (a rollout worker that dies is
restarted and its share of the iteration redone; the HTTP retriever is retried through a
short outage). What it cannot survive stops it with `RunStopped`: one line saying what
failed and that `--resume` continues from the last checkpoint. Nothing a stopped run was
writing counts: every artifact is written atomically, and a resume drops the output of
iterations after its checkpoint (mem1_core.training.train_rl).

This module imports nothing heavy: the command line catches these errors at its top.
"""

from __future__ import annotations


class RunStopped(RuntimeError):
    """A run stopped by a fault it cannot survive in-process; the message says how to go on."""


class ActorLost(RuntimeError):
    """A Ray actor of the run died and could not be brought back within the run."""


class DiskFull(OSError):
    """No space left for an artifact; nothing was half-written (mem1_core.runs.atomic).
    Raised as `DiskFull(errno.ENOSPC, message)`; printed as the message alone."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


def root_cause(error: BaseException) -> BaseException:
    """The error a Ray actor raised, for one that reached the driver wrapped in a
    RayTaskError (whose text carries the remote traceback); else `error` itself."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error
