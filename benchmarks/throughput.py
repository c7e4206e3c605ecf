"""What fits in the default run's budget: SFT and PPO training tokens/s, rollout generated
tokens/s, and the fraction of this CPU's matrix-multiply peak that a training step reaches,
all measured side by side in one run (these machines are noisy: compare the ratios).

    python benchmarks/throughput.py [--profile tiny] [--base data/base] [--steps 10]

Prints one JSON line per measurement and a final line of ratios:
- `matmul_peak_gflops`: float32 square matmuls (1024 and 2048), the best of several, with the
  same torch threads as the rest: the ceiling a dense training step can reach here;
- `sft`: tokens/s of SFT steps on teacher trajectories (N=2, mem1), their FLOPs counted by
  torch's FlopCounterMode on one step, and the fraction of the matmul peak they reach;
- `rollout`: generated tokens/s of sampled rollouts (HF backend with a KV cache, N=2);
- `ppo`: a PPO iteration's rollout and update seconds and tokens/s (in-process learner).
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

from benchmarks.common import matmul_peak  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--base", default=None, help="model.base (default: the profile's)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--ppo-iterations", type=int, default=2)
    args = ap.parse_args()

    from torch.utils.flop_counter import FlopCounterMode

    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.models.policy import initial_policy
    from mem1_core.rollout.generation import HFBackend
    from mem1_core.rollout.loop import rollout
    from mem1_core.training.sft import sft_loss, teacher_trajectories
    from mem1_core.training.train_rl import train_rl
    from mem1_core.trajectory.record import turn_paths
    from mem1_core.trajectory.tree import flatten

    over = [f"model.base={args.base}"] if args.base else []
    cfg = load_config(args.profile, overrides=over)
    out = {"threads": torch.get_num_threads()}
    root = Path(tempfile.mkdtemp(prefix="mem1-throughput-"))
    paths = prepare(cfg, root)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "train", 2)[: args.tasks]
    model = initial_policy(cfg, tok)

    peak = matmul_peak()
    print(json.dumps({"matmul_peak_gflops": round(peak, 1)}))

    # SFT steps on teacher trajectories
    trajs = teacher_trajectories(tasks, tok, env, cfg.rollout, memory="mem1")
    trees = [flatten(turn_paths(t)) for t in trajs if t.turns]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    bs = cfg.sft.batch_size
    batch = [trees[i % len(trees)] for i in range(bs)]

    def step() -> int:
        loss, n = sft_loss(model, batch, tok.pad_token_id, cfg.model.attn)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return n

    model.train()
    step()
    with FlopCounterMode(display=False) as fc:
        step()
    flops = fc.get_total_flops()
    t0, tokens = time.perf_counter(), 0
    for _ in range(args.steps):
        tokens += step()
    sec = (time.perf_counter() - t0) / args.steps
    flat = sum(t.input_ids.numel() for t in batch)
    sft = {
        "sft_generated_tokens_per_s": round(tokens / args.steps / sec),
        "sft_flattened_tokens_per_s": round(flat / sec),
        "sft_step_gflop": round(flops / 1e9, 2),
        "sft_gflops": round(flops / sec / 1e9, 2),
        "sft_fraction_of_matmul_peak": round(flops / sec / 1e9 / peak, 3),
    }
    print(json.dumps(sft))
    model.eval()

    # sampled rollouts
    backend = HFBackend(
        model, tok.pad_token_id, tok.eos_token_id, cfg.rollout.batch_size, tokenizer=tok
    )
    t0 = time.perf_counter()
    rolled = rollout(tasks, backend, env, cfg.rollout, memory="mem1")
    sec = time.perf_counter() - t0
    gen = sum(len(t.gen_ids) for tr in rolled for t in tr.turns)
    roll = {
        "rollout_generated_tokens_per_s": round(gen / sec),
        "rollout_tasks_per_s": round(len(rolled) / sec, 2),
    }
    print(json.dumps(roll))

    # PPO iterations, in process
    ppo_over = [
        *over,
        f"ppo.iterations={args.ppo_iterations}",
        f"ppo.tasks_per_iteration={args.tasks}",
        "ppo.checkpoint_every=100",
        "ppo.eval_every=0",
    ]
    pcfg = load_config(args.profile, overrides=ppo_over)
    ppo_out = root / "ppo"
    train_rl(pcfg, ppo_out, init=None, use_ray=False, show=False)
    rows = [json.loads(line) for line in (ppo_out / "metrics.jsonl").read_text().splitlines()]
    it = [r for r in rows if "rollout_seconds" in r][-1]
    ppo = {
        "ppo_iteration_seconds": round(it["seconds"], 2),
        "ppo_rollout_seconds": round(it["rollout_seconds"], 2),
        "ppo_update_seconds": round(it["seconds"] - it["rollout_seconds"], 2),
        "ppo_generated_tokens": it.get("train/gen_tokens"),
        "ppo_generated_tokens_per_s": round(it["tokens_per_s"]),
        "ppo_update_generated_tokens_per_s": round(
            it["train/gen_tokens"] / max(it["seconds"] - it["rollout_seconds"], 1e-9)
        ),
    }
    print(json.dumps(ppo))
    out |= {"matmul_peak_gflops": round(peak, 1)} | sft | roll | ppo
    print(json.dumps({"summary": out}))


if __name__ == "__main__":
    main()
