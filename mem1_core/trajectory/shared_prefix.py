"""The shared-prefix execution plan of a flattened tree batch (docs/design.md §4.2).

The trunk of a tree (the chain every turn shares: MEM1's task prompt, a full-context agent's
whole history) runs once and each branch (MEM1: one per turn) runs in a short row of its own
over the trunk's cached keys/values (mem1_core.trajectory.logprobs). The layout callers see
(FlatBatch: one row per trajectory) is the same either way; the split is an execution plan,
mapped back to it by `SharedPrefix.home`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mem1_core.trajectory.masks import as_mask
from mem1_core.trajectory.tree import IGNORE, FlatBatch


@dataclass(frozen=True)
class SharedPrefix:
    """A FlatBatch split for a two-stage forward: the trunks, then the branch rows, in
    groups of rows of similar length (see `split_shared_prefix`). P trunk width; group g
    has R_g rows of Q_g tokens."""

    trunk_lens: Tensor
    """(B,) long real trunk tokens of each row: they are the row's first trunk_lens[b]."""
    rows: tuple[Tensor, ...]
    """Per group, (R_g, Q_g) long flat index (b * L + i) of the batch token in each slot;
    IGNORE on padding (at the end). A row holds whole branches, each in flat order (a
    parent's tokens before its children's), so causality along the row holds."""
    row_batch: tuple[Tensor, ...]
    """Per group, (R_g,) long batch row (trajectory) of each branch row: whose trunk it reads."""
    home: Tensor
    """(B, L) long where each token is computed: an index into the trunk stage's B * P
    outputs followed by each group's R_g * Q_g outputs, in order; 0 on padding."""

    @property
    def trunk_width(self) -> int:
        return int(self.trunk_lens.max()) if self.trunk_lens.numel() else 0

    def to(self, device: torch.device | str) -> SharedPrefix:
        return SharedPrefix(
            trunk_lens=self.trunk_lens.to(device),
            rows=tuple(x.to(device) for x in self.rows),
            row_batch=tuple(x.to(device) for x in self.row_batch),
            home=self.home.to(device),
        )


def split_shared_prefix(batch: FlatBatch, call_tokens: int = 64) -> SharedPrefix:
    """Split each tree into its trunk and the branches hanging off the trunk's end.

    The trunk is the chain from the root while each node has exactly one child: the task
    prompt for MEM1 and truncate (a star of turn branches), the whole tree for a full-context
    agent (a chain). Every other token descends from the trunk's last node, so it sees all
    of the trunk and, of the rest, only its own branch (the subtree of one child of that
    node). Run the trunk once and let every branch read its cached keys/values: attention
    costs P^2 + sum_b |b| (P + |b|) instead of the one-row (P + sum_b |b|)^2, and no token
    is computed twice (packing the prompt into several rows would recompute it).

    Branches of one trajectory are packed, in creation order, into rows of at most the
    longest branch's length; rows are sorted by length and cut into groups (one forward
    each, padded to its longest row) so as to minimise the padded tokens plus
    `call_tokens` for each forward (its fixed cost, in tokens: measured ~50-100 for the
    tiny profile on CPU; larger for a deep model on a GPU).

    Trunk nodes are the first nodes created (a branch node made before a later trunk node
    would be that trunk node's descendant), so the trunk is a prefix of the row. A forest
    (several roots) has an empty trunk and each root's subtree is a branch.
    """
    b, length = batch.node_ids.shape
    pad = batch.pad_node
    anc = batch.ancestors[:, :pad, :pad].cpu()
    node_ids, seq_lens = batch.node_ids.cpu(), batch.seq_lens.cpu()
    depth = anc.sum(-1)  # (B, N) nodes on the path root..v; 0 for nodes a row lacks
    # is_parent[b, v, u]: u is v's parent.
    is_parent = anc & (depth[:, None, :] == depth[:, :, None] - 1)
    trunk_lens: list[int] = []
    units: list[list[Tensor]] = []  # per batch row, per branch: its flat token indices
    for r in range(b):
        kids: dict[int, list[int]] = {}
        for v, u in is_parent[r].nonzero().tolist():
            kids.setdefault(u, []).append(v)
        roots = (depth[r] == 1).nonzero().squeeze(1).tolist()
        trunk: list[int] = []
        heads = roots
        if len(roots) == 1:
            trunk.append(roots[0])
            while len(kids.get(trunk[-1], ())) == 1:
                trunk.append(kids[trunk[-1]][0])
            heads = kids.get(trunk[-1], [])
        nodes = node_ids[r, : int(seq_lens[r])]
        in_trunk = torch.zeros(pad + 1, dtype=torch.bool)
        in_trunk[trunk] = True
        n_trunk = int(in_trunk[nodes].long().cumprod(0).sum())
        if in_trunk[nodes[n_trunk:]].any():  # impossible for trees built by `flatten`
            raise ValueError(f"row {r}: a trunk token after a branch token")
        trunk_lens.append(n_trunk)
        # Branch of each token: the index in `heads` of its node's ancestor among them.
        if heads:
            head_of = anc[r][:, heads].to(torch.int8).argmax(1)[nodes[n_trunk:]]
            order = torch.sort(head_of, stable=True)
            flat = order.indices + (r * length + n_trunk)
            units.append(list(flat.split(torch.bincount(head_of, minlength=len(heads)).tolist())))
        else:
            units.append([])
    cap = max((len(u) for row in units for u in row), default=0)
    rows: list[tuple[int, Tensor]] = []  # (batch row, flat token indices)
    for r, row_units in enumerate(units):
        current: list[Tensor] = []
        for u in row_units:
            if len(u) and current and sum(map(len, current)) + len(u) > cap:
                rows.append((r, torch.cat(current)))
                current = []
            if len(u):
                current.append(u)
        if current:
            rows.append((r, torch.cat(current)))
    rows.sort(key=lambda row: -len(row[1]))
    p = max(trunk_lens, default=0)
    home = torch.zeros(b * length, dtype=torch.long)
    for r, n_trunk in enumerate(trunk_lens):
        home[r * length : r * length + n_trunk] = torch.arange(r * p, r * p + n_trunk)
    groups, batches, offset, start = [], [], b * p, 0
    for end in _cut_sorted([len(toks) for _, toks in rows], call_tokens):
        index = torch.full((end - start, len(rows[start][1])), IGNORE, dtype=torch.long)
        for i, (_, toks) in enumerate(rows[start:end]):
            index[i, : len(toks)] = toks
        real = index >= 0
        home[index[real]] = offset + torch.arange(index.numel()).view_as(index)[real]
        groups.append(index)
        batches.append(torch.tensor([r for r, _ in rows[start:end]], dtype=torch.long))
        offset, start = offset + index.numel(), end
    return SharedPrefix(
        trunk_lens=torch.tensor(trunk_lens, dtype=torch.long),
        rows=tuple(groups),
        row_batch=tuple(batches),
        home=home.view(b, length),
    ).to(batch.node_ids.device)


