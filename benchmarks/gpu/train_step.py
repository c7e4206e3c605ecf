"""train_step: one training step (forward + backward of the generated tokens' log-probs) of
a MEM1 batch at T = 8 turns over the flattened tree (flex, sdpa) vs re-running every turn
(length-sorted micro-batches of as many rows): best time and peak CUDA memory
(torch.cuda.max_memory_allocated), with and without activation checkpointing."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from benchmarks.common import Paths
from benchmarks.gpu.base import Check, qwen2, same_weights, sync, synthetic
from mem1_core.models.model import enable_gradient_checkpointing
from mem1_core.trajectory.logprobs import forward_tree
from mem1_core.trajectory.tree import FlatBatch, collate, flatten


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


def run(c: Check) -> None:
    device, s, emit = c.device, c.sizes, c.emit
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
            "memory": "mem1",
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
