"""exactness: the tree contract with FlexAttention. A small Qwen2-architecture model built
from config, MEM1 and full-context trajectories in one padded batch; per-token log-probs of
generated tokens over the flattened tree with FlexAttention (BlockMask) and with the dense
boolean mask (sdpa), both against the definition (each turn re-run alone), and the
gradients of their summed log-probs (max relative difference), in float32 and bfloat16.
CPU: FlexAttention forward only (no CPU backward)."""

from __future__ import annotations

import time

import torch

from benchmarks.gpu.base import Check, qwen2, same_weights, synthetic
from mem1_core.trajectory.logprobs import forward_tree, per_turn_logprobs, tree_attention_mask
from mem1_core.trajectory.tree import FlatBatch, collate, flatten


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


EXACT_TOL = {
    # max |dlogp| vs the definition; max relative gradient difference flex vs dense.
    "float32": (1e-4, 1e-3),
    # bf16: both paths round; flex must be as close to the fp32 definition as dense is.
    "bfloat16": (None, 5e-2),
}


def run(c: Check) -> None:
    device, s, emit = c.device, c.sizes, c.emit
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
