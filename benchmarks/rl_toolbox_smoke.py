"""One smoke training run per RL-toolbox option: `mem1 train ppo|grpo --profile
smoke --no-ray` for one iteration with the option `--set`, one run at a time; prints a table
of what each run logged for its option and its wall time.

    python benchmarks/rl_toolbox_smoke.py --out runs/toolbox            # every option
    python benchmarks/rl_toolbox_smoke.py --out runs/toolbox --only gspo rloo

The first run builds the smoke assets (world, tasks, tokenizer, index); the others copy them
(`prepare` builds only what is missing). The smoke model is untrained, so rewards are 0 and
this checks that each option reaches training and logs, not that it learns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SMALL = [
    "ppo.iterations=1",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=8",
    "ppo.micro_batch_size=4",
    "ppo.ppo_epochs=2",
    "ppo.entropy_coef=0.05",  # the untrained model earns no reward: let the policy move
    "rollout.gen_tokens_base=16",
    "rollout.gen_tokens_per_objective=4",
    "data.max_eval_tasks=2",
]
# option -> (trainer, --set overrides, the metrics that show it)
OPTIONS: dict[str, tuple[str, list[str], list[str]]] = {
    "gae": ("ppo", [], ["train/vf_loss", "train/dual_clip_frac"]),
    "grpo": ("grpo", [], ["train/kl_loss"]),
    "grpo_mean": ("grpo", ["ppo.adv_estimator=grpo_mean"], ["train/advantage_mean"]),
    "rloo": ("grpo", ["ppo.adv_estimator=rloo"], ["train/advantage_mean"]),
    "reinforce_plus_plus": (
        "ppo",
        ["ppo.adv_estimator=reinforce_plus_plus"],
        ["train/advantage_mean", "train/kl_ref"],
    ),
    "reinforce_plus_plus_baseline": (
        "grpo",
        ["ppo.adv_estimator=reinforce_plus_plus_baseline"],
        ["train/advantage_mean"],
    ),
    "seq-mean-token-mean": ("ppo", ["ppo.loss_agg_mode=seq-mean-token-mean"], ["train/pg_loss"]),
    "seq-mean-token-sum": ("ppo", ["ppo.loss_agg_mode=seq-mean-token-sum"], ["train/pg_loss"]),
    "seq-mean-token-sum-norm": (
        "grpo",
        ["ppo.loss_agg_mode=seq-mean-token-sum-norm", "ppo.adv_estimator=grpo_mean"],
        ["train/pg_loss"],
    ),
    "clip-higher": (
        "ppo",
        ["ppo.clip_ratio_low=0.2", "ppo.clip_ratio_high=0.28"],
        ["train/clip_frac"],
    ),
    "no-dual-clip": ("ppo", ["ppo.clip_ratio_c=null"], ["train/clip_frac"]),
    "gspo": ("grpo", ["ppo.policy_loss=gspo"], ["train/seq_ratio_dev", "train/clip_frac"]),
    "rollout_is-token": (
        "ppo",
        ["ppo.rollout_is=token"],
        ["train/rollout_is_threshold", "train/rollout_is_truncated_frac", "train/rollout_is_mean"],
    ),
    "rollout_is-sequence": (
        "grpo",
        ["ppo.rollout_is=sequence", "ppo.rollout_is_threshold=1.5"],
        ["train/rollout_is_threshold", "train/rollout_is_truncated_frac", "train/rollout_is_mean"],
    ),
    "kl_ctrl-adaptive": (
        "ppo",
        ["ppo.kl_ctrl=adaptive", "ppo.target_kl=0.01", "ppo.kl_horizon=100"],
        ["train/kl_coef", "train/kl_ctrl_measured"],
    ),
}
ASSETS = ("world", "tasks", "tokenizer", "indexes")


def run(name: str, out: Path, assets: Path | None) -> dict:
    trainer, overrides, keys = OPTIONS[name]
    run_dir = out / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for a in ASSETS if assets is not None else ():
        if (assets / a).exists():
            shutil.copytree(assets / a, run_dir / a)
    cmd = [sys.executable, "-m", "mem1_core.cli.main", "train", trainer, "--profile", "smoke"]
    cmd += ["--out", str(run_dir), "--no-ray", "--no-progress"]
    group = ["ppo.samples_per_task=2"] if trainer == "grpo" else []  # 8 trajectories, as ppo
    for o in [*SMALL, *group, *overrides]:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    env = {**os.environ, "WANDB_MODE": "disabled"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if done.returncode:
        return {"option": name, "ok": False, "seconds": seconds, "error": done.stderr[-2000:]}
    row = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return {
        "option": name,
        "ok": True,
        "seconds": round(seconds, 1),
        "estimator": row["estimator"],
        "steps": row["train/optimizer_steps"],
        **{k: row.get(k, "missing") for k in keys},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="+", choices=sorted(OPTIONS), default=None)
    args = p.parse_args(argv)
    out = Path(args.out)
    assets = None
    failed = 0
    for name in args.only or OPTIONS:
        result = run(name, out, assets)
        if result["ok"] and assets is None:
            assets = out / name
        failed += not result["ok"]
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
