"""The GPU check of issue #7: one prepared script for a machine with a GPU; JSON lines out.

    python benchmarks/gpu_check.py --out runs/gpu_check                   # CUDA, ~6 min, one H200
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check   # CPU, ~1-2 min

Sections (`--only` picks some), each printing JSON lines with "check" and, where there is a
pass criterion, "ok"; a section that raises prints its error and the others still run:

- exactness: the tree contract with FlexAttention. A small Qwen2-architecture model built
  from config, MEM1 and full-context trajectories in one padded batch; per-token log-probs of
  generated tokens over the flattened tree with FlexAttention (BlockMask) and with the dense
  boolean mask (sdpa), both against the definition (each turn re-run alone), and the
  gradients of their summed log-probs (max relative difference), in float32 and bfloat16.
  CPU: FlexAttention forward only (no CPU backward).
- train_step: one training step (forward + backward of the generated tokens' log-probs) of
  a MEM1 batch at T = 8 turns over the flattened tree (flex, sdpa) vs re-running every turn
  (length-sorted micro-batches of as many rows): best time and peak CUDA memory
  (torch.cuda.max_memory_allocated), with and without activation checkpointing.
- ppo: a few PPO iterations of a small Qwen-architecture model (smoke-sized embedded world,
  model built from config) through the trainer (`train_rl`, Ray on CUDA): rollout and
  training tokens/s from metrics.jsonl.
- text_stops: tags as text (issue 15). A byte-level BPE with Qwen2.5's pre-tokenizer trained
  on a smoke world (the tags are not tokens of it) and a Qwen2 model from config taught to
  recite two turns past their closing tag (` </query>\n`, `</answer>.\n`: 3 tokens each, the
  last carrying more characters). Hugging Face generation with stop strings must end each at
  the token that completes the tag, and the environment must read the action; the cost of the
  per-token stop check is timed on a batch of random contexts. With vLLM (row
  `text_stops_vllm`): the engine loads the tokenizer, stops on the strings with the stop text
  kept, and its ids must equal Hugging Face's; skipped if vLLM is missing.
- vllm: greedy agreement of vLLM (mem1_core.rollout.generation_vllm.VLLMBackend) and Hugging Face
  generation on the same weights, before and after a weight sync; skipped if vLLM is
  missing. Last but one, because the engine keeps its share of GPU memory.
- vllm_deployment: the deployment's vLLM rollouts (issue 15). PPO iterations of the `ppo`
  section's model with `rollout.backend=vllm`, driven, as the `mem1/train-eval` flows drive
  them, from the Prefect venv's Python (no vLLM there: `--prefect-python`, default
  $MEM1_VENV or ./.venv) with the rollout worker a Ray actor under the vLLM venv's Python
  (mem1_core.training.rollout_python), each side on half the GPU. Reports what metrics.jsonl
  says generated the rollouts (backend, vLLM version, interpreter), the per-turn rollout /
  learner log-prob mismatch, and rollout tokens/s. CUDA only (skipped on a CPU, and where
  either venv is missing); a subprocess, so its Ray and engine leave with it.

Exit status 0 if every "ok" is true. Rows also go to OUT/gpu_check.jsonl.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mem1_core.config import ModelConfig
from mem1_core.models.model import DTYPES, enable_gradient_checkpointing, tiny_qwen2_config
from mem1_core.trajectory.logprobs import forward_tree, per_turn_logprobs, tree_attention_mask
from mem1_core.trajectory.tree import FlatBatch, Segment, collate, flatten

Paths = list[list[Segment]]
SECTIONS = ("exactness", "train_step", "ppo", "text_stops", "vllm", "vllm_deployment")


@dataclass(frozen=True)
class Sizes:
    """What each section runs on (chosen by device and --quick)."""

    vocab: int
    exact_model: ModelConfig
    exact_trajectories: int
    exact_turns: int
    step_model: ModelConfig
    step_trajectories: int
    prompt_len: int
    gen_len: int
    info_len: int
    repeats: int
    ppo_overrides: tuple[str, ...]
    stop_rows: int
    stop_tokens: int


def sizes_for(device: str, quick: bool) -> Sizes:
    tiny = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128
    )
    small_ppo = ("ppo.iterations=2", "ppo.tasks_per_iteration=8", "rollout.batch_size=8")
    if device == "cpu":
        return Sizes(
            vocab=512,
            exact_model=tiny,
            exact_trajectories=2,
            exact_turns=3,
            step_model=tiny,
            step_trajectories=2,
            prompt_len=60,
            gen_len=12,
            info_len=30,
            repeats=2 if quick else 3,
            ppo_overrides=small_ppo + ("rollout.gen_tokens_base=16",),
            stop_rows=8,
            stop_tokens=32,
        )
    # CUDA: head_dim 64 and sizes large enough that kernels, not launches, dominate.
    small = ModelConfig(
        hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1536
    )
    step = ModelConfig(
        hidden_size=1024, num_layers=12, num_heads=16, num_kv_heads=8, intermediate_size=2816
    )
    ppo = (
        "ppo.iterations=3",
        "ppo.tasks_per_iteration=64",
        "ppo.minibatch_size=32",
        "ppo.micro_batch_size=16",
        "rollout.batch_size=64",
        "model.hidden_size=512",
        "model.num_layers=8",
        "model.num_heads=8",
        "model.num_kv_heads=4",
        "model.intermediate_size=1536",
        "model.dtype=bfloat16",
        "model.attn=flex_attention",
        "model.gradient_checkpointing=true",
        "resources.gpus_per_worker=0.5",
        "resources.learner_gpus=0.5",
    )
    return Sizes(
        vocab=4096,
        exact_model=small,
        exact_trajectories=4,
        exact_turns=6,
        step_model=step,
        step_trajectories=8,
        prompt_len=400,
        gen_len=200,
        info_len=300,
        repeats=3,
        ppo_overrides=("ppo.iterations=2", *ppo[1:]) if quick else ppo,
        stop_rows=64,
        stop_tokens=256,
    )


# ---- helpers --------------------------------------------------------------------------------


def qwen2(cfg: ModelConfig, vocab: int, attn: str, dtype: str, device: str, seed: int = 0):
    """A Qwen2-architecture causal LM from config (random weights), eval mode."""
    from transformers import Qwen2ForCausalLM

    qcfg = tiny_qwen2_config(cfg, vocab, pad_id=vocab - 1, eos_id=vocab - 2)
    qcfg.max_position_embeddings = 1 << 15
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM._from_config(qcfg, attn_implementation=attn, dtype=DTYPES[dtype])
    return model.to(device).eval()


def same_weights(model, attn: str, dtype: str | None = None):
    """A copy of `model` under another attention implementation (and dtype)."""
    other = copy.deepcopy(model)
    other.set_attn_implementation(attn)
    return other if dtype is None else other.to(DTYPES[dtype])


def synthetic(
    policy: str, turns: int, n: int, vocab: int, lens: tuple[int, int, int], seed: int
) -> list[Paths]:
    """n trajectories of `turns` turns under a memory policy (`mem1`: prompt + last turn +
    last info; `full`: everything), segment lengths jittered +-25% around `lens`."""
    rng = random.Random(f"{seed}-{policy}-{turns}")

    def ids(mean: int) -> tuple[int, ...]:
        return tuple(
            rng.randrange(vocab - 2) for _ in range(rng.randint(mean * 3 // 4, mean * 5 // 4) or 1)
        )

    window = 1 if policy == "mem1" else turns
    out = []
    for _ in range(n):
        prompt, gens, infos = (
            ids(lens[0]),
            [ids(lens[1]) for _ in range(turns)],
            [ids(lens[2]) for _ in range(turns)],
        )
        paths = []
        for t in range(turns):
            ctx = [Segment(("prompt",), prompt, False)]
            for s in range(max(t - window, 0), t):
                ctx += [Segment(("gen", s), gens[s], False), Segment(("info", s), infos[s], False)]
            paths.append([*ctx, Segment(("gen", t), gens[t], True)])
        out.append(paths)
    return out


def definition_gap(logp: torch.Tensor, batch: FlatBatch, refs: list[list[torch.Tensor]]) -> float:
    """max |logp - definition| over generated tokens; refs[b][t]: (len(G_t),)."""
    logp, mask = logp.detach().float().cpu(), batch.loss_mask.cpu()
    turn, offset = batch.gen_turn.cpu(), batch.gen_offset.cpu()
    gap = 0.0
    for r, ref in enumerate(refs):
        want = torch.stack(
            [
                ref[t][o].float().cpu()
                for t, o in zip(turn[r, mask[r]].tolist(), offset[r, mask[r]].tolist(), strict=True)
            ]
        )
        gap = max(gap, float((logp[r, mask[r]] - want).abs().max()))
    return gap


def logp_grads(model, batch: FlatBatch, attn: str, backward: bool):
    """Generated-token log-probs over the tree in one pass with `attn`'s mask (BlockMask for
    flex, dense boolean for sdpa), and the gradient of their mean (None without backward)."""
    model.zero_grad(set_to_none=True)
    mask = tree_attention_mask(batch, attn, next(model.parameters()).dtype)
    with torch.set_grad_enabled(backward):
        logp = forward_tree(model, batch, attn, mask=mask).logprobs
        if not backward:
            return logp, None
        (logp.sum() / batch.loss_mask.sum()).backward()
    return logp.detach(), {k: p.grad.float() for k, p in model.named_parameters()}


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over parameters of max|a - b| / max|b| (b the reference)."""
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in b)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---- sections -------------------------------------------------------------------------------


