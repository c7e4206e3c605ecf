"""Each phase of a PPO iteration against this CPU's limits: a roofline per phase.

    python benchmarks/roofline.py [--profile smol] [--tasks 4] [--set K=V ...] [--threads 2]
    python benchmarks/roofline.py --metrics RUN/metrics.jsonl [--profile smol]

Runs one iteration in process (a rollout worker's rollout, then the learner's update, as the
loop runs them without Ray; the profile's settings, its untrained model unless `--init`), or
reads the rows of a run's metrics.jsonl (`--metrics`). Then
measures, in this process and on these threads, the peak of a 2048 x 2048 matmul in the
compute dtype the profile's `model.autocast` picks on this CPU, and a 256 MiB copy's bandwidth,
and prints for each iteration and phase its work (the `train/work_*` columns,
mem1_core.rl.roofline), its seconds, its rate and the fraction of the peak it reached:

- score and update (the learner's phases): FLOPs / seconds / matmul peak;
- learner: both, over the learner's seconds (scoring, advantages, epochs);
- rollout: its bound, prefill FLOPs / matmul peak + decoding's weight bytes / copy
  bandwidth, over its seconds (the environment's share included; no roofline splits the
  prefill's seconds from decoding's, so the pair is bounded together).

Prints the CPU first (model and the flags that decide a dtype's speed), one JSON line per
iteration, and a table. A peak measured now is this moment's: read rows of an older run
against a peak measured beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import copy_bandwidth, matmul_peak  # noqa: E402

PHASE_FLOPS = {"score": "train/phase_score_seconds", "update": "train/phase_epochs_seconds"}
"""The learner's phases: work_<phase>_flops over these seconds."""
LEARNER_SECONDS = (*PHASE_FLOPS.values(), "train/phase_advantages_seconds")


def one_iteration(profile: str, tasks: int, init: str | None, settings: list[str]) -> list[dict]:
    """One PPO iteration of `profile` in process, as the loop runs it without Ray: a rollout
    worker's rollout of `tasks` training tasks, then one learner update in one minibatch
    (no evaluation, no checkpoint). -> its row, named as in metrics.jsonl."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import load_tasks, prepare
    from mem1_core.training.learner import Learner
    from mem1_core.training.workers import RolloutWorker

    micro = min(tasks, load_config(profile).ppo.micro_batch_size)
    cfg = load_config(
        profile,
        overrides=[
            f"ppo.tasks_per_iteration={tasks}",
            f"ppo.minibatch_size={tasks}",
            f"ppo.micro_batch_size={micro}",
            *settings,
        ],
    )
    root = tempfile.mkdtemp(prefix="mem1-roofline-")
    paths = prepare(cfg, root)
    chosen = load_tasks(cfg, paths, "train", cfg.data.train_objectives)[:tasks]
    worker = RolloutWorker(cfg, root, init=init)
    learner = Learner(cfg, root, init=init)
    t0 = time.perf_counter()
    trajs = worker.rollout(chosen, seed=0, samples_per_task=cfg.ppo.samples_per_task)
    rollout_seconds = time.perf_counter() - t0
    stats = learner.update(trajs, 0)
    return [{"iteration": 0, "rollout_seconds": rollout_seconds}
            | {f"train/{k}": v for k, v in stats.items()}]  # fmt: skip


def roofline(row: dict, peak_flops: float, bandwidth: float) -> dict:
    """One metrics row's phases against the peaks (FLOP/s, bytes/s)."""
    out: dict = {"iteration": row["iteration"]}
    for phase, key in PHASE_FLOPS.items():
        flops, seconds = row[f"train/work_{phase}_flops"], row[key]
        out[phase] = {
            "gflop": round(flops / 1e9, 1),
            "seconds": round(seconds, 2),
            "gflops": round(flops / seconds / 1e9, 1),
            "of_peak": round(flops / seconds / peak_flops, 3),
        }
    flops = row["train/work_score_flops"] + row["train/work_update_flops"]
    seconds = sum(row[k] for k in LEARNER_SECONDS)
    out["learner"] = {
        "gflop": round(flops / 1e9, 1),
        "seconds": round(seconds, 2),
        "gflops": round(flops / seconds / 1e9, 1),
        "of_peak": round(flops / seconds / peak_flops, 3),
    }
    prefill, decode = row["train/work_prefill_flops"], row["train/work_decode_bytes"]
    bound = prefill / peak_flops + decode / bandwidth
    gen = row["train/gen_tokens"]
    out["rollout"] = {
        "prefill_gflop": round(prefill / 1e9, 2),
        "prefill_tokens": row["train/work_prefill_tokens"],
        "decode_gb": round(decode / 1e9, 2),
        "decode_steps": row["train/work_decode_steps"],
        "seconds": round(row["rollout_seconds"], 2),
        "bound_seconds": round(bound, 2),
        "of_peak": round(bound / row["rollout_seconds"], 3),
        "tokens_per_s": round(gen / row["rollout_seconds"], 1),
        "bound_tokens_per_s": round(gen / bound, 1),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="smol", help="the run's profile (its compute dtype)")
    ap.add_argument("--tasks", type=int, default=4, help="tasks of the one iteration run here")
    ap.add_argument("--init", default=None, help="the iteration's policy (a warm start)")
    ap.add_argument("--set", action="append", default=[], help="more overrides, K=V")
    ap.add_argument("--metrics", default=None, help="read a run's metrics.jsonl instead")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from mem1_core.config import load_config
    from mem1_core.models.compute import cpu_info, resolve_autocast

    autocast = resolve_autocast(load_config(args.profile).model.autocast, "cpu")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(autocast, torch.float32)
    print(json.dumps({"cpu": cpu_info().describe(), "compute_dtype": str(dtype)}), flush=True)
    t0 = time.perf_counter()
    if args.metrics:
        rows = [json.loads(line) for line in Path(args.metrics).read_text().splitlines()]
    else:
        rows = one_iteration(args.profile, args.tasks, args.init, args.set)
    peak = matmul_peak(dtype, sizes=(2048,)) * 1e9
    bandwidth = copy_bandwidth() * 1e9
    peaks = {"matmul_2048_gflops": round(peak / 1e9, 1), "copy_gb_s": round(bandwidth / 1e9, 1)}
    print(json.dumps(peaks), flush=True)
    lines = [roofline(r, peak, bandwidth) for r in rows if "train/work_update_flops" in r]
    for line in lines:
        print(json.dumps(line), flush=True)
    print(f"\nphase     work              seconds   rate            of the peak   ({dtype})")
    for line in lines:
        for phase in ("score", "update", "learner"):
            p = line[phase]
            print(
                f"{phase:9} {p['gflop']:8.1f} GFLOP   {p['seconds']:7.2f}   "
                f"{p['gflops']:7.1f} GFLOP/s   {p['of_peak']:.3f}"
            )
        r = line["rollout"]
        print(
            f"rollout   {r['prefill_gflop']:6.2f} GFLOP + {r['decode_gb']:.2f} GB   "
            f"{r['seconds']:7.2f}   bound {r['bound_seconds']:.2f} s   {r['of_peak']:.3f}   "
            f"({r['tokens_per_s']} generated tokens/s, bound {r['bound_tokens_per_s']})"
        )
    print(f"\n{time.perf_counter() - t0:.0f} s in all", flush=True)


if __name__ == "__main__":
    main()
