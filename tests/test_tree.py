"""The flattened tree against brute-force definitions built from the turn paths alone."""

from __future__ import annotations

import random

import pytest
import torch

from mem1_core.trajectory.masks import block_mask, dense_mask, tree_mask_mod
from mem1_core.trajectory.shared_prefix import (
    _cut_sorted,
    shared_prefix_masks,
    split_shared_prefix,
)
from mem1_core.trajectory.tree import IGNORE, FlatTree, Segment, collate, flatten

PROMPT = ("prompt",)


def seg(key, ids, generated=False) -> Segment:
    return Segment(key=key, ids=tuple(ids), generated=generated)


def policy_paths(policy: str, p, gens, infos, k: int = 2) -> list[list[Segment]]:
    """Turn paths of the rollout's memory policies (the lead's spec):
    mem1: [P, G_{t-1}, I_{t-1}, G_t*]; full: [P, G0, I0, ..., G_t*]; truncate: last k turns."""
    paths = []
    for t in range(len(gens)):
        first = {"mem1": t - 1, "full": 0, "truncate": t - k}[policy]
        ctx = [seg(PROMPT, p)]
        for s in range(max(first, 0), t):
            ctx += [seg(("gen", s), gens[s]), seg(("info", s), infos[s])]
        paths.append(ctx + [seg(("gen", t), gens[t], True)])
    return paths


def random_traj(rng: random.Random, policy: str, turns: int, vocab: int = 300):
    def ids(lo, hi):
        return [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]

    p = ids(5, 12)
    gens = [ids(2, 7) for _ in range(turns)]
    infos = [ids(3, 9) for _ in range(turns)]
    return policy_paths(policy, p, gens, infos)


def token_labels(tree: FlatTree) -> list[tuple]:
    """(key path, offset in segment) of each flat token: its identity across turns."""
    first: dict[int, int] = {}
    for i, v in enumerate(tree.node_ids.tolist()):
        first.setdefault(v, i)
    return [(tree.node_keys[v], i - first[v]) for i, v in enumerate(tree.node_ids.tolist())]


def turn_sequences(paths) -> list[list[tuple]]:
    """Each turn's full sequence as labels, straight from the paths."""
    out = []
    for path in paths:
        labels, keys = [], ()
        for s in path:
            keys = keys + (s.key,)
            labels += [(keys, j) for j in range(len(s.ids))]
        out.append(labels)
    return out


CASES = [("mem1", 5), ("full", 4), ("truncate", 6), ("mem1", 1)]


@pytest.mark.parametrize("policy,turns", CASES)
def test_flat_tree_matches_brute_force(policy: str, turns: int) -> None:
    paths = random_traj(random.Random(turns), policy, turns)
    tree = flatten(paths)
    labels = token_labels(tree)
    seqs = turn_sequences(paths)
    ids_of = {lab: i for path, sq in zip(paths, seqs, strict=True) for lab, i in
              zip(sq, [i for s in path for i in s.ids], strict=True)}  # fmt: skip
    # Every distinct (key path, offset) appears exactly once, with its ids.
    assert sorted(labels) == sorted(ids_of)
    assert tree.input_ids.tolist() == [ids_of[lab] for lab in labels]
    index_in = [{lab: j for j, lab in enumerate(sq)} for sq in seqs]
    n = tree.num_tokens
    mask = dense_mask(collate([tree], pad_id=0))[0, 0]
    for i in range(n):
        holders = [ix for ix in index_in if labels[i] in ix]
        # Position = index in every turn sequence that holds the token.
        assert {ix[labels[i]] for ix in holders} == {tree.position_ids[i].item()}
        # Predecessor = the label just before it in its own context.
        pos = tree.position_ids[i].item()
        prev = tree.prev_index[i].item()
        if pos == 0:
            assert prev == IGNORE
        else:
            k = next(k for k, ix in enumerate(index_in) if labels[i] in ix)
            assert labels[prev] == seqs[k][pos - 1]
        for j in range(n):
            # i may see j iff some turn's context holds both with j not after i.
            want = any(labels[j] in ix and ix[labels[j]] <= ix[labels[i]] for ix in holders)
            assert mask[i, j].item() == want, (i, j)


