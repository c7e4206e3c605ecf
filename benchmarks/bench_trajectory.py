"""Benchmark: the flattened tree of turn contexts vs re-running every turn separately.

For each (memory policy, number of turns) it builds a batch of synthetic trajectories with
realistic segment lengths (the tiny profile at 2 objectives: prompt ~250 tokens, generated
turn ~40, info block ~120), runs a tiny Qwen2 model over the tree and compares with the
per-turn definition (`per_turn_logprobs`) and with a per-turn batched baseline. The tree
runs three ways (logprobs.tree_hidden): `flat` is what training runs, `forward_tree` with
no prebuilt mask, i.e. the shared-prefix forward under sdpa with its plan built inside the
timed call; `dense` is one pass with the prebuilt (B, 1, L, L) boolean mask; `flex` one pass
with a BlockMask where FlexAttention runs.

Baseline (the fair one): every turn's context + generation as its own sequence, as a
trainer without the tree would do; all turns of all trajectories sorted by length and cut
into micro-batches of as many rows as the tree batch has, right-padded, so neither side
pays much padding. Both sides project to the vocabulary only the hidden states that
predict a generated token (what a trainer needs), so neither pays for (L, V) logits.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.common import MEMORY_WINDOWS, Paths
from benchmarks.common import synthetic_trajectories as common_trajectories
from mem1_core.trajectory.logprobs import (
    forward_tree,
    per_turn_logprobs,
    shared_prefix_plan,
    tree_attention_mask,
)
from mem1_core.trajectory.tree import FlatBatch, collate, flatten

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class TrajectoryBenchConfig:
    """What to measure and on which synthetic trajectories and model."""

    turns: tuple[int, ...] = (2, 4, 8, 16)
    """Numbers of turns T to measure."""
    memories: tuple[str, ...] = ("mem1", "full")
    """Memory policies (keys of benchmarks.common.MEMORY_WINDOWS)."""
    trajectories: int = 4
    """Trajectories per batch B (also the rows per micro-batch of the per-turn baseline)."""
    prompt_len: int = 250
    """Mean task prompt length in tokens."""
    gen_len: int = 40
    """Mean generated tokens per turn (<IS> + <query>)."""
    info_len: int = 120
    """Mean info block length."""
    jitter: float = 0.25
    """Each length is drawn uniformly in mean * [1 - jitter, 1 + jitter]."""
    model: str | None = None
    """A pretrained model to run instead of the tiny random one: a hub name, a model directory,
    a `.gguf` file or a shipped model's short name (`smollm2-135m-instruct`,
    mem1_core.models.gguf). Its vocabulary then replaces `vocab_size`, and the tiny model's
    shape fields are ignored."""
    vocab_size: int = 600
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    repeats: int = 5
    """Timed forward passes per measurement (the best is reported), after one warm-up."""
    flex: bool = True
    """Also run FlexAttention (forward only on CPU; the first call compiles)."""
    seed: int = 0
    threads: int | None = None
    """torch intra-op threads (None: torch's default); 1 gives steadier ratios under load."""
    clock: str = "wall"
    """"wall" (perf_counter) or "cpu" (this process's CPU time: waiting for a core shared
    with other jobs is not counted; meaningful with threads=1, where it is one thread's)."""

    def __post_init__(self) -> None:
        unknown = set(self.memories) - MEMORY_WINDOWS.keys()
        if unknown:
            choices = sorted(MEMORY_WINDOWS)
            raise ValueError(f"unknown memories {sorted(unknown)}; choose from {choices}")
        if min(self.turns, default=0) < 1 or self.trajectories < 1 or self.repeats < 1:
            raise ValueError("turns, trajectories and repeats must all be >= 1")
        if min(self.prompt_len, self.gen_len, self.info_len) < 1 or not 0 <= self.jitter < 1:
            raise ValueError("segment lengths must be >= 1 and jitter in [0, 1)")
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {self.clock!r}")


def tiny_qwen2(cfg: TrajectoryBenchConfig, attn: str = "sdpa") -> nn.Module:
    """A randomly initialised tiny Qwen2 (the tiny profile's shape), fp32, eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        tie_word_embeddings=True,
        max_position_embeddings=1 << 14,
    )
    torch.manual_seed(cfg.seed)
    # _from_config writes the attention choice into the config it is given: copy it.
    return Qwen2ForCausalLM._from_config(copy.deepcopy(config), attn_implementation=attn).eval()


def pretrained(name_or_path: str, attn: str) -> nn.Module:
    """A pretrained causal LM (mem1_core.models.model.load_model), fp32, eval mode."""
    from mem1_core.config import ModelConfig
    from mem1_core.models.model import load_model

    return load_model(name_or_path, ModelConfig(name_or_path=name_or_path, attn=attn))


def synthetic_trajectories(cfg: TrajectoryBenchConfig, memory: str, turns: int) -> list[Paths]:
    """cfg.trajectories trajectories of `turns` turns under a memory policy; the last token
    id (vocab_size - 1) is left for padding."""
    rng = random.Random(f"{cfg.seed}-{memory}-{turns}")
    lens = (cfg.prompt_len, cfg.gen_len, cfg.info_len)
    return common_trajectories(
        rng, memory, cfg.trajectories, turns, lens, cfg.vocab_size - 1, cfg.jitter
    )


def per_turn_batched_logprobs(
    model: nn.Module,
    seqs: Sequence[Sequence[int]],
    gen_lens: Sequence[int],
    rows: int,
    pad_id: int,
) -> list[Tensor]:
    """The baseline: each sequence (context + generation) alone, length-sorted
    micro-batches of `rows`, right padding; the LM head runs only on the hidden states that
    predict a generated token. -> per sequence, the (gen_len,) log-probs of its generated
    tokens (0 for a first token with no context), as `per_turn_logprobs`."""
    device = next(model.parameters()).device
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[Tensor] = [torch.empty(0)] * len(seqs)
    for start in range(0, len(order), rows):
        chunk = order[start : start + rows]
        length = max(len(seqs[i]) for i in chunk)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long, device=device)
        attn = torch.zeros_like(ids)
        at_row, at_col, counts = [], [], []  # the predicting position of each generated token
        for r, i in enumerate(chunk):
            n, c = len(seqs[i]), len(seqs[i]) - gen_lens[i]
            ids[r, :n] = torch.tensor(seqs[i], device=device)
            attn[r, :n] = 1
            at_row += [r] * (n - max(c, 1))
            at_col += range(max(c, 1) - 1, n - 1)
            counts.append(n - max(c, 1))
        hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        rr = torch.tensor(at_row, dtype=torch.long, device=device)
        cc = torch.tensor(at_col, dtype=torch.long, device=device)
        logp = F.log_softmax(lm_head(hidden[rr, cc]).float(), -1)
        logp = logp.gather(-1, ids[rr, cc + 1, None])[:, 0]
        for i, lp in zip(chunk, logp.split(counts), strict=True):
            # With no context, the first generated token has no predecessor: 0, as defined.
            out[i] = torch.cat([lp.new_zeros(1), lp]) if gen_lens[i] == len(seqs[i]) else lp
    return out


def _best_times(
    fns: dict[str, Callable[[], object]], repeats: int, clock: str = "wall"
) -> dict[str, float]:
    """Best of `repeats` timed calls of each fn, after one warm-up call (and, for flex,
    compile). Calls are interleaved, so load from other processes on a shared machine hits
    every variant alike, and the minimum is the estimate least disturbed by it."""
    now = CLOCKS[clock]
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = now()
            fn()
            best[name] = min(best[name], now() - t0)
    return best


def _max_gap(logp: Tensor, batch: FlatBatch, refs: list[list[Tensor]]) -> float:
    """max |tree - definition| over generated tokens; refs[b][t]: (len(G_t),)."""
    want = torch.zeros_like(logp)
    for r, ref in enumerate(refs):
        rows = batch.loss_mask[r]
        want[r, rows] = torch.stack(
            [
                ref[t][o]
                for t, o in zip(
                    batch.gen_turn[r, rows].tolist(),
                    batch.gen_offset[r, rows].tolist(),
                    strict=True,
                )
            ]
        )
    return float((logp - want)[batch.loss_mask].abs().max())


def _block_mask_bytes(bm: object) -> int:
    return sum(
        v.numel() * v.element_size() for v in vars(bm).values() if isinstance(v, torch.Tensor)
    )


def _plan_row(batch: FlatBatch) -> dict:
    """Shape of the shared-prefix forward: tokens it runs (padding included) and its masks."""
    plan = shared_prefix_plan(batch, "sdpa", torch.float32)
    split = plan.split
    slots = split.trunk_lens.numel() * split.trunk_width + sum(x.numel() for x in split.rows)
    return {
        "flat_slots": slots,
        "trunk_width": split.trunk_width,
        "branch_rows": [list(x.shape) for x in split.rows],
        "prefix_mask_bytes": sum(m.numel() * m.element_size() for m in plan.branch_masks),
    }


@torch.inference_mode()
def bench_one(
    cfg: TrajectoryBenchConfig,
    model: nn.Module,
    flex_model: nn.Module | None,
    memory: str,
    turns: int,
) -> dict:
    """Measure one (memory, turns) cell; returns the JSON-able row."""
    trajs = synthetic_trajectories(cfg, memory, turns)
    pad_id = cfg.vocab_size - 1
    # L padded to the flex block size: fewer distinct shapes to compile, whole blocks.
    batch = collate([flatten(p) for p in trajs], pad_id=pad_id, pad_to_multiple=128)
    refs = [per_turn_logprobs(model, p) for p in trajs]
    seqs = [[i for s in path for i in s.ids] for p in trajs for path in p]
    gen_lens = [len(path[-1].ids) for p in trajs for path in p]
    dense = tree_attention_mask(batch, "sdpa", torch.float32)
    gap = _max_gap(forward_tree(model, batch).logprobs, batch, refs)
    gap_dense = _max_gap(forward_tree(model, batch, mask=dense).logprobs, batch, refs)
    timed = {
        "flat": lambda: forward_tree(model, batch),  # as training runs it: plan built inside
        "dense": lambda: forward_tree(model, batch, mask=dense),
        "per_turn": lambda: per_turn_batched_logprobs(
            model, seqs, gen_lens, cfg.trajectories, pad_id
        ),
    }
    flex: dict = {"max_abs_dlogp_flex": None}
    if flex_model is not None:
        try:
            bm = tree_attention_mask(batch, "flex_attention", torch.float32)
            flex_out = forward_tree(flex_model, batch, mask=bm)  # compiles for this length
            flex["max_abs_dlogp_flex"] = _max_gap(flex_out.logprobs, batch, refs)
            flex["block_mask_bytes"] = _block_mask_bytes(bm)
            flex["block_density"] = 1 - float(bm.sparsity()) / 100  # fraction of blocks run
            timed["flex"] = lambda: forward_tree(flex_model, batch, mask=bm)
        except Exception as e:  # a backend that cannot compile flex: report it, keep going
            flex["flex_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    times = _best_times(timed, cfg.repeats, cfg.clock)
    flat_tokens, turn_tokens = int(batch.seq_lens.sum()), sum(len(s) for s in seqs)
    row = {
        "memory": memory,
        "turns": turns,
        "trajectories": cfg.trajectories,
        "max_abs_dlogp": gap,
        "max_abs_dlogp_dense": gap_dense,
        **flex,
        "flat_tokens": flat_tokens,
        "per_turn_tokens": turn_tokens,
        "token_ratio": flat_tokens / turn_tokens,
        "flat_time_s": times["flat"],
        "per_turn_time_s": times["per_turn"],
        "time_ratio": times["flat"] / times["per_turn"],
        "clock": cfg.clock,
        "dense_time_s": times["dense"],
        "dense_time_ratio": times["dense"] / times["per_turn"],
        **_plan_row(batch),
        "per_turn_slots": _per_turn_slots([len(x) for x in seqs], cfg.trajectories),
        "dense_mask_bytes": dense.numel() * dense.element_size(),
        "flat_len": batch.input_ids.shape[1],
        "max_position": int(batch.position_ids.max()),
        "generated_tokens": int(batch.loss_mask.sum()),
    }
    if "flex" in times:
        row["flex_time_s"] = times["flex"]
        row["flex_time_ratio"] = times["flex"] / times["per_turn"]
    return row


def _per_turn_slots(lengths: list[int], rows: int) -> int:
    """Tokens the baseline runs, padding included (its length-sorted micro-batches)."""
    lengths = sorted(lengths)
    return sum(
        len(c) * max(c) for c in (lengths[i : i + rows] for i in range(0, len(lengths), rows))
    )


def run_trajectory_bench(
    cfg: TrajectoryBenchConfig, emit: Callable[[dict], None] = lambda row: None
) -> list[dict]:
    """All (memory, turns) cells, in order; `emit` sees each row as soon as it is measured."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.model is not None:
        model = pretrained(cfg.model, "sdpa")
        cfg = dataclasses.replace(cfg, vocab_size=model.config.vocab_size)
    else:
        model = tiny_qwen2(cfg, "sdpa")
    flex_model = None
    if cfg.flex:
        flex_model = (
            pretrained(cfg.model, "flex_attention")
            if cfg.model
            else tiny_qwen2(cfg, "flex_attention")
        )
        flex_model.load_state_dict(model.state_dict())
    rows = []
    for memory in cfg.memories:
        for turns in cfg.turns:
            row = bench_one(cfg, model, flex_model, memory, turns)
            emit(row)
            rows.append(row)
    return rows
