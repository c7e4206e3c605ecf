"""The masked trajectory: the turn contexts of a trajectory as one flattened prefix tree.

docs/design.md §4.2. Turn t of a trajectory ran on a context C_t (a list of id segments) and
generated G_t. All turn paths `C_t + [G_t]` go into one prefix tree whose nodes are
segments, identified by the tuple of segment keys from the root: shared prefixes (the task
prompt; for a full-context agent the whole history) appear once, a segment re-read at a
new place (MEM1's carried `<IS>`/`<query>`) is a new node. The tree is flattened into one
sequence in which

- a token attends to every token of its ancestor nodes and causally within its own node,
- its position id is its depth (offset from the root): the position it had when the
  rollout computed it,
- its log-prob is read from the logits at `prev_index`, the token before it *in its own
  context* (a node's first token follows its parent's last token, which may be far back),

so one forward pass over the flattened tree gives every generated token the log-prob the
rollout computed (checked in tests/test_logprobs.py against re-running each turn alone).

Departures from the reference code (docs/design.md §6): masks are booleans or BlockMasks, never
1.0/0.0 floats; the previous `<IS>` stays visible to the next turn; positions are depths,
so for MEM1 they stay bounded however many turns there are.

Running it (mem1_core.trajectory.logprobs): one pass over the flattened rows with the (L, L) tree mask
(mem1_core.trajectory.masks), or, by default under sdpa/eager, the shared-prefix plan
(mem1_core.trajectory.shared_prefix): the trunk runs once and each branch in a short row of
its own over the trunk's cached keys/values.

Order guarantee: nodes are laid out in creation order (turn by turn, root to leaf). That is
a topological order (a parent precedes its children), and equals DFS pre-order with
children in insertion order whenever every new node hangs off the latest path, as it does
for the `mem1`, `full` and `truncate` policies. Unlike DFS it keeps, for any tree, the
generated tokens of a trajectory in generation order (turn, then offset) along the row;
the advantage code relies on this (GAE runs over generated tokens in row order).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import torch
from torch import Tensor

IGNORE = -1  # prev_index / gen_turn / gen_offset where there is none


class SegmentLike(Protocol):
    """Anything with a key, token ids and a generated flag (e.g. the rollout's segments)."""

    @property
    def key(self) -> Hashable: ...
    @property
    def ids(self) -> Sequence[int]: ...
    @property
    def generated(self) -> bool: ...


@dataclass(frozen=True)
class Segment:
    """One id segment of a turn's path."""

    key: Hashable
    """Identity: same key under the same ancestor keys => same tree node (and same ids)."""
    ids: tuple[int, ...]
    """Token ids as the rollout produced them; never re-tokenised (docs/design.md §4.1)."""
    generated: bool
    """True only on the segment the policy generated in this turn (the last one)."""


@dataclass(frozen=True)
class FlatTree:
    """One trajectory's prefix tree, flattened. n tokens, N nodes, T turns."""

    input_ids: Tensor
    """(n,) long token ids."""
    position_ids: Tensor
    """(n,) long depth of each token = its position in its turn's context."""
    node_ids: Tensor
    """(n,) long node of each token; nodes are numbered in creation order."""
    prev_index: Tensor
    """(n,) long flat index of the token before it in its own context; IGNORE at a root's start."""
    loss_mask: Tensor
    """(n,) bool True only on tokens the policy generated."""
    gen_turn: Tensor
    """(n,) long turn that generated the token; IGNORE elsewhere."""
    gen_offset: Tensor
    """(n,) long offset of the token in that turn's generated segment; IGNORE elsewhere."""
    ancestors: Tensor
    """(N, N) bool, ancestors[i, j]: node j is node i or one of its ancestors."""
    turn_nodes: Tensor
    """(T,) long node holding each turn's generated segment."""
    node_keys: tuple[tuple[Hashable, ...], ...]
    """Key path from the root of each node (for debugging and tests)."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_turns(self) -> int:
        return int(self.turn_nodes.numel())


@dataclass(frozen=True)
class FlatBatch:
    """Flattened trees of B trajectories, right-padded to length L.

    Padding tokens belong to an extra node `pad_node` (= N - 1) that is its own sole
    ancestor, so a padding token sees only earlier padding: no attention row is empty (an
    empty row gives NaN under a -inf mask) and no real token ever sees padding.
    """

    input_ids: Tensor
    """(B, L) long."""
    position_ids: Tensor
    """(B, L) long depth; 0 on padding."""
    node_ids: Tensor
    """(B, L) long; pad_node on padding."""
    prev_index: Tensor
    """(B, L) long row index of the predicting token; IGNORE at roots and on padding."""
    loss_mask: Tensor
    """(B, L) bool True only on generated tokens."""
    gen_turn: Tensor
    """(B, L) long; with the row index and gen_offset maps a generated token to (traj, turn, offset)."""
    gen_offset: Tensor
    """(B, L) long."""
    ancestors: Tensor
    """(B, N, N) bool ancestor-or-self table; node N - 1 is the padding node."""
    seq_lens: Tensor
    """(B,) long number of real tokens per row."""
    num_turns: Tensor
    """(B,) long number of turns per row."""

    @property
    def pad_node(self) -> int:
        return self.ancestors.shape[-1] - 1

    def to(self, device: torch.device | str) -> FlatBatch:
        return FlatBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def flatten(paths: Sequence[Sequence[SegmentLike]]) -> FlatTree:
    """Build and flatten the prefix tree of one trajectory's turn paths.

    paths[t] is turn t's context segments followed by exactly one generated segment (last).
    A generated segment must create a new node (its first occurrence defines the node as
    generated, with loss on it); later paths may pass through it (full context).
    """
    parents: list[int] = []
    node_ids_: list[tuple[int, ...]] = []
    generated: list[bool] = []
    created_turn: list[int] = []
    keys: list[tuple[Hashable, ...]] = []
    children: dict[tuple[int, Hashable], int] = {}  # (parent or -1, key) -> node
    turn_nodes: list[int] = []
    for t, path in enumerate(paths):
        if not path or not path[-1].generated or any(s.generated for s in path[:-1]):
            raise ValueError(
                f"turn {t}: a path must end with exactly one generated segment "
                f"(got generated flags {[s.generated for s in path]})"
            )
        parent = -1
        for seg in path:
            ids = tuple(int(i) for i in seg.ids)
            node = children.get((parent, seg.key))
            if node is None:
                node = len(parents)
                children[(parent, seg.key)] = node
                parents.append(parent)
                node_ids_.append(ids)
                generated.append(seg.generated)
                created_turn.append(t)
                keys.append((keys[parent] if parent >= 0 else ()) + (seg.key,))
            elif node_ids_[node] != ids:
                raise ValueError(
                    f"turn {t}: segment {seg.key!r} differs from the segment with the same key "
                    f"path {keys[node]!r}; keys must identify content (use a fresh key)"
                )
            elif seg.generated:
                raise ValueError(
                    f"turn {t}: generated segment {seg.key!r} already exists as node "
                    f"{keys[node]!r}; give each turn's generation its own key, e.g. ('gen', t)"
                )
            parent = node
        turn_nodes.append(parent)
    return _layout(parents, node_ids_, generated, created_turn, keys, turn_nodes)


def _layout(
    parents: list[int],
    seg_ids: list[tuple[int, ...]],
    generated: list[bool],
    created_turn: list[int],
    keys: list[tuple[Hashable, ...]],
    turn_nodes: list[int],
) -> FlatTree:
    """Lay nodes out in creation order (parents precede children) and index their tokens."""
    n_nodes = len(parents)
    depth = [0] * n_nodes  # position of the node's first token
    last = [IGNORE] * n_nodes  # flat index of the last token of the node's context prefix
    ancestors = torch.zeros(n_nodes, n_nodes, dtype=torch.bool)
    ids, pos, node_of, prev, turn, offset = [], [], [], [], [], []
    for v in range(n_nodes):
        p = parents[v]
        if p >= 0:
            depth[v] = depth[p] + len(seg_ids[p])
            ancestors[v] = ancestors[p]
        ancestors[v, v] = True
        before = last[p] if p >= 0 else IGNORE
        start, k = len(ids), len(seg_ids[v])
        ids.extend(seg_ids[v])
        pos.extend(range(depth[v], depth[v] + k))
        node_of.extend([v] * k)
        prev.extend([before, *range(start, start + k - 1)][:k])
        turn.extend([created_turn[v] if generated[v] else IGNORE] * k)
        offset.extend(range(k) if generated[v] else [IGNORE] * k)
        last[v] = start + k - 1 if k else before  # an empty node passes its parent's end on
    gen_turn = torch.tensor(turn, dtype=torch.long)
    return FlatTree(
        input_ids=torch.tensor(ids, dtype=torch.long),
        position_ids=torch.tensor(pos, dtype=torch.long),
        node_ids=torch.tensor(node_of, dtype=torch.long),
        prev_index=torch.tensor(prev, dtype=torch.long),
        loss_mask=gen_turn >= 0,
        gen_turn=gen_turn,
        gen_offset=torch.tensor(offset, dtype=torch.long),
        ancestors=ancestors,
        turn_nodes=torch.tensor(turn_nodes, dtype=torch.long),
        node_keys=tuple(keys),
    )


def collate(trees: Sequence[FlatTree], pad_id: int, pad_to_multiple: int = 1) -> FlatBatch:
    """Right-pad flattened trees into a batch; L is rounded up to `pad_to_multiple`."""
    if not trees:
        raise ValueError("collate needs at least one tree")
    b = len(trees)
    length = max(t.num_tokens for t in trees)
    length = -(-max(length, 1) // pad_to_multiple) * pad_to_multiple
    pad_node = max(t.ancestors.shape[0] for t in trees)

    def filled(value: int, dtype: torch.dtype = torch.long) -> Tensor:
        return torch.full((b, length), value, dtype=dtype)

    input_ids, position_ids, prev_index = filled(pad_id), filled(0), filled(IGNORE)
    node_ids, gen_turn, gen_offset = filled(pad_node), filled(IGNORE), filled(IGNORE)
    loss_mask = filled(False, torch.bool)
    ancestors = torch.zeros(b, pad_node + 1, pad_node + 1, dtype=torch.bool)
    ancestors[:, pad_node, pad_node] = True
    for r, t in enumerate(trees):
        n, nn = t.num_tokens, t.ancestors.shape[0]
        input_ids[r, :n] = t.input_ids
        position_ids[r, :n] = t.position_ids
        prev_index[r, :n] = t.prev_index
        node_ids[r, :n] = t.node_ids
        gen_turn[r, :n] = t.gen_turn
        gen_offset[r, :n] = t.gen_offset
        loss_mask[r, :n] = t.loss_mask
        ancestors[r, :nn, :nn] = t.ancestors
    return FlatBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        node_ids=node_ids,
        prev_index=prev_index,
        loss_mask=loss_mask,
        gen_turn=gen_turn,
        gen_offset=gen_offset,
        ancestors=ancestors,
        seq_lens=torch.tensor([t.num_tokens for t in trees], dtype=torch.long),
        num_turns=torch.tensor([t.num_turns for t in trees], dtype=torch.long),
    )