def _cut_sorted(lengths: list[int], call_tokens: int) -> list[int]:
    """Cut lengths sorted in decreasing order into groups, each padded to its first length,
    minimising padded tokens + call_tokens per group (exact, O(R^2)). -> end of each group."""
    best = [0] + [0] * len(lengths)  # best[j]: cost of the first j rows
    cut = [0] * (len(lengths) + 1)
    for j in range(1, len(lengths) + 1):
        best[j], cut[j] = min((best[i] + (j - i) * lengths[i] + call_tokens, i) for i in range(j))
    ends, j = [], len(lengths)
    while j:
        ends.append(j)
        j = cut[j]
    return ends[::-1]


def shared_prefix_masks(
    batch: FlatBatch, split: SharedPrefix, dtype: torch.dtype = torch.bool
) -> tuple[Tensor, ...]:
    """Attention of each group's branch rows over [trunk keys | row keys]. -> per group
    (R_g, 1, Q_g, P + Q_g), bool or additive float as in `dense_mask`. A branch token sees
    its trajectory's real trunk tokens and, in its row, its ancestors' tokens causally;
    padding sees the trunk and itself."""
    n, p = batch.ancestors.shape[-1], split.trunk_width
    flat_nodes = batch.node_ids.reshape(-1)
    masks = []
    for index, row_batch in zip(split.rows, split.row_batch, strict=True):
        r, q = index.shape
        nodes = torch.where(index >= 0, flat_nodes[index.clamp(min=0)], batch.pad_node)
        anc = batch.ancestors[row_batch]  # (R, N, N)
        visible = anc.gather(1, nodes[:, :, None].expand(r, q, n)).gather(
            2, nodes[:, None, :].expand(r, q, q)
        )
        causal = torch.ones(q, q, dtype=torch.bool, device=visible.device).tril_()
        trunk = torch.arange(p, device=visible.device)
        trunk = trunk[None, None, :] < split.trunk_lens[row_batch][:, None, None]  # (R, 1, P)
        # Written in place part by part: the trunk part is a broadcast of one row per row.
        mask = torch.empty(r, 1, q, p + q, dtype=dtype, device=visible.device)
        mask[:, 0, :, :p] = as_mask(trunk, dtype)
        mask[:, 0, :, p:] = as_mask(visible & causal, dtype)
        masks.append(mask)
    return tuple(masks)