EXACT_TOL = {
    # max |dlogp| vs the definition; max relative gradient difference flex vs dense.
    "float32": (1e-4, 1e-3),
    # bf16: both paths round; flex must be as close to the fp32 definition as dense is.
    "bfloat16": (None, 5e-2),
}


def exactness(device: str, s: Sizes, emit: Callable[[dict], None]) -> None:
    backward = device == "cuda"  # FlexAttention has no CPU backward
    trajs = synthetic(
        "mem1",
        s.exact_turns,
        s.exact_trajectories,
        s.vocab,
        (s.prompt_len // 4, s.gen_len // 4, s.info_len // 4),
        0,
    )
    trajs += synthetic(
        "full",
        s.exact_turns - 1,
        s.exact_trajectories // 2 or 1,
        s.vocab,
        (s.prompt_len // 4, s.gen_len // 4, s.info_len // 4),
        1,
    )
    batch = collate([flatten(p) for p in trajs], s.vocab - 1, pad_to_multiple=128).to(device)
    base = qwen2(s.exact_model, s.vocab, "sdpa", "float32", device)
    with torch.no_grad():
        ref32 = [per_turn_logprobs(base, p) for p in trajs]
    for dtype in ("float32", "bfloat16") if device == "cuda" else ("float32",):
        sdpa = same_weights(base, "sdpa", dtype)
        flex = same_weights(base, "flex_attention", dtype)
        with torch.no_grad():
            ref = ref32 if dtype == "float32" else [per_turn_logprobs(sdpa, p) for p in trajs]
        t0 = time.perf_counter()
        lf, gf = logp_grads(flex, batch, "flex_attention", backward)  # compiles on first call
        compile_s = time.perf_counter() - t0
        ld, gd = logp_grads(sdpa, batch, "sdpa", backward)
        row = {
            "check": "exactness",
            "device": device,
            "dtype": dtype,
            "backward": backward,
            "flat_len": batch.input_ids.shape[1],
            "generated_tokens": int(batch.loss_mask.sum()),
            "max_abs_dlogp_flex_vs_def": definition_gap(lf, batch, ref),
            "max_abs_dlogp_dense_vs_def": definition_gap(ld, batch, ref),
            "max_abs_dlogp_flex_vs_def32": definition_gap(lf, batch, ref32),
            "max_abs_dlogp_dense_vs_def32": definition_gap(ld, batch, ref32),
            "max_abs_dlogp_flex_vs_dense": float((lf - ld).abs().max()),
            "grad_max_rel_diff": None if gf is None else max_rel_diff(gf, gd),
            "first_flex_call_s": compile_s,
        }
        logp_tol, grad_tol = EXACT_TOL[dtype]
        if logp_tol is None:  # bf16: no worse than the dense path, plus bf16 slack
            logp_ok = (
                row["max_abs_dlogp_flex_vs_def32"] <= 2 * row["max_abs_dlogp_dense_vs_def32"] + 0.05
            )
        else:
            logp_ok = row["max_abs_dlogp_flex_vs_def"] <= logp_tol
        grad_ok = gf is None or row["grad_max_rel_diff"] <= grad_tol
        emit(row | {"ok": bool(logp_ok and grad_ok)})


def per_turn_step(model, trajs: list[Paths], rows: int, pad_id: int) -> float:
    """The baseline step: every turn's context + generation as its own right-padded row,
    length-sorted micro-batches of `rows`; log-probs (and the vocabulary projection) only at
    generated tokens, like the tree; backward per micro-batch. -> summed log-prob."""
    device = next(model.parameters()).device
    seqs = [
        ([i for seg in path[:-1] for i in seg.ids], list(path[-1].ids)) for p in trajs for path in p
    ]
    seqs.sort(key=lambda cg: len(cg[0]) + len(cg[1]))
    n_gen = sum(len(g) for _, g in seqs)
    total = 0.0
    for start in range(0, len(seqs), rows):
        chunk = seqs[start : start + rows]
        length = max(len(c) + len(g) for c, g in chunk)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        at_r, at_i, tgt = [], [], []
        for r, (c, g) in enumerate(chunk):
            ids[r, : len(c) + len(g)] = torch.tensor(c + g)
            attn[r, : len(c) + len(g)] = 1
            at_r += [r] * len(g)
            at_i += range(len(c) - 1, len(c) + len(g) - 1)
            tgt += g
        ids, attn = ids.to(device), attn.to(device)
        hidden = model.get_decoder()(
            input_ids=ids, attention_mask=attn, use_cache=False
        ).last_hidden_state
        logits = model.get_output_embeddings()(
            hidden[torch.tensor(at_r), torch.tensor(at_i)]
        ).float()
        logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tgt, device=device)[:, None])
        loss = logp.sum() / n_gen
        loss.backward()
        total += float(logp.sum())
    return total


