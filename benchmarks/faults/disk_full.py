"""disk_full: the run directory on a small tmpfs (needs root), filled after the first
checkpoint, with the run stopped meanwhile, to half a checkpoint's room; freed, --resume."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

from benchmarks.common import wait_until
from benchmarks.faults.harness import Context
from benchmarks.faults.run import (
    RUN_TIMEOUT_S,
    Recovery,
    Train,
    metrics_iterations,
    result,
    say,
)
from deployments.processes import descendants


def _fill(mount: Path, leave: int) -> int:
    """Reserve all of `mount`'s free space but `leave` bytes in a ballast file (fallocate: no
    write that could race another); -> the free bytes left. The run must be stopped."""
    ballast = mount / "ballast"
    size = max(shutil.disk_usage(mount).free - leave, 0)
    with open(ballast, "wb") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, size)
        except OSError as e:  # what is there is all we can have; still a full disk
            say(f"disk_full: the ballast got {ballast.stat().st_size} of {size} bytes ({e})")
    return shutil.disk_usage(mount).free


def _staged_bytes(checkpoints: Path) -> int:
    """Bytes of a checkpoint being written now (its staging directory `.iter_*.tmp`)."""
    return sum(
        p.stat().st_size
        for d in checkpoints.glob(".iter_*.tmp")
        for p in d.rglob("*")
        if p.is_file()
    )


def disk_full(ctx: Context) -> dict[str, Any]:
    """The disk fills between two checkpoints. Deterministic: the run's whole process tree is
    stopped (SIGSTOP) while the ballast takes all free space but half a checkpoint, less what
    a checkpoint in progress already staged, so the run's next checkpoint (or an earlier
    Parquet write) is what fails, never the harness's own write."""
    from mem1_core.training.checkpoint import checkpoint_problems, list_checkpoints

    mount = ctx.harness.tmpfs()
    if mount is None:
        return result("disk_full", False, None, None,
                      f"not run: a tmpfs needs root ({ctx.harness.mount_error[:120]}); the CI "
                      "test injects ENOSPC instead")  # fmt: skip
    out, run = mount / "run", None
    try:
        shutil.rmtree(out, ignore_errors=True)
        (mount / "ballast").unlink(missing_ok=True)
        shutil.copytree(ctx.template, out)
        run = Train(out, ctx.init, log_dir=ctx.work).start()  # logs off the full disk
        run.until_first_iteration()
        wait_until("checkpoint 1", lambda: list_checkpoints(out / "checkpoints"), RUN_TIMEOUT_S,
                   run.proc)  # fmt: skip
        ckpt_bytes = sum(
            p.stat().st_size
            for p in list_checkpoints(out / "checkpoints")[0].rglob("*")
            if p.is_file()
        )
        tree = [run.proc.pid, *descendants(run.proc.pid)]
        _signal_all(tree, signal.SIGSTOP)
        try:
            at = len(metrics_iterations(out))
            staged = _staged_bytes(out / "checkpoints")
            free = _fill(mount, max(ckpt_bytes // 2 - staged, 0))
        finally:
            _signal_all(tree, signal.SIGCONT)
        say(f"disk_full: {free} bytes left in iteration {at}, a checkpoint is {ckpt_bytes} "
            f"({staged} of the next staged)")  # fmt: skip
        recovery = Recovery(out, at)
        rc = run.wait()
        stop = run.error_line()
        ckpts = list_checkpoints(out / "checkpoints")
        intact = all(checkpoint_problems(p) == [] for p in ckpts)
        leftovers = [p.name for p in out.rglob("*.tmp")]
        rows = metrics_iterations(out)
        (mount / "ballast").unlink()
        rc2 = run.resume_to_end()
        ok = rc == 1 and "no space left" in stop and intact and rc2 == 0
        return result("disk_full", ok, out, recovery.seconds(),
                      f"tmpfs filled in iteration {at} ({free} bytes left, half a checkpoint); "
                      f"exit {rc} with `{stop[:200]}`; the {len(ckpts)} checkpoints verified "
                      f"intact: {intact}, metrics rows {rows}, temporaries left: {leftovers}; "
                      f"space freed, --resume exit {rc2}", run)  # fmt: skip
    finally:
        if run is not None:
            run.kill()
        # a copy of the run, for the record (the mount goes with the harness)
        if out.exists():
            shutil.copytree(out, ctx.work / "disk_full", dirs_exist_ok=True)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
