"""Per-token log-probs over a flattened tree of turn contexts, in one forward pass.

docs/design.md §4.2–4.3. `forward_tree` runs a causal LM once over a `FlatBatch` with the tree's
mask (a boolean mask for `sdpa`, a 0/finfo.min additive float mask for `eager`, a
`BlockMask` for `flex_attention`), its depth position ids, and reads each token's log-prob
from the hidden state of the token before it in its own context (`prev_index`), which in
a tree is not always the flat neighbour. `per_turn_logprobs` is the definition it must
match: re-run each turn's real context alone.

Hugging Face passes a 4D mask (tensor or BlockMask) through to the attention function
unchanged, so the tree mask reaches every layer as built here.

Two ways to run the tree (`tree_hidden`), both exact:
- one pass over the flattened rows with the (B, 1, L, L) tree mask (dense for sdpa/eager,
  a BlockMask for flex, which skips the blocks no ancestor relation touches);
- shared prefix, the default for sdpa/eager: the trunk (MEM1's task prompt; a full-context
  agent's whole chain) runs once with a plain causal mask, and its cached keys/values are
  read by each branch (MEM1: one per turn), run as short rows of their own. A dense
  (L, L) mask over a star pays attention for every pair of turns that cannot see each
  other: at 8 MEM1 turns ~90% of its entries are False, and on CPU the one-row pass was
  no faster than re-running each turn (`mem1 bench trajectory` measures it). The shared prefix keeps the tree's token
  saving (every token computed once) without that quadratic waste.

Log-probs (and the vocabulary projection) are computed only where asked, by default on the
generated tokens (`loss_mask`): the trainer reads nothing else, and the (L, V) logits are
the largest activation of a real vocabulary (152k for Qwen2.5). Even those are taken a chunk
of rows at a time (`vocab_logprobs`), checkpointed under autograd, so no pass holds (n, V)
logits for all n generated tokens at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from mem1_core.trajectory.masks import block_mask, dense_mask
from mem1_core.trajectory.shared_prefix import (
    SharedPrefix,
    shared_prefix_masks,
    split_shared_prefix,
)
from mem1_core.trajectory.tree import FlatBatch, SegmentLike


class Attn(StrEnum):
    """Attention implementations the tree forward supports (Hugging Face names)."""

    SDPA = "sdpa"
    EAGER = "eager"
    FLEX = "flex_attention"


@dataclass(frozen=True)
class TreeOutput:
    """What one forward pass over a FlatBatch gives the trainer."""

    logprobs: Tensor
    """(B, L) float32 log-prob of each token given its context, at the positions asked for
    (default: generated tokens); 0 elsewhere and where a token has no predecessor."""
    entropy: Tensor | None
    """(B, L) float32 entropy of the distribution that predicted each token; 0 likewise."""
    hidden: Tensor
    """(B, L, H) last hidden state at each token (input of a value head)."""


def tree_attention_mask(batch: FlatBatch, attn: Attn | str, dtype: torch.dtype):
    """The mask form each implementation needs: bool for sdpa, additive float for eager
    (eager adds a bool mask as +1/+0, silently masking nothing), BlockMask for flex (a 4D
    tensor mask under flex on CPU crashes the process)."""
    attn = Attn(attn)
    if attn is Attn.SDPA:
        return dense_mask(batch, torch.bool)
    if attn is Attn.EAGER:
        return dense_mask(batch, dtype)
    return block_mask(batch)


@dataclass(frozen=True)
class PrefixPlan:
    """A prebuilt shared-prefix forward of one FlatBatch (reusable like a mask)."""

    split: SharedPrefix
    branch_masks: tuple[Tensor, ...]
    """Per group of branch rows, its (R_g, 1, Q_g, P + Q_g) mask over [trunk | row] keys."""


def shared_prefix_plan(
    batch: FlatBatch, attn: Attn | str, dtype: torch.dtype, call_tokens: int = 64
) -> PrefixPlan:
    """Trunk/branch split (`call_tokens`: see `split_shared_prefix`) and branch masks. sdpa
    gets an additive float mask, like eager: torch's sdpa converts a boolean mask to one on
    every call (an aten::where per layer in the CPU profile), and the prebuilt float mask
    measured as fast or faster; 0 / finfo.min is additive, not the 1/0 trap of docs/design.md §6."""
    if Attn(attn) is Attn.FLEX:
        raise ValueError("the shared-prefix forward runs under sdpa or eager; flex uses one pass")
    split = split_shared_prefix(batch, call_tokens)
    return PrefixPlan(split, shared_prefix_masks(batch, split, dtype))


def mask_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of an additive mask for `model`'s attention: the autocast dtype where
    autocast is on, else the weights'. sdpa casts a mask of another dtype to the query's in
    every layer, and autograd then keeps each layer's (rows, 1, Q, K) copy for the backward;
    one in the compute dtype is passed through, and all layers keep the same one. (On CPU the
    backward keeps no (Q, K) matrix per head: torch's flash kernel saves the log-sum-exp.)"""
    param = next(model.parameters())
    if torch.is_autocast_enabled(param.device.type):
        return torch.get_autocast_dtype(param.device.type)
    return param.dtype


