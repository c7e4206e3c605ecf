"""checkpoint_truncated and checkpoint_bitflip: the newest checkpoint of a finished run damaged
on disk (its weights cut short, one bit of its optimiser state flipped), then --resume."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.faults.harness import Context
from benchmarks.faults.run import ITERATIONS, Recovery, Train, result

_finished: dict[str, Path] = {}


def _finished_run(ctx: Context) -> Path:
    """One run trained to the end, copied for each checkpoint fault."""
    if "run" not in _finished:
        out = ctx.run_dir("finished")
        run = Train(out, ctx.init)
        try:
            rc = run.run_to_end()
        finally:
            run.kill()
        if rc != 0:
            raise RuntimeError(f"the reference run failed ({rc}); see {out}.run.log")
        _finished["run"] = out
    return _finished["run"]


def _checkpoint_fault(ctx: Context, fault: str, damage: Callable[[Path], str]) -> dict[str, Any]:
    out = ctx.work / fault
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(_finished_run(ctx), out)
    for log in out.parent.glob(f"{out.name}.*.log"):
        log.unlink()
    newest = max((out / "checkpoints").glob("iter_*"))
    what = damage(newest)
    run = Train(out, ctx.init)
    recovery = Recovery(out, ITERATIONS - 1)
    try:
        rc = run.resume_to_end()
    finally:
        run.kill()
    warned = [x for x in run.all_logs().splitlines() if "is corrupt" in x]
    aside = (newest.parent / f"{newest.name}.corrupt").is_dir()
    return result(fault, rc == 0 and bool(warned) and aside, out, recovery.seconds(),
                  f"{what}; --resume exit {rc}, warned `{(warned or [''])[0][:220]}`; moved aside: "
                  f"{aside}", run)  # fmt: skip


def checkpoint_truncated(ctx: Context) -> dict[str, Any]:
    def cut(ckpt: Path) -> str:
        weights = ckpt / "policy" / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
        return f"{ckpt.name}/policy/model.safetensors cut to half"

    return _checkpoint_fault(ctx, "checkpoint_truncated", cut)


def checkpoint_bitflip(ctx: Context) -> dict[str, Any]:
    def flip(ckpt: Path) -> str:
        path = ckpt / "optimizer.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return f"one bit of {ckpt.name}/optimizer.pt flipped"

    return _checkpoint_fault(ctx, "checkpoint_bitflip", flip)