@pytest.mark.parametrize("policy,turns", CASES)
def test_loss_mask_and_generated_index(policy: str, turns: int) -> None:
    paths = random_traj(random.Random(7 + turns), policy, turns)
    tree = flatten(paths)
    gen = tree.loss_mask.nonzero().squeeze(-1).tolist()
    pairs = [(tree.gen_turn[i].item(), tree.gen_offset[i].item()) for i in gen]
    # Each generated token of each turn exactly once, and nothing else has loss.
    assert sorted(pairs) == [(t, o) for t, p in enumerate(paths) for o in range(len(p[-1].ids))]
    for i, (t, o) in zip(gen, pairs, strict=True):
        assert tree.input_ids[i].item() == paths[t][-1].ids[o]
    assert (tree.gen_turn[~tree.loss_mask] == IGNORE).all()
    assert (tree.gen_offset[~tree.loss_mask] == IGNORE).all()
    # Generation order along the row (GAE runs over generated tokens in row order).
    assert pairs == sorted(pairs)


def test_generation_order_kept_where_dfs_would_break_it() -> None:
    # Turn 2 returns under node B of turn 0: a DFS pre-order would put G2 before G1.
    a, b, c = seg("A", [1, 2]), seg("B", [3]), seg("C", [4, 5])
    paths = [
        [a, b, seg(("gen", 0), [6], True)],
        [a, c, seg(("gen", 1), [7, 8], True)],
        [a, b, seg(("gen", 2), [9], True)],
    ]
    tree = flatten(paths)
    gen_turns = tree.gen_turn[tree.loss_mask].tolist()
    assert gen_turns == [0, 1, 1, 2]
    assert tree.input_ids[tree.loss_mask].tolist() == [6, 7, 8, 9]
    # The generated token of turn 2 follows node B (flat index 2) in its own context.
    i2 = tree.input_ids.tolist().index(9)
    assert tree.prev_index[i2].item() == 2 and tree.position_ids[i2].item() == 3


def test_empty_segment_passes_its_parents_end_on() -> None:
    paths = [[seg(PROMPT, [1, 2]), seg("empty", []), seg(("gen", 0), [5, 6], True)]]
    tree = flatten(paths)
    assert tree.input_ids.tolist() == [1, 2, 5, 6]
    assert tree.prev_index.tolist() == [-1, 0, 1, 2]
    assert tree.position_ids.tolist() == [0, 1, 2, 3]


def test_mem1_positions_bounded_as_turns_grow() -> None:
    def max_pos(turns: int) -> int:
        p, gens, infos = [1] * 20, [[2] * 6] * turns, [[3] * 9] * turns
        return int(flatten(policy_paths("mem1", p, gens, infos)).position_ids.max())

    assert max_pos(16) == max_pos(4) == 20 + 6 + 9 + 6 - 1
    # whereas a full-context agent's positions grow with the turns
    full = flatten(policy_paths("full", [1] * 20, [[2] * 6] * 16, [[3] * 9] * 16))
    assert int(full.position_ids.max()) == 20 + 16 * 6 + 15 * 9 - 1


def test_full_context_is_one_chain() -> None:
    paths = random_traj(random.Random(3), "full", 5)
    tree = flatten(paths)
    last = [i for s in paths[-1] for i in s.ids]
    assert tree.input_ids.tolist() == last  # the last turn's sequence holds every token
    assert tree.position_ids.tolist() == list(range(len(last)))
    assert tree.prev_index.tolist() == [-1, *range(len(last) - 1)]
    mask = dense_mask(collate([tree], pad_id=0))[0, 0]
    assert torch.equal(mask, torch.ones(len(last), len(last), dtype=torch.bool).tril())
    # Re-read generations are the generated nodes themselves: loss on all of them.
    assert tree.loss_mask.sum().item() == sum(len(p[-1].ids) for p in paths)