def tree_step(model, batch: FlatBatch, attn: str) -> float:
    """One step over the flattened tree: one-pass BlockMask under flex; forward_tree's
    default (shared prefix) under sdpa, or the one-pass mask under checkpointing."""
    from mem1_core.rl.passes import one_pass_mask

    mask = one_pass_mask(model, batch, attn)
    logp = forward_tree(model, batch, attn, mask=mask).logprobs
    (logp.sum() / batch.loss_mask.sum()).backward()
    return float(logp.detach().sum())


def train_step(device: str, s: Sizes, emit: Callable[[dict], None]) -> None:
    dtype = "bfloat16" if device == "cuda" else "float32"
    trajs = synthetic(
        "mem1", 8, s.step_trajectories, s.vocab, (s.prompt_len, s.gen_len, s.info_len), 2
    )
    pad = s.vocab - 1
    batch = collate([flatten(p) for p in trajs], pad, pad_to_multiple=128).to(device)
    base = qwen2(s.step_model, s.vocab, "sdpa", dtype, device)
    per_turn_tokens = sum(len(seg.ids) for p in trajs for path in p for seg in path)
    variants: dict[str, tuple[str, Callable]] = {}
    for ckpt in (False, True) if device == "cuda" else (False,):
        tag = "+ckpt" if ckpt else ""
        for name, attn in (
            ("tree_flex", "flex_attention"),
            ("tree_sdpa", "sdpa"),
            ("per_turn", "sdpa"),
        ):
            if attn == "flex_attention" and device != "cuda":
                continue
            variants[name + tag] = (attn, ckpt)
    results, sums = [], {}
    for name, (attn, ckpt) in variants.items():
        model = same_weights(base, attn)
        if ckpt:
            enable_gradient_checkpointing(model)
        if name.startswith("tree"):
            step = lambda m=model, a=attn: tree_step(m, batch, a)  # noqa: E731
        else:
            step = lambda m=model: per_turn_step(m, trajs, s.step_trajectories, pad)  # noqa: E731
        model.zero_grad(set_to_none=True)
        sums[name] = step()  # warm-up (and compile)
        best = math.inf
        for _ in range(s.repeats):
            model.zero_grad(set_to_none=True)
            sync(device)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if device == "cuda" else 0
            t0 = time.perf_counter()
            step()
            sync(device)
            best = min(best, time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() - before if device == "cuda" else None
        results.append(
            {
                "variant": name,
                "step_s": best,
                "peak_mem_above_weights_gib": None if peak is None else peak / 2**30,
            }
        )
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    per_turn_s = {r["variant"]: r["step_s"] for r in results}
    for r in results:
        ref = "per_turn" + ("+ckpt" if r["variant"].endswith("+ckpt") else "")
        r["time_vs_per_turn"] = r["step_s"] / per_turn_s[ref]
    gap = max(abs(v - sums["per_turn"]) / max(abs(sums["per_turn"]), 1.0) for v in sums.values())
    emit(
        {
            "check": "train_step",
            "device": device,
            "dtype": dtype,
            "policy": "mem1",
            "turns": 8,
            "trajectories": s.step_trajectories,
            "flat_len": batch.input_ids.shape[1],
            "flat_tokens": int(batch.seq_lens.sum()),
            "per_turn_tokens": per_turn_tokens,
            "generated_tokens": int(batch.loss_mask.sum()),
            "variants": results,
            "summed_logp_rel_gap": gap,
            "ok": gap <= (1e-4 if dtype == "float32" else 2e-2),
        }
    )


def ppo(device: str, s: Sizes, out: Path, emit: Callable[[dict], None]) -> None:
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


TEXT_STOP_SCRIPTS = (
    # context, then what the model is taught to write: past the closing tag, so only a stop
    # ends the turn there (the expected action and its text follow)
    (
        "Question 1: Who wrote it?\n",
        "<IS> Start. </IS><query> Kalo Vesh </query>\nQuestion 2: and",
        "query",
        "Kalo Vesh",
    ),
    (
        "Question 1: In what year?\n",
        "<IS> Q1: 1874. </IS><answer> 1874</answer>.\nQuestion 2: more",
        "answer",
        "1874",
    ),
)


def hub_standin(world_texts: list[str], vocab: int):
    """A pretrained tokenizer's stand-in: byte-level BPE, Qwen2.5's pre-tokenizer, trained on
    world text plus lines that use the tags as web text does (the tags stay several tokens)."""
    from mem1_core.models.tokenizer import train_byte_level_tokenizer

    lines = [s for _, s, _, _ in TEXT_STOP_SCRIPTS] * 20
    lines += [f"<IS> Q1: {i}. </IS><answer> {i}</answer>.\n" for i in range(1800, 1830)]
    return train_byte_level_tokenizer(world_texts + lines, vocab)


def text_stops(device: str, s: Sizes, emit: Callable[[dict], None]) -> None:
    from mem1_core.config import load_config
    from mem1_core.data.prompts import TAGS
    from mem1_core.data.world import generate_world
    from mem1_core.models.model import build_tiny_model
    from mem1_core.models.tags import tag_scheme, turn_text
    from mem1_core.rollout.env import QAEnvironment
    from mem1_core.rollout.generation import HFBackend, SamplingParams, StopStrings

    world = generate_world(load_config("smoke").world)
    tok = hub_standin(world.corpus["contents"].to_pylist(), 800)
    env = QAEnvironment(tok, retriever=None, topk=1)  # parse only: nothing is searched here
    cfg = ModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128
    )
    model = build_tiny_model(cfg, tok).to(device)
    enc = [
        (tok.encode(c, add_special_tokens=False), tok.encode(w, add_special_tokens=False))
        for c, w, _, _ in TEXT_STOP_SCRIPTS
    ]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(400):  # recite each script after its context
        ctx, script = enc[step % len(enc)]
        logits = model(input_ids=torch.tensor([ctx + script], device=device)).logits
        target = torch.tensor(script, device=device)
        loss = torch.nn.functional.cross_entropy(logits[0, len(ctx) - 1 : -1].float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    stop = StopStrings(tok, env.stop_strings)
    cuts = [stop.index(script) for _, script in enc]
    params = SamplingParams(48, env.stop_ids, 0.0, stop_strings=env.stop_strings)
    contexts = [ctx for ctx, _ in enc]
    hf = HFBackend(model, tok.pad_token_id, tok.eos_token_id, tokenizer=tok)
    free = hf.generate(contexts, SamplingParams(48, (), 0.0))
    got = hf.generate(contexts, params)
    rows = []
    for (_, script), n, g, f, (_, _, action, said) in zip(
        enc, cuts, got, free, TEXT_STOP_SCRIPTS, strict=True
    ):
        parsed = env.parse(g.ids, g.finish)
        closer = env.codec.find(g.ids)[-1] if env.codec.find(g.ids) else None
        rows.append(
            {
                "recites_past_the_tag": f.ids[: len(script)] == script,
                "closing_tag_tokens": None if closer is None else closer.last - closer.first + 1,
                "ends_at_stop": g.ids == script[:n] and g.finish == "stop",
                "tail_after_tag": turn_text(tok, g.ids).rsplit(">", 1)[-1],
                "parsed": [parsed.action.value, parsed.text],
                "ok": g.ids == script[:n]
                and g.finish == "stop"
                and (parsed.action.value, parsed.text) == (action, said),
            }
        )
    # the per-token stop check's cost: random contexts, nothing stops them
    rng = random.Random(5)
    batch = [[rng.randrange(len(tok) - 1) for _ in range(64)] for _ in range(s.stop_rows)]
    timing = {}
    for name, p in (
        ("ids_only", SamplingParams(s.stop_tokens, (), 1.0)),
        ("stop_strings", SamplingParams(s.stop_tokens, (), 1.0, stop_strings=env.stop_strings)),
    ):
        best = math.inf
        for r in range(2):
            sync(device)
            t0 = time.perf_counter()
            hf.generate(batch, p, torch.Generator(device=device).manual_seed(r))
            sync(device)
            best = min(best, time.perf_counter() - t0)
        timing[name] = best
    emit(
        {
            "check": "text_stops",
            "backend": "hf",
            "tag_scheme": tag_scheme(tok),
            "tags_in_vocab": [t for t in TAGS if t in tok.get_vocab()],
            "scripts": rows,
            "generate_seconds": timing,
            "stop_check_overhead": timing["stop_strings"] / timing["ids_only"] - 1.0,
            "ok": tag_scheme(tok) == "text" and all(r["ok"] for r in rows),
        }
    )
    try:
        import vllm  # noqa: F401

        from mem1_core.rollout.generation_vllm import VLLMBackend
    except ImportError as e:
        emit({"check": "text_stops_vllm", "skipped": f"vLLM is not available: {e}"})
        return
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        config = Path(tmp) / "tokenizer_config.json"  # as on the hub: the model family's class
        config.write_text(
            json.dumps({**json.loads(config.read_text()), "tokenizer_class": "Qwen2Tokenizer"})
        )
        engine = VLLMBackend.from_pretrained_dir(
            tmp,
            eos_id=tok.eos_token_id,
            tokenizer=tok,
            dtype="float32",
            max_model_len=512,
            enforce_eager=True,
            gpu_memory_utilization=0.2,
        )
        v = engine.generate(contexts, params)
        both = [
            {
                "ids_equal_hf": a.ids == b.ids,
                "finish": a.finish,
                "parsed": [
                    env.parse(a.ids, a.finish).action.value,
                    env.parse(a.ids, a.finish).text,
                ],
                "max_abs_dlogp": max(
                    (abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=False)), default=0.0
                ),
            }
            for a, b in zip(v, got, strict=True)
        ]
        emit(
            {
                "check": "text_stops_vllm",
                "vllm": vllm.__version__,
                "scripts": both,
                "ok": all(r["ids_equal_hf"] and r["finish"] == "stop" for r in both),
            }
        )
        del engine


