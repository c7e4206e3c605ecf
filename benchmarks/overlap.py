"""Overlapped rollouts against the synchronous loop (`ppo.overlap_rollouts`): the
same PPO run twice on Ray, one after the other, from the same start (the profile's base,
`data/base` under `tiny`) with the same budget of iterations and the same rollout IS
correction; prints one JSON line per arm (seconds per iteration: wall, the rollout's own
time, what the iteration waited for it, the update; the reward curve; staleness and IS
statistics; the final greedy held-out EM fraction with its standard error) and one line
comparing them.

    python benchmarks/overlap.py --out runs/overlap                  # both arms, 12 iterations
    python benchmarks/overlap.py --out runs/overlap --arms sync      # one arm per call; a
    python benchmarks/overlap.py --out runs/overlap --arms overlap   # finished arm is read back

Per-iteration means are over all iterations (the first has nothing to overlap with, so the
pipeline's fill is counted) and leave out Ray's start and the final evaluation, which
`wall_seconds` (the whole run) includes; `steady_seconds_per_iteration` leaves out iteration
0. On one machine the rollout
worker and the learner share its cores: the overlap pays only where each has its own
(cores, or GPUs).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ARMS = {"sync": [], "overlap": ["ppo.overlap_rollouts=true"]}
ASSETS = ("world", "tasks", "tokenizer", "indexes")


def _mean(xs: list[float]) -> float:
    return round(statistics.fmean(xs), 3) if xs else float("nan")


def run_arm(name: str, args: argparse.Namespace, out: Path, train: bool = True) -> dict | None:
    """Train arm `name` into out/name (unless a finished run is there) and summarise it;
    `train=False`: only a finished run's summary (None if there is none)."""
    from mem1_core.config import load_config
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.checkpoint import latest_checkpoint, read_state
    from mem1_core.training.train_rl import train_rl

    over = [
        f"ppo.iterations={args.iterations}",
        "ppo.minutes=100000",
        "ppo.eval_every=0",
        f"ppo.rollout_is={args.rollout_is}",  # both arms: only the schedule differs
        "data.eval_objectives_per_n=null",
        f"data.max_eval_tasks={args.eval_tasks}",
        *args.overrides,
        *ARMS[name],
    ]
    cfg = load_config(args.profile, None, over)
    run = out / name
    paths = RunPaths(run)
    ckpt = latest_checkpoint(paths.checkpoints) if paths.checkpoints.is_dir() else None
    wall = None
    if ckpt is None or read_state(ckpt).iteration < args.iterations:
        if not train:
            return None
        if not run.exists():  # the other arm's assets, if built: same world, tasks, index
            for other in ARMS:
                if other != name and (out / other / "tasks").is_dir():
                    for a in ASSETS:
                        if (out / other / a).exists():
                            shutil.copytree(out / other / a, run / a)
                    break
        t0 = time.perf_counter()
        train_rl(cfg, run, resume=paths.has_progress(), use_ray=not args.no_ray, show=False)
        wall = time.perf_counter() - t0
    rows = paths.read_metrics()
    last = rows[-1]
    return {
        "arm": name,
        "iterations": len(rows),
        "wall_seconds": None if wall is None else round(wall, 1),
        "seconds_per_iteration": _mean([r["seconds"] for r in rows]),
        "steady_seconds_per_iteration": _mean([r["seconds"] for r in rows[1:]]),
        "rollout_busy_seconds": _mean([r["rollout_busy_seconds"] for r in rows]),
        "rollout_wait_seconds": _mean([r["rollout_seconds"] for r in rows]),
        "update_seconds": _mean([r["train/update_seconds"] for r in rows]),
        "staleness": [r["rollout_staleness"] for r in rows],
        "rollout_is_mean": _mean([r["train/rollout_is_mean"] for r in rows[1:]]),
        "rollout_is_truncated_frac": _mean(
            [r["train/rollout_is_truncated_frac"] for r in rows[1:]]
        ),
        "logp_mismatch_mean": _mean([r["train/logp_mismatch_mean"] for r in rows[1:]]),
        "reward": [round(r["reward"], 3) for r in rows],
        "reward_first_last_4": [
            _mean([r["reward"] for r in rows[:4]]),
            _mean([r["reward"] for r in rows[-4:]]),
        ],  # fmt: skip
        "heldout_objectives": cfg.data.train_objectives,
        "heldout_tasks": last["eval/tasks"],
        "heldout_em_frac": round(last["eval/em_frac"], 3),
        "heldout_em_frac_se": round(last["eval/em_frac_se"], 3),
    }


def start_ray(args: argparse.Namespace, attempts: int = 3) -> None:
    """One local Ray for both arms, sized as a run would size it. Ray gives its processes 30 s
    to register, which a loaded machine at `nice 19` can miss: try again."""
    import ray

    from mem1_core.config import load_config
    from mem1_core.training.ray_start import start_ray as start

    resources = load_config(args.profile, None, args.overrides).resources
    for attempt in range(attempts):
        try:
            start(resources)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception on this timeout
            if attempt + 1 == attempts or "timed out during startup" not in str(e):
                raise
            ray.shutdown()
            print(f"Ray did not start ({e}); trying again", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="tiny")
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks at N=train")
    p.add_argument("--rollout-is", default="token", choices=["token", "sequence"])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--no-ray", action="store_true", help="in process: no overlap possible")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    results = {}
    if not args.no_ray:
        start_ray(args)  # the runs find it started and leave it running
    for name in args.arms:
        results[name] = run_arm(name, args, out)
        print(json.dumps(results[name]), flush=True)
    for name in [a for a in ARMS if a not in results]:  # finished earlier: read back
        if (row := run_arm(name, args, out, train=False)) is not None:
            results[name] = row
            print(json.dumps(row), flush=True)
    if not args.no_ray:
        import ray

        ray.shutdown()
    if {"sync", "overlap"} <= results.keys():
        sync, over = results["sync"], results["overlap"]
        print(
            json.dumps(
                {
                    "speedup_seconds_per_iteration": round(
                        sync["seconds_per_iteration"] / over["seconds_per_iteration"], 3
                    ),
                    "heldout_em_frac_diff": round(
                        over["heldout_em_frac"] - sync["heldout_em_frac"], 3
                    ),
                    "heldout_em_frac_diff_se": round(
                        (sync["heldout_em_frac_se"] ** 2 + over["heldout_em_frac_se"] ** 2) ** 0.5,
                        3,
                    ),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
