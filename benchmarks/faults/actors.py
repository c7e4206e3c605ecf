"""worker_kill and learner_kill: SIGKILL of a Ray actor's process (the rollout worker during
its rollout, the learner during its update)."""

from __future__ import annotations

import os
import signal
from typing import Any

from benchmarks.common import wait_until
from benchmarks.faults.harness import Context
from benchmarks.faults.run import (
    RUN_TIMEOUT_S,
    Recovery,
    Train,
    find_process,
    metrics_iterations,
    result,
    say,
)


def _kill_actor_during(ctx: Context, fault: str, actor: str, method: str) -> dict[str, Any]:
    out = ctx.run_dir(fault)
    run = Train(out, ctx.init).start()
    try:
        run.until_first_iteration()
        prefix = f"ray::{actor}.{method}"
        pid = wait_until(
            prefix, lambda: find_process(run.proc.pid, prefix), RUN_TIMEOUT_S, run.proc
        )
        at = len(metrics_iterations(out))
        os.kill(pid, signal.SIGKILL)
        say(f"{fault}: killed {prefix} (pid {pid}) in iteration {at}")
        recovery = Recovery(out, at)
        rc = run.wait()
        if rc == 0:
            return result(fault, True, out, recovery.seconds(),
                          f"pid {pid} killed in iteration {at}; the run went on in-process "
                          "(the worker was restarted and its share redone)", run)  # fmt: skip
        stop = run.error_line()
        rc2 = run.resume_to_end()
        return result(fault, rc == 1 and bool(stop) and rc2 == 0, out, recovery.seconds(),
                      f"pid {pid} killed in iteration {at}; exit {rc} with `{stop[:160]}`; "
                      f"--resume exit {rc2}", run)  # fmt: skip
    finally:
        run.kill()


def worker_kill(ctx: Context) -> dict[str, Any]:
    return _kill_actor_during(ctx, "worker_kill", "RolloutWorker", "rollout")


def learner_kill(ctx: Context) -> dict[str, Any]:
    return _kill_actor_during(ctx, "learner_kill", "Learner", "update")