def test_collate_padding_and_float_mask() -> None:
    rng = random.Random(11)
    trees = [flatten(random_traj(rng, pol, t)) for pol, t in [("mem1", 3), ("full", 4), ("truncate", 2)]]  # fmt: skip
    batch = collate(trees, pad_id=299, pad_to_multiple=16)
    length = batch.input_ids.shape[1]
    assert length % 16 == 0 and length >= max(t.num_tokens for t in trees)
    mask = dense_mask(batch)
    assert mask.shape == (3, 1, length, length)
    assert mask.any(-1).all()  # no empty row anywhere (padding sees itself)
    for r, t in enumerate(trees):
        n = t.num_tokens
        single = dense_mask(collate([t], pad_id=0))[0, 0]
        assert torch.equal(mask[r, 0, :n, :n], single)
        assert not mask[r, 0, :n, n:].any()  # real tokens never see padding
        assert not batch.loss_mask[r, n:].any()
        assert (batch.prev_index[r, n:] == IGNORE).all()
        assert (batch.input_ids[r, n:] == 299).all()
    fmask = dense_mask(batch, torch.float32)
    assert torch.equal(fmask == 0, mask)
    assert (fmask[~mask] == torch.finfo(torch.float32).min).all()


def test_block_mask_agrees_with_dense_mask() -> None:
    rng = random.Random(5)
    trees = [flatten(random_traj(rng, pol, t)) for pol, t in [("mem1", 6), ("truncate", 5)]]
    batch = collate(trees, pad_id=0)
    b, length = batch.input_ids.shape
    mod = tree_mask_mod(batch)
    bi = torch.arange(b)[:, None, None]
    qi, ki = torch.arange(length)[None, :, None], torch.arange(length)[None, None, :]
    dense = dense_mask(batch)[:, 0]
    assert torch.equal(mod(bi, 0, qi, ki), dense)
    bm = block_mask(batch, block_size=16)
    assert bm.shape == (b, 1, length, length)
    # Every block holding an allowed pair is kept (skipping it would drop attention).
    nb = -(-length // 16)
    padded = torch.zeros(b, nb * 16, nb * 16, dtype=torch.bool)
    padded[:, :length, :length] = dense
    needed = padded.view(b, nb, 16, nb, 16).any(4).any(2)
    kept = bm.to_dense()[:, 0].bool()
    assert not (needed & ~kept).any()
    assert (kept & ~needed).sum() == 0  # and no block without one


def test_invalid_paths_are_rejected() -> None:
    p = seg(PROMPT, [1, 2])
    with pytest.raises(ValueError, match="exactly one generated"):
        flatten([[p, seg("x", [3])]])
    with pytest.raises(ValueError, match="exactly one generated"):
        flatten([[seg("g", [3], True), seg("h", [4], True)]])
    with pytest.raises(ValueError, match="keys must identify content"):
        flatten([[p, seg("g0", [3], True)], [seg(PROMPT, [9]), seg("g1", [4], True)]])
    with pytest.raises(ValueError, match="already exists"):
        flatten([[p, seg("g", [3], True)], [p, seg("g", [3], True)]])


# ---- shared-prefix split (the two-stage forward of logprobs.tree_hidden) -------------------


def extra_paths(kind: str, rng: random.Random, turns: int):
    """Trees no memory policy makes: `branchy` returns under an earlier note (a branch's
    tokens are not contiguous in the row); `forest` has no shared root (empty trunk)."""

    def ids(lo, hi):
        return [rng.randrange(300) for _ in range(rng.randint(lo, hi))]

    notes = [seg("X", ids(3, 6)), seg("Y", ids(3, 6))]
    head = [seg(PROMPT, ids(5, 9))] if kind == "branchy" else []
    return [[*head, notes[t % 2], seg(("gen", t), ids(2, 5), True)] for t in range(turns)]


def split_batch(pad_to_multiple: int = 8):
    rng = random.Random(13)
    paths = [random_traj(rng, pol, t) for pol, t in [*CASES, ("truncate", 2)]]
    paths += [extra_paths("branchy", rng, 5), extra_paths("forest", rng, 3)]
    paths.append([[seg(PROMPT, [1, 2]), seg("empty", []), seg(("gen", 0), [3], True)]])
    return collate([flatten(p) for p in paths], pad_id=0, pad_to_multiple=pad_to_multiple)


@pytest.mark.parametrize("call_tokens", [0, 64, 10**6])
def test_shared_prefix_split_reproduces_the_tree_mask(call_tokens: int) -> None:
    batch = split_batch()
    b, length = batch.input_ids.shape
    split = split_shared_prefix(batch, call_tokens=call_tokens)
    masks = shared_prefix_masks(batch, split)
    dense = dense_mask(batch)[:, 0]
    p, lens = split.trunk_width, split.trunk_lens.tolist()
    seq_lens = batch.seq_lens.tolist()
    # The trunk is a prefix chain: plain causal, positions = offsets.
    for r, n in enumerate(lens):
        assert torch.equal(dense[r, :n, :n], torch.ones(n, n, dtype=torch.bool).tril())
        assert batch.position_ids[r, :n].tolist() == list(range(n))
    assert lens[-2] == 0  # the forest: no shared root, every root's subtree is a branch
    assert lens[1] == seq_lens[1] > 0  # a full-context chain is all trunk
    # Every real token is computed exactly once: in its trunk or in one branch-row slot.
    seen = {r * length + i: ("trunk", r * p + i) for r, n in enumerate(lens) for i in range(n)}
    offset = b * p
    for g, (index, row_batch) in enumerate(zip(split.rows, split.row_batch, strict=True)):
        widths = index.shape[1]
        mask = masks[g][:, 0]
        assert mask.shape == (index.shape[0], widths, p + widths)
        for row, traj in enumerate(row_batch.tolist()):
            slots = index[row].tolist()
            real = [f for f in slots if f >= 0]
            # Real slots first, then padding. Slot order need not be flat order (two
            # branches of `branchy` interleave in the row); the mask checks below catch
            # any order that would break causality within a branch.
            assert slots[: len(real)] == real
            for s, f in enumerate(slots):
                if f < 0:
                    assert mask[row, s, p + s]  # padding sees itself: no empty softmax row
                    continue
                assert f not in seen and f // length == traj
                seen[f] = ("row", offset + row * widths + s)
                i = f % length
                # Trunk keys: the trajectory's real trunk, all of it (every branch token
                # descends from the trunk's end), never the trunk stage's padding.
                want = torch.arange(p) < lens[traj]
                assert torch.equal(mask[row, s, :p], want) and dense[traj, i, : lens[traj]].all()
                # Row keys: exactly the tree mask; nothing the tree mask allows is elsewhere.
                cols = torch.tensor([x % length if x >= 0 else 0 for x in slots])
                assert torch.equal(mask[row, s, p:], dense[traj, i, cols] & index[row].ge(0))
                assert int(mask[row, s].sum()) == int(dense[traj, i].sum())
        offset += index.numel()
    assert set(seen) == {r * length + i for r, n in enumerate(seq_lens) for i in range(n)}
    for f, (_, at) in seen.items():
        assert split.home.view(-1)[f].item() == at
    # Groups are length-sorted, each padded only to its own longest row.
    for index in split.rows:
        assert int(index.ge(0).sum(1).max()) == index.shape[1]
    if call_tokens >= 10**6:
        assert len(split.rows) == 1
    # The float form is the additive equivalent (0 allowed, finfo.min blocked).
    for fm, bm in zip(shared_prefix_masks(batch, split, torch.float32), masks, strict=True):
        assert torch.equal(fm == 0, bm) and (fm[~bm] == torch.finfo(torch.float32).min).all()


def test_cut_sorted_is_the_cheapest_contiguous_grouping() -> None:
    import itertools

    def cost(lengths: list[int], call: int, ends: list[int]) -> int:
        starts = [0, *ends[:-1]]
        return sum((e - s) * lengths[s] + call for s, e in zip(starts, ends, strict=True))

    rng = random.Random(2)
    for _ in range(30):
        lengths = sorted((rng.randint(1, 40) for _ in range(rng.randint(1, 7))), reverse=True)
        call, n = rng.choice([0, 5, 30]), len(lengths)
        best = min(
            cost(lengths, call, [*cuts, n])
            for k in range(n)
            for cuts in itertools.combinations(range(1, n), k)
        )
        ends = _cut_sorted(lengths, call)
        assert ends[-1] == n and cost(lengths, call, ends) == best
