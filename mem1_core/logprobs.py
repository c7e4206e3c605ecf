"""Per-token log-probs over a flattened tree of turn contexts, in one forward pass.

DESIGN §4.2–4.3. `forward_tree` runs a causal LM once over a `FlatBatch` with the tree's
mask (a boolean mask for `sdpa`, a 0/finfo.min additive float mask for `eager`, a
`BlockMask` for `flex_attention`), its depth position ids, and reads each token's log-prob
from the hidden state of the token before it in its own context (`prev_index`), which in
a tree is not always the flat neighbour. `per_turn_logprobs` is the definition it must
match: re-run each turn's real context alone.

Hugging Face passes a 4D mask (tensor or BlockMask) through to the attention function
unchanged, so the tree mask reaches every layer as built here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mem1_core.tree import FlatBatch, SegmentLike, block_mask, dense_mask


class Attn(StrEnum):
    """Attention implementations the tree forward supports (Hugging Face names)."""

    SDPA = "sdpa"
    EAGER = "eager"
    FLEX = "flex_attention"


@dataclass(frozen=True)
class TreeOutput:
    """What one forward pass over a FlatBatch gives the trainer."""

    logprobs: Tensor
    """(B, L) float32 log-prob of each token given its context; 0 where no predecessor."""
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
) -> tuple[Tensor, Tensor | None]:
    """Log-prob (and entropy) of each token from its predecessor's hidden state.
    hidden: (B, L, H), input_ids, prev_index: (B, L) -> logprobs, entropy: (B, L) float32."""
    has_prev = prev_index >= 0
    index = prev_index.clamp(min=0)[..., None].expand(-1, -1, hidden.shape[-1])
    logits = lm_head(hidden.gather(1, index)).float() / temperature  # (B, L, V)
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[..., None]).squeeze(-1)
    logp = torch.where(has_prev, logp, torch.zeros_like(logp))
    entropy = None
    if with_entropy:
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        entropy = torch.where(has_prev, entropy, torch.zeros_like(entropy))
    return logp, entropy


def forward_tree(
    model: nn.Module,
    batch: FlatBatch,
    attn: Attn | str | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    mask: object | None = None,
) -> TreeOutput:
    """One forward pass of a causal LM over a flattened tree. batch: (B, L) -> TreeOutput.

    attn: implementation to use (None: the model's own); a different one is switched on
    the model in place. mask: a prebuilt `tree_attention_mask(batch, attn, dtype)` to reuse
    across PPO epochs. temperature: the rollout's sampling temperature, so log-probs are
    those of the distribution that was sampled.
    """
    attn = use_attention(model, attn)
    if mask is None:
        mask = tree_attention_mask(batch, attn, next(model.parameters()).dtype)
    with _static_flex_shapes(attn, batch.input_ids.device):
        hidden = (
            model.get_decoder()(
                input_ids=batch.input_ids,
                attention_mask=mask,
                position_ids=batch.position_ids,
                use_cache=False,
            )
        ).last_hidden_state
    logp, entropy = logprobs_from_hidden(
        hidden,
        model.get_output_embeddings(),
        batch.input_ids,
        batch.prev_index,
        temperature,
        with_entropy,
    )
    return TreeOutput(logprobs=logp, entropy=entropy, hidden=hidden)


def token_logprobs(
    model: nn.Module,
    batch: FlatBatch,
    attn: Attn | str | None = None,
    *,
    temperature: float = 1.0,
) -> Tensor:
    """Log-prob of every token of a flattened tree. batch: (B, L) -> (B, L) float32."""
    return forward_tree(model, batch, attn, temperature=temperature).logprobs


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
