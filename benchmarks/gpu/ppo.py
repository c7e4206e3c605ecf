"""ppo: a few PPO iterations of a small Qwen-architecture model (smoke-sized embedded world,
model built from config) through the trainer (`train_rl`, Ray on CUDA): rollout and
training tokens/s from metrics.jsonl."""

from __future__ import annotations

import json
import time

from benchmarks.gpu.base import Check


def run(c: Check) -> None:
    device, s, out, emit = c.device, c.sizes, c.out, c.emit
    from mem1_core.config import load_config
    from mem1_core.training.train_rl import train_rl

    run = out / "ppo_run"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    over = ["ppo.minutes=30", "ppo.checkpoint_every=100", "data.max_eval_tasks=4", *s.ppo_overrides]
    cfg = load_config("smoke", None, over)
    t0 = time.perf_counter()
    result = train_rl(cfg, run, use_ray=device == "cuda", show=False)
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    per_it = []
    for r in rows:
        per_it.append(
            {
                "iteration": r["iteration"],
                "reward": r["reward"],
                "rollout_tokens_per_s": r["gen_tokens"] / max(r["rollout_seconds"], 1e-9),
                "train_tokens_per_s": r["train/tree_tokens"] / max(r["train/update_seconds"], 1e-9),
                "train_generated_tokens_per_s": r["train/gen_tokens"]
                / max(r["train/update_seconds"], 1e-9),
                "logp_mismatch_max": r["train/logp_mismatch_max"],
                "skipped_steps": r["train/skipped_steps"],
            }
        )
    steady = per_it[1:] or per_it  # the first iteration compiles
    emit(
        {
            "check": "ppo",
            "device": device,
            "iterations": result["iterations"],
            "wall_s": wall,
            "model": {
                k: cfg.model.to_dict()[k]
                for k in (
                    "hidden_size",
                    "num_layers",
                    "dtype",
                    "attn",
                    "gradient_checkpointing",
                    "seq_bucket",
                )
            },
            "rollout_tokens_per_s": sum(r["rollout_tokens_per_s"] for r in steady) / len(steady),
            "train_tokens_per_s": sum(r["train_tokens_per_s"] for r in steady) / len(steady),
            "per_iteration": per_it,
            "ok": result["iterations"] == cfg.ppo.iterations
            and all(r["skipped_steps"] == 0 for r in per_it),
        }
    )