def vllm_agreement(device: str, s: Sizes, emit: Callable[[dict], None]) -> None:
    try:
        import vllm  # noqa: F401

        from mem1_core.rollout.generation_vllm import VLLMBackend
    except ImportError as e:
        emit({"check": "vllm", "skipped": f"vLLM or its backend is not available: {e}"})
        return
    from mem1_core.rollout.generation import HFBackend, SamplingParams

    cfg = ModelConfig(
        hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=768
    )
    dtype = "bfloat16" if device == "cuda" else "float32"
    model = qwen2(cfg, s.vocab, "sdpa", dtype, device)
    with torch.no_grad():  # peaky next-token distributions: greedy is not decided by rounding
        model.get_input_embeddings().weight.mul_(10.0)
    rng = random.Random(3)
    contexts = [[rng.randrange(s.vocab - 2) for _ in range(rng.randint(8, 160))] for _ in range(32)]
    params = SamplingParams(max_new_tokens=48, stop_ids=(), temperature=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        engine = VLLMBackend.from_pretrained_dir(
            tmp, dtype=dtype, max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.2
        )
        hf = HFBackend(model, pad_id=s.vocab - 1, eos_id=None, max_batch=32)
        for stage in ("initial", "after_weight_sync"):
            if stage == "after_weight_sync":  # other weights, sent the way the learner sends them
                other = qwen2(cfg, s.vocab, "sdpa", dtype, device, seed=1)
                with torch.no_grad():
                    other.get_input_embeddings().weight.mul_(10.0)
                model.load_state_dict(other.state_dict())
                engine.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
            a, b = hf.generate(contexts, params), engine.generate(contexts, params)
            prefix, gaps = [], [0.0]
            for x, y in zip(a, b, strict=True):
                n = next(
                    (i for i, (u, v) in enumerate(zip(x.ids, y.ids, strict=False)) if u != v),
                    min(len(x.ids), len(y.ids)),
                )
                prefix.append(n / max(len(x.ids), 1))
                gaps += [abs(u - v) for u, v in zip(x.logprobs[:n], y.logprobs[:n], strict=True)]
            agree = sum(p == 1.0 for p in prefix) / len(prefix)
            emit(
                {
                    "check": "vllm",
                    "stage": stage,
                    "dtype": dtype,
                    "sequences": len(contexts),
                    "identical_fraction": agree,
                    "mean_agreeing_prefix": sum(prefix) / len(prefix),
                    "max_abs_dlogp_agreeing": max(gaps),
                    "ok": sum(prefix) / len(prefix) >= 0.9,
                }
            )
        del engine


DEPLOYMENT_DRIVER = """
import json, sys
from mem1_core.config import load_config
from mem1_core.training.train_rl import train_rl
from mem1_core.training.vllm_engine import vllm_importable

if vllm_importable():
    sys.exit("this Python imports vLLM: not the Prefect venv's")
out, overrides = sys.argv[1], json.loads(sys.argv[2])
result = train_rl(load_config("smoke", None, overrides), out, use_ray=True, show=False)
print("RESULT", json.dumps({"iterations": result["iterations"]}))
"""


def prefect_python(given: str | None) -> Path:
    """The Prefect venv's Python: --prefect-python, else $MEM1_VENV/bin/python, else ./.venv."""
    if given:
        return Path(given)
    root = Path(__file__).resolve().parents[1]
    return Path(os.environ.get("MEM1_VENV") or root / ".venv") / "bin" / "python"


def vllm_deployment(
    device: str, s: Sizes, out: Path, emit: Callable[[dict], None], python: str | None
) -> None:
    from mem1_core.training.rollout_python import vllm_python

    if device != "cuda":
        emit({"check": "vllm_deployment", "skipped": "CUDA only (the CPU path: ./dev test-vllm)"})
        return
    driver, workers = prefect_python(python), vllm_python(None)
    if not driver.is_file() or workers is None:
        missing = (
            f"no Prefect venv Python at {driver}"
            if not driver.is_file()
            else ("no vLLM venv (./dev setup-vllm, or $MEM1_VLLM_PYTHON)")
        )
        emit({"check": "vllm_deployment", "skipped": missing})
        return
    run = out / "vllm_deployment_run"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    over = [
        "ppo.minutes=30",
        "ppo.checkpoint_every=100",
        "data.max_eval_tasks=4",
        *s.ppo_overrides,
        "rollout.backend=vllm",
        "rollout.gpu_memory_utilization=0.3",  # beside the learner on the same GPU
    ]
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root), "WANDB_MODE": "offline"}
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(driver), "-c", DEPLOYMENT_DRIVER, str(run), json.dumps(over)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the driver failed: {(done.stdout + done.stderr)[-1500:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    per_it = [
        {
            "iteration": r["iteration"],
            "rollout_tokens_per_s": r["gen_tokens"] / max(r["rollout_seconds"], 1e-9),
            "logp_mismatch_max": r["train/logp_mismatch_max"],
            "logp_mismatch_max_per_turn": {
                k.rsplit("/", 1)[-1]: v
                for k, v in r.items()
                if k.startswith("train/logp_mismatch_max/turn_")
            },
        }
        for r in rows
    ]
    last = rows[-1]
    steady = per_it[1:] or per_it  # the first iteration compiles and captures CUDA graphs
    emit(
        {
            "check": "vllm_deployment",
            "driver_python": str(driver),
            "rollout_backend": last.get("rollout_backend"),
            "vllm_version": last.get("vllm_version"),
            "rollout_python": last.get("rollout_python"),
            "wall_s": wall,
            "rollout_tokens_per_s": sum(r["rollout_tokens_per_s"] for r in steady) / len(steady),
            "per_iteration": per_it,
            # bf16 engine vs bf16 learner: not the fp32 ~1e-6 of the CPU test; a stale engine
            # (no weight sync) would be far off after the first update.
            "ok": len(rows) == len(per_it) > 0
            and all(r.get("rollout_backend") == "vllm" and r.get("vllm_version") for r in rows)
            and last.get("rollout_python") == workers,
        }
    )


# ---- driver ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--quick", action="store_true", help="smallest sizes (the CPU smoke test)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    p.add_argument(
        "--prefect-python",
        default=None,
        help="vllm_deployment: the Prefect venv's python (default $MEM1_VENV or ./.venv)",
    )
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --quick for the CPU smoke", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    # fp32 means fp32: TF32 matmuls would blur the exactness check.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("WANDB_MODE", "offline")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sizes = sizes_for(args.device, args.quick)
    rows: list[dict] = []
    sink = (out / "gpu_check.jsonl").open("w")

    def emit(row: dict) -> None:
        rows.append(row)
        line = json.dumps(row, sort_keys=True)
        print(line, flush=True)
        sink.write(line + "\n")
        sink.flush()

    emit(
        {
            "check": "setup",
            "device": args.device,
            "quick": args.quick,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            "sizes": asdict(sizes),
        }
    )
    sections = {
        "exactness": lambda: exactness(args.device, sizes, emit),
        "train_step": lambda: train_step(args.device, sizes, emit),
        "ppo": lambda: ppo(args.device, sizes, out, emit),
        "text_stops": lambda: text_stops(args.device, sizes, emit),
        "vllm": lambda: vllm_agreement(args.device, sizes, emit),
        "vllm_deployment": lambda: vllm_deployment(
            args.device, sizes, out, emit, args.prefect_python
        ),
    }
    for name in SECTIONS:
        if name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            sections[name]()
        except Exception as e:  # report and go on: one device session should yield all rows
            emit(
                {
                    "check": name,
                    "error": f"{type(e).__name__}: {e}",
                    "ok": False,
                    "traceback": traceback.format_exc()[-2000:],
                }
            )
        emit({"check": f"{name}_done", "seconds": time.perf_counter() - t0})
        gc.collect()  # the next section (Ray actors, the vLLM engine) wants the GPU memory
        if args.device == "cuda":
            torch.cuda.empty_cache()
    sink.close()
    failed = [r["check"] for r in rows if r.get("ok") is False]
    print(json.dumps({"check": "summary", "failed": failed, "ok": not failed}), flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
