"""Benchmark: the flattened tree of turn contexts vs re-running every turn separately.

For each (memory policy, number of turns) it builds a batch of synthetic trajectories with
realistic segment lengths (the tiny profile at 2 objectives: prompt ~250 tokens, generated
turn ~40, info block ~120), runs a tiny Qwen2 model once over the flattened tree (dense
boolean mask under sdpa; BlockMask under FlexAttention where it runs) and compares with
the per-turn definition (`per_turn_logprobs`) and with a per-turn batched baseline.

Baseline (the fair one): every turn's context + generation as its own sequence, as a
trainer without the tree would do; all turns of all trajectories sorted by length and cut
into micro-batches of as many rows as the tree batch has, right-padded, so neither side
pays much padding and both run the same number of rows per forward.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mem1_core.logprobs import forward_tree, per_turn_logprobs, tree_attention_mask
from mem1_core.tree import FlatBatch, Segment, collate, flatten

Paths = list[list[Segment]]


def mem1_paths(prompt: list[int], gens: list[list[int]], infos: list[list[int]]) -> Paths:
    """MEM1: turn t reads the prompt, its last generation (re-read) and the last info."""
    return _window_paths(prompt, gens, infos, window=1)


def full_paths(prompt: list[int], gens: list[list[int]], infos: list[list[int]]) -> Paths:
    """Full context: turn t reads the whole history (the tree is one chain)."""
    return _window_paths(prompt, gens, infos, window=len(gens))


def truncate_paths(
    prompt: list[int], gens: list[list[int]], infos: list[list[int]], k: int = 2
) -> Paths:
    """Truncate: turn t reads the prompt and the last k turns."""
    return _window_paths(prompt, gens, infos, window=k)


def _window_paths(prompt, gens, infos, window: int) -> Paths:
    paths = []
    for t in range(len(gens)):
        ctx = [Segment(("prompt",), tuple(prompt), False)]
        for s in range(max(t - window, 0), t):
            ctx.append(Segment(("gen", s), tuple(gens[s]), False))
            ctx.append(Segment(("info", s), tuple(infos[s]), False))
        paths.append([*ctx, Segment(("gen", t), tuple(gens[t]), True)])
    return paths


POLICIES: dict[str, Callable[[list[int], list[list[int]], list[list[int]]], Paths]] = {
    "mem1": mem1_paths,
    "full": full_paths,
    "truncate": truncate_paths,
}


@dataclass(frozen=True)
class TrajectoryBenchConfig:
    """What to measure and on which synthetic trajectories and model."""

    turns: tuple[int, ...] = (2, 4, 8, 16)
    """Numbers of turns T to measure."""
    policies: tuple[str, ...] = ("mem1", "full")
    """Memory policies (keys of POLICIES)."""
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

    def __post_init__(self) -> None:
        unknown = set(self.policies) - POLICIES.keys()
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; choose from {sorted(POLICIES)}")
        if min(self.turns, default=0) < 1 or self.trajectories < 1 or self.repeats < 1:
            raise ValueError("turns, trajectories and repeats must all be >= 1")
        if min(self.prompt_len, self.gen_len, self.info_len) < 1 or not 0 <= self.jitter < 1:
            raise ValueError("segment lengths must be >= 1 and jitter in [0, 1)")


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


def synthetic_trajectories(cfg: TrajectoryBenchConfig, policy: str, turns: int) -> list[Paths]:
    rng = random.Random(f"{cfg.seed}-{policy}-{turns}")

    def ids(mean: int) -> list[int]:
        n = rng.randint(round(mean * (1 - cfg.jitter)), round(mean * (1 + cfg.jitter)))
        return [rng.randrange(cfg.vocab_size - 1) for _ in range(max(n, 1))]

    out = []
    for _ in range(cfg.trajectories):
        prompt = ids(cfg.prompt_len)
        gens = [ids(cfg.gen_len) for _ in range(turns)]
        infos = [ids(cfg.info_len) for _ in range(turns)]
        out.append(POLICIES[policy](prompt, gens, infos))
    return out


def per_turn_batched_logprobs(
    model: nn.Module, seqs: Sequence[Sequence[int]], rows: int, pad_id: int
) -> list[Tensor]:
    """The baseline: each sequence alone, length-sorted micro-batches of `rows`, right
    padding. -> per sequence, (len - 1,) log-probs of tokens 1..len-1."""
    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list[Tensor] = [torch.empty(0)] * len(seqs)
    for start in range(0, len(order), rows):
        chunk = order[start : start + rows]
        length = max(len(seqs[i]) for i in chunk)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long, device=device)
        attn = torch.zeros_like(ids)
        for r, i in enumerate(chunk):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i], device=device)
            attn[r, : len(seqs[i])] = 1
        logp = F.log_softmax(model(input_ids=ids, attention_mask=attn, use_cache=False).logits, -1)
        tok = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        for r, i in enumerate(chunk):
            out[i] = tok[r, : len(seqs[i]) - 1]
    return out


def _best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best of `repeats` timed calls of each fn, after one warm-up call (and, for flex,
    compile). Calls are interleaved, so load from other processes on a shared machine hits
    every variant alike, and the minimum is the estimate least disturbed by it."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
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


@torch.inference_mode()
def bench_one(
    cfg: TrajectoryBenchConfig,
    model: nn.Module,
    flex_model: nn.Module | None,
    policy: str,
    turns: int,
) -> dict:
    """Measure one (policy, turns) cell; returns the JSON-able row."""
    trajs = synthetic_trajectories(cfg, policy, turns)
    pad_id = cfg.vocab_size - 1
    # L padded to the flex block size: fewer distinct shapes to compile, whole blocks.
    batch = collate([flatten(p) for p in trajs], pad_id=pad_id, pad_to_multiple=128)
    refs = [per_turn_logprobs(model, p) for p in trajs]
    seqs = [[i for s in path for i in s.ids] for p in trajs for path in p]
    dense = tree_attention_mask(batch, "sdpa", torch.float32)
    gap_dense = _max_gap(forward_tree(model, batch, mask=dense).logprobs, batch, refs)
    timed = {
        "flat": lambda: forward_tree(model, batch, mask=dense),
        "per_turn": lambda: per_turn_batched_logprobs(model, seqs, cfg.trajectories, pad_id),
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
    times = _best_times(timed, cfg.repeats)
    flat_tokens, turn_tokens = int(batch.seq_lens.sum()), sum(len(s) for s in seqs)
    row = {
        "policy": policy,
        "turns": turns,
        "trajectories": cfg.trajectories,
        "max_abs_dlogp_dense": gap_dense,
        **flex,
        "flat_tokens": flat_tokens,
        "per_turn_tokens": turn_tokens,
        "token_ratio": flat_tokens / turn_tokens,
        "flat_time_s": times["flat"],
        "per_turn_time_s": times["per_turn"],
        "time_ratio": times["flat"] / times["per_turn"],
        "dense_mask_bytes": dense.numel() * dense.element_size(),
        "flat_len": batch.input_ids.shape[1],
        "max_position": int(batch.position_ids.max()),
        "generated_tokens": int(batch.loss_mask.sum()),
    }
    if "flex" in times:
        row["flex_time_s"] = times["flex"]
        row["flex_time_ratio"] = times["flex"] / times["per_turn"]
    return row


def run_trajectory_bench(
    cfg: TrajectoryBenchConfig, emit: Callable[[dict], None] = lambda row: None
) -> list[dict]:
    """All (policy, turns) cells, in order; `emit` sees each row as soon as it is measured."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    model = tiny_qwen2(cfg, "sdpa")
    flex_model = None
    if cfg.flex:
        flex_model = tiny_qwen2(cfg, "flex_attention")
        flex_model.load_state_dict(model.state_dict())
    rows = []
    for policy in cfg.policies:
        for turns in cfg.turns:
            row = bench_one(cfg, model, flex_model, policy, turns)
            emit(row)
            rows.append(row)
    return rows