def use_attention(model: nn.Module, attn: Attn | str | None) -> Attn:
    """Return the model's attention implementation, switching it in place if `attn` differs."""
    current = model.config._attn_implementation
    if attn is None:
        return Attn(current)
    attn = Attn(attn)
    if current != attn.value:
        model.set_attn_implementation(attn.value)
    return attn


def _static_flex_shapes(attn: Attn, device: torch.device) -> contextlib.AbstractContextManager:
    """torch 2.13's inductor CPU template for flex attention fails to compile once shapes
    go dynamic ("'cur_qSplitSize8' was not declared"), which automatic dynamic shapes do at
    the second sequence length: on CPU compile each length statically instead (bucket
    lengths with `collate(pad_to_multiple=...)` to bound recompiles)."""
    if attn is Attn.FLEX and device.type == "cpu":
        return torch._dynamo.config.patch(automatic_dynamic_shapes=False)
    return contextlib.nullcontext()


def logprobs_from_hidden(
    hidden: Tensor,
    lm_head: nn.Module,
    input_ids: Tensor,
    prev_index: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    positions: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob (and entropy) of each token from its predecessor's hidden state, computed
    only at `positions` (bool, default: every token with a predecessor); 0 elsewhere.
    hidden: (B, L, H), input_ids, prev_index, positions: (B, L) -> logprobs, entropy: (B, L)."""
    at = prev_index >= 0 if positions is None else positions & (prev_index >= 0)
    rows, cols = at.nonzero(as_tuple=True)
    # Only the n asked-for rows go through the vocabulary projection: (n, V), not (B, L, V),
    # and that in chunks (vocab_logprobs).
    logp, entropy = vocab_logprobs(
        take_rows(hidden.flatten(0, 1), rows * hidden.shape[1] + prev_index[rows, cols]),
        input_ids[rows, cols],
        lm_head,
        temperature,
        with_entropy,
    )
    zeros = torch.zeros(at.shape, dtype=torch.float32, device=hidden.device)
    return (
        zeros.index_put((rows, cols), logp),
        None if entropy is None else zeros.index_put((rows, cols), entropy),
    )


VOCAB_CHUNK_ELEMENTS = 1 << 25
"""The most logits `vocab_logprobs` holds at once: chunks of rows x V within this (32M, 128 MB
in float32; 682 rows of SmolLM2's 49,152-token vocabulary, 220 of Qwen2.5's 152k). More rows
pay a second projection in the backward and per chunk a cast of the head's weights (~1.7x the
head's time, docs/performance.md); a `smol` MEM1 micro-batch (~400 generated) is one chunk."""


def vocab_chunk_rows(vocab_size: int) -> int:
    """Rows of one chunk of `vocab_logprobs` over a vocabulary of `vocab_size`."""
    return max(1, VOCAB_CHUNK_ELEMENTS // vocab_size)


def vocab_logprobs(
    h: Tensor,
    targets: Tensor,
    lm_head: nn.Module,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob of each target under log_softmax(lm_head(h) / temperature), and that
    distribution's entropy. h: (n, H), targets: (n,) -> logp, entropy (or None): (n,) float32.

    The logits are taken `vocab_chunk_rows` rows at a time, so a vocabulary-sized (n, V) is
    never held for every token at once (verl's chunked entropy, Liger's chunked loss). Under
    autograd each chunk is checkpointed: its forward keeps only its (rows, H) input, and the
    backward recomputes its logits one chunk at a time (one more vocabulary projection of
    the generated tokens: ~2HV FLOPs each). Values and gradients are the unchunked ones."""
    weight = lm_head.weight
    chunk = vocab_chunk_rows(getattr(lm_head, "out_features", None) or weight.shape[0])
    one = partial(_vocab_chunk, lm_head=lm_head, temperature=temperature, entropy=with_entropy)
    if h.shape[0] <= chunk:
        outs = [one(h, targets)]
    elif torch.is_grad_enabled():
        outs = [
            checkpoint(one, hc, tc, use_reentrant=False)
            for hc, tc in zip(h.split(chunk), targets.split(chunk), strict=True)
        ]
    else:
        outs = [one(hc, tc) for hc, tc in zip(h.split(chunk), targets.split(chunk), strict=True)]
    logp = torch.cat([o[0] for o in outs])
    return logp, torch.cat([o[1] for o in outs]) if with_entropy else None


def _vocab_chunk(
    h: Tensor, targets: Tensor, *, lm_head: nn.Module, temperature: float, entropy: bool
) -> tuple[Tensor, ...]:
    logits = lm_head(h)
    if temperature != 1.0:
        logits = logits.float() / temperature
    # In float32 whatever the logits' dtype: the cast fused into the softmax, one pass over
    # (rows, V) fewer each way (the same numbers as casting first).
    logp_all = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    logp = logp_all.gather(-1, targets[:, None])[:, 0]
    return (logp, entropy_of(logp_all)) if entropy else (logp,)


def entropy_of(logp: Tensor) -> Tensor:
    """Entropy of a distribution given as log-probs. logp: (..., V) -> (...).

    Safe with -inf log-probs (banned tokens): 0 * log 0 is taken as 0 in value and gradient
    (a double where: p * where(p > 0, logp, 0) keeps -inf out of both passes)."""
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, 0)).sum(-1)


def tree_hidden(
    decoder: nn.Module,
    batch: FlatBatch,
    attn: Attn | str | None = None,
    *,
    mask: object | None = None,
) -> Tensor:
    """Last hidden state of every token of a flattened tree. batch: (B, L) -> (B, L, H).

    decoder: the transformer without its LM head (`model.get_decoder()`, a critic's
    backbone). mask: a prebuilt `shared_prefix_plan` (two stages) or `tree_attention_mask`
    (one pass); None builds the shared-prefix plan under sdpa/eager, and the one-pass mask
    under flex or while gradient checkpointing is active (it drops the KV cache the two
    stages share). Hidden states on padding are arbitrary (finite)."""
    attn = use_attention(decoder, attn)
    checkpointing = _drops_cache(decoder)
    if mask is None:
        dtype = mask_dtype(decoder)
        if attn is Attn.FLEX or checkpointing:
            mask = tree_attention_mask(batch, attn, dtype)
        else:
            mask = shared_prefix_plan(batch, attn, dtype)
    if isinstance(mask, PrefixPlan):
        if checkpointing:
            raise ValueError(
                "the shared-prefix forward hands the trunk's KV cache to the branches, and "
                "gradient checkpointing drops the cache: pass mask=None or a "
                "tree_attention_mask (one pass) while checkpointing"
            )
        return _shared_prefix_hidden(decoder, batch, mask)
    with _static_flex_shapes(attn, batch.input_ids.device):
        return decoder(
            input_ids=batch.input_ids,
            attention_mask=mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state


def _drops_cache(decoder: nn.Module) -> bool:
    """Whether a forward now would run checkpointed layers, which Hugging Face runs without
    the KV cache (a replay in backward would write it twice)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return torch.is_grad_enabled() and any(
        isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing and m.training
        for m in decoder.modules()
    )


def take_rows(x: Tensor, index: Tensor) -> Tensor:
    """`x[index]` for a long `index` of any shape into x's first dimension, taken with
    `index_select` so that its backward is deterministic. x: (N, ...) -> (*index.shape, ...).

    The backward of `x[index]` is `index_put_(..., accumulate=True)`, which on CPU (float32,
    more than one thread, 32768 elements or more) adds the rows with float atomics from every
    thread: where `index` repeats a row (a trunk's keys/values read by several branch rows,
    padding homed on one slot) the sum's order, and so its last bits, change from run to run,
    and a learner update with two threads was not reproducible. `index_select`'s backward,
    `index_add_`, adds a repeated row's gradients in index order on CPU."""
    return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])


def _shared_prefix_hidden(decoder: nn.Module, batch: FlatBatch, plan: PrefixPlan) -> Tensor:
    """Trunk stage, then each group of branch rows over the trunk's cached keys/values
    (shared_prefix.SharedPrefix). Gradients flow through the cache into the trunk, as in one pass."""
    split = plan.split
    b, length = batch.input_ids.shape
    p = split.trunk_width
    flat_ids, flat_pos = batch.input_ids.reshape(-1), batch.position_ids.reshape(-1)
    outs, trunk_kv = [], None
    if p:
        # The first P columns of every row: its trunk, then (rows with a shorter trunk)
        # branch tokens or padding that only later slots see (causal) and the branch masks
        # hide; their outputs are dropped. Positions 0..P-1 are the trunk's depths.
        positions = torch.arange(p, device=batch.input_ids.device).expand(b, p)
        out = decoder(
            input_ids=batch.input_ids[:, :p], position_ids=positions, use_cache=bool(split.rows)
        )
        outs.append(out.last_hidden_state.reshape(b * p, -1))
        if out.cache is not None:
            trunk_kv = [(layer.keys, layer.values) for layer in out.cache.layers]
            if any(k is None or k.shape[-2] != p for k, _ in trunk_kv):  # never silently
                raise RuntimeError("the trunk pass left no KV cache for the branches")
    for index, row_batch, mask in zip(split.rows, split.row_batch, plan.branch_masks, strict=True):
        cache = None
        if trunk_kv is not None:
            kv = [(take_rows(k, row_batch), take_rows(v, row_batch)) for k, v in trunk_kv]
            cache = DynamicCache(ddp_cache_data=kv, config=decoder.config)
        real, at = index >= 0, index.clamp(min=0)
        hidden = decoder(
            input_ids=flat_ids[at],
            position_ids=torch.where(real, flat_pos[at], 0),
            attention_mask=mask,
            cache=cache,
            use_cache=cache is not None,
        ).last_hidden_state
        outs.append(hidden.reshape(index.numel(), -1))
    return take_rows(torch.cat(outs), split.home)


def forward_tree(
    model: nn.Module,
    batch: FlatBatch,
    attn: Attn | str | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    mask: object | None = None,
    positions: Tensor | None = None,
) -> TreeOutput:
    """One forward of a causal LM over a flattened tree. batch: (B, L) -> TreeOutput.

    attn: implementation to use (None: the model's own); a different one is switched on
    the model in place. mask: a prebuilt `shared_prefix_plan(batch, attn, dtype)` or
    `tree_attention_mask(batch, attn, dtype)` to reuse across PPO epochs (see
    `tree_hidden`). temperature: the rollout's sampling temperature, so log-probs are
    those of the distribution that was sampled. positions: (B, L) bool tokens whose
    log-prob (and entropy) to compute, default `batch.loss_mask` (what the trainer reads).
    """
    attn = use_attention(model, attn)
    hidden = tree_hidden(model.get_decoder(), batch, attn, mask=mask)
    logp, entropy = logprobs_from_hidden(
        hidden,
        model.get_output_embeddings(),
        batch.input_ids,
        batch.prev_index,
        temperature,
        with_entropy,
        batch.loss_mask if positions is None else positions,
    )
    return TreeOutput(logprobs=logp, entropy=entropy, hidden=hidden)


def token_logprobs(
    model: nn.Module,
    batch: FlatBatch,
    attn: Attn | str | None = None,
    *,
    temperature: float = 1.0,
) -> Tensor:
    """Log-prob of every token of a flattened tree (context tokens too; the trainer needs
    only `forward_tree`'s generated ones). batch: (B, L) -> (B, L) float32."""
    every = batch.prev_index >= 0
    return forward_tree(model, batch, attn, temperature=temperature, positions=every).logprobs


FP32_PER_LAYER = 1.5e-6
BF16_PER_LAYER = 0.015


def logprob_tolerance(num_layers: int, autocast: str | None = None) -> float:
    """How far two exact computations of one generated token's log-prob (the flattened tree,
    re-running the turn alone, the rollout's KV-cached decoding) may differ: float rounding,
    which sums over the layers, so the bound grows with depth.

    Measured (max |delta log-prob| over every generated token): float32, 2 layers (the tiny
    models of the tests) below 1e-5; float32, SmolLM2's 30 layers, 1.4-2.5e-5 for sdpa and
    eager (docs/performance.md, "SmolLM2 on the CPU"). Under bf16 autocast (8-bit mantissa)
    the same 30 layers give 0.13-0.24: -> 5e-6 + 1.5e-6 per layer in float32 (5e-5 at 30),
    0.015 per layer under bf16 (0.45 at 30). A structural error (a token seeing a wrong context) is of order 1 or more."""
    if autocast is None:
        return 5e-6 + FP32_PER_LAYER * num_layers
    return BF16_PER_LAYER * num_layers


@torch.no_grad()
def per_turn_logprobs(
    model: nn.Module,
    paths: Sequence[Sequence[SegmentLike]],
    *,
    temperature: float = 1.0,
) -> list[Tensor]:
    """The definition: re-run each turn's context + generation alone (batch 1, positions
    0..n-1, plain causal) and return, per turn, the (len(G_t),) log-probs of its
    generated tokens; a token with no predecessor gets 0. Slow, obviously right."""
    device = next(model.parameters()).device
    out = []
    for path in paths:
        context = [i for seg in path[:-1] for i in seg.ids]
        gen = list(path[-1].ids)
        ids = torch.tensor([context + gen], dtype=torch.long, device=device)
        if not gen:
            out.append(torch.zeros(0, device=device))
            continue
        logits = model(input_ids=ids, use_cache=False).logits[0].float() / temperature
        logp_all = F.log_softmax(logits, dim=-1)
        c = len(context)
        targets = ids[0, max(c, 1) :]
        logp = logp_all[max(c, 1) - 1 : -1].gather(-1, targets[:, None]).squeeze(-1)
        if c == 0:  # the first generated token of an empty context has no predecessor
            logp = torch.cat([logp.new_zeros(1), logp])
        out.append(logp)
    return out
