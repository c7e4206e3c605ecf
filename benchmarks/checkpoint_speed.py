"""What writing one PPO checkpoint of the `smol` profile costs: the real save
(mem1_core.training.checkpoint.save_checkpoint) of SmolLM2-135M (float32 weights), a critic of its
first 8 layers and both AdamW optimisers after one step (their moments exist, as in a run), with
the tokenizer, `--reps` times, each into a fresh directory and deleted after. Prints each save's
seconds and its parts (from the files' modification times: the policy, the critic, the optimiser
file, the sha256 manifest), then the best and the median.

A save measured alone lands in the page cache; in a run, one every iteration outruns a slow
disk's write-back and is throttled (docs/performance.md, "Memory and disk"): compare with the
gaps between iterations in a run's metrics.jsonl (`elapsed_seconds` minus `seconds`).

    python benchmarks/checkpoint_speed.py [--reps 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMOL = "smollm2-135m-instruct"


def parts(ckpt: Path, t0: float) -> dict[str, float]:
    """Seconds from the save's start to each part's last file."""
    last = {
        "policy": max(p.stat().st_mtime for p in (ckpt / "policy").iterdir()),
        "critic": max(p.stat().st_mtime for p in (ckpt / "critic").iterdir()),
        "optimizer": (ckpt / "optimizer.pt").stat().st_mtime,
        "manifest": (ckpt / "manifest.json").stat().st_mtime,
    }
    return {k: round(v - t0, 2) for k, v in last.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from mem1_core.config import ModelConfig
    from mem1_core.models.model import load_model
    from mem1_core.models.tokenizer import load_tokenizer
    from mem1_core.rl.critic import Critic
    from mem1_core.training.checkpoint import TrainState, save_checkpoint

    policy = load_model(SMOL, ModelConfig(name_or_path=SMOL))
    tokenizer = load_tokenizer(SMOL)
    critic = Critic.from_policy(policy, layers=8)
    optimizers = {
        "policy": torch.optim.AdamW(policy.parameters(), lr=1e-5),
        "critic": torch.optim.AdamW(critic.parameters(), lr=5e-5),
    }
    for module in (policy, critic):  # one step on random gradients: the moments exist
        for p in module.parameters():
            p.grad = torch.randn_like(p) * 1e-3
    for opt in optimizers.values():
        opt.step()
        opt.zero_grad()

    seconds = []
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as root:
        for rep in range(args.reps):
            out = Path(root) / f"rep{rep}"
            t0 = time.time()
            ckpt = save_checkpoint(
                out, TrainState(iteration=1), policy=policy, optimizers=optimizers,
                config={"model": {"name_or_path": SMOL}}, critic=critic, tokenizer=tokenizer,
            )  # fmt: skip
            seconds.append(time.time() - t0)
            gb = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file()) / 1e9
            row = {"rep": rep, "seconds": round(seconds[-1], 2), "gb": round(gb, 2)}
            print(json.dumps(row | {"parts": parts(ckpt, t0)}), flush=True)
            shutil.rmtree(out)
    summary = {"best": round(min(seconds), 2), "median": round(statistics.median(seconds), 2)}
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
