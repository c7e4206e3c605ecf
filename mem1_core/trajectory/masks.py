"""Attention masks of a flattened tree batch: booleans or BlockMasks, never 1.0/0.0 floats
(docs/design.md §4.3, §6). A token may attend to the tokens of its ancestor nodes and,
causally, to those of its own node."""

from __future__ import annotations

import torch
from torch import Tensor

from mem1_core.trajectory.tree import FlatBatch


def as_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    if dtype == torch.bool:
        return allowed
    # 0 (as -0.0) where allowed, finfo.min elsewhere; measured ~2x faster on CPU than
    # zeros().masked_fill_(~allowed, min) for the (R, 1, Q, P + Q) branch masks.
    return (~allowed).to(dtype).mul_(torch.finfo(dtype).min)


def dense_mask(batch: FlatBatch, dtype: torch.dtype = torch.bool) -> Tensor:
    """Tree attention mask. -> (B, 1, L, L): bool (True = may attend) for sdpa, or for a
    float dtype an additive mask, 0 where allowed and finfo(dtype).min elsewhere (eager:
    Hugging Face adds a float mask to the scores, so a 1/0 mask would block nothing, docs/design.md §6)."""
    b, length = batch.node_ids.shape
    # Row of the ancestor table for each query token, then the column of each key token.
    rows = batch.ancestors.gather(
        1, batch.node_ids[:, :, None].expand(b, length, batch.ancestors.shape[-1])
    )  # (B, L, N)
    visible = rows.gather(2, batch.node_ids[:, None, :].expand(b, length, length))
    causal = torch.ones(length, length, dtype=torch.bool, device=visible.device).tril_()
    return as_mask((visible & causal)[:, None], dtype)


def tree_mask_mod(batch: FlatBatch):
    """FlexAttention mask_mod of the tree: (b, h, q, kv) -> may q attend to kv."""
    node_ids, ancestors = batch.node_ids, batch.ancestors

    def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (kv <= q) & ancestors[b, node_ids[b, q], node_ids[b, kv]]

    return mask_mod


def block_mask(batch: FlatBatch, block_size: int = 128):
    """FlexAttention BlockMask of the tree, shape (B, 1, L, L); blocks outside every
    ancestor relation are skipped entirely, which is where the tree beats a dense mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, length = batch.node_ids.shape
    return create_block_mask(
        tree_mask_mod(batch),
        B=b,
        H=None,
        Q_LEN=length,
        KV_LEN=length,
        device=batch.node_ids.device,
        BLOCK_SIZE=block_size,
    )
