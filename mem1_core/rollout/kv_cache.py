"""The key-value caches of CPU generation (mem1_core.rollout.generation.HFBackend): the
`TurnCache` that keeps each trajectory's last sequence between turns, its memory budget, the
prefill's chunks, the left-padded batch layout, and a decode-time cache layer.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import partial

import torch
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class TurnCache:
    """Keys and values, per layer `[kv heads, tokens, head dim]`, of each trajectory's last
    sequence: the context of its last turn and the ids generated in it but the last (which no
    forward read), by the caller's key (the rollout's trajectory index). HFBackend.generate
    reuses an entry for the longest prefix its next context shares with it (under the full
    context, all of it; under MEM1, the task prompt) and replaces it with the new turn's.
    Valid for one set of weights only: its owner drops it when they change (the rollout makes
    one per call). It holds at most `max_bytes`: a sequence that does not fit is not kept,
    and its next turn runs whole (`HFBackend.turn_cache` sizes it by the memory free where
    the model runs)."""

    def __init__(self, max_bytes: int = 2**30):
        self.seqs: dict[Hashable, tuple[list[int], list[tuple[Tensor, Tensor]]]] = {}
        self.max_bytes = max_bytes
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def drop(self, key: Hashable) -> None:
        if key in self.seqs:
            self.bytes -= cache_nbytes(self.seqs.pop(key)[1])

    def put(self, key: Hashable, ids: list[int], layers: list[tuple[Tensor, Tensor]]) -> None:
        self.drop(key)
        size = cache_nbytes(layers)
        if self.bytes + size <= self.max_bytes:
            self.seqs[key] = (ids, layers)
            self.bytes += size

    def reusable(self, key: Hashable, context: Sequence[int]) -> int:
        """How many of `context`'s first tokens the entry holds: their common prefix, less
        the context's last token (the forward must read one to give the next logits)."""
        if key not in self.seqs:
            return 0
        ids, n = self.seqs[key][0], 0
        for a, b in zip(ids, context[:-1], strict=False):
            if a != b:
                break
            n += 1
        return n


TURN_CACHE_SHARE = 0.25
"""The share of the memory free where the model runs that a rollout's TurnCache may hold.
SmolLM2 keeps 46 KB a token: 32 WebShop trajectories of ~800 tokens are 1.2 GB under MEM1
and 32 full contexts of 3k tokens 4.4 GB, where a fixed 1 GiB kept 12 of the 32 MEM1 rows and
re-ran the other prompts every turn (and most full contexts whole)."""
TURN_CACHE_FALLBACK = 2**30
"""The TurnCache's size where the free memory cannot be read."""


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory free now on `device`: CUDA's free device memory, else the host's MemAvailable
    (Linux /proc/meminfo); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def turn_cache_bytes(device: torch.device) -> int:
    """How much a rollout's TurnCache may hold on `device`: TURN_CACHE_SHARE of the memory
    free there now, TURN_CACHE_FALLBACK where that cannot be read."""
    free = free_memory_bytes(device)
    return TURN_CACHE_FALLBACK if free is None else int(free * TURN_CACHE_SHARE)


PREFILL_FORWARD_TOKENS = 128
"""What one more prefill forward costs, in tokens of pads it would save. On the AVX2-only EPYC
(float32, 2 threads) a forward over rows of a shape not seen before costs ~0.2 s beyond its
tokens (oneDNN makes kernels for each new shape), about 80 tokens' compute: splitting a QA
batch that saved 6 % of its pads made its evaluation 1.1x slower."""


def prefill_chunks(new_tokens: Sequence[int], forward_tokens: float = 0.0) -> list[list[int]]:
    """Rows (indices into `new_tokens`, each row's tokens still to run) grouped for prefill,
    to the fewest tokens run: each chunk costs its rows times its longest row's tokens (every
    row padded to it) plus `forward_tokens`. The best grouping takes the rows longest first in
    runs (a row never waits in a longer chunk than a longer row does); found exactly, over
    where the runs break."""
    order = sorted(range(len(new_tokens)), key=lambda r: -new_tokens[r])
    lengths = [new_tokens[r] for r in order]
    # best[j]: the least cost of the j longest rows; start[j]: where its last run begins
    best, start = [0.0] * (len(order) + 1), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        best[j], start[j] = min(
            (best[i] + forward_tokens + (j - i) * lengths[i], i) for i in range(j)
        )
    chunks, j = [], len(order)
    while j:
        chunks.append(order[start[j] : j])
        j = start[j]
    return chunks[::-1]


def batch_layout(contexts, reused: list[int], P: int, S: int, device) -> tuple[Tensor, Tensor]:
    """A prefilled batch's attention mask over its P + S columns, each row laid out as
    [pad | reused | pad | rest] (reused right-aligned in the first P, the rest in the last S),
    and each row's next position (its context's length)."""
    attn = torch.zeros((len(contexts), P + S), dtype=torch.long, device=device)
    for b, (c, n) in enumerate(zip(contexts, reused, strict=True)):
        attn[b, P - n : P] = 1
        attn[b, P + S - (len(c) - n) :] = 1
    next_pos = torch.tensor([len(c) for c in contexts], dtype=torch.long, device=device)
    return attn, next_pos


def cache_nbytes(layers: list[tuple[Tensor, Tensor]]) -> int:
    return sum(k.nbytes + v.nbytes for k, v in layers)


class DecodeLayer(DynamicLayer):
    """A DynamicLayer for HFBackend's decoding. It keeps its keys and values in `dtype` (the
    autocast dtype where there is one: attention reads them in it anyway, autocast casting its
    inputs bit for bit as this cast does, and re-casting a float32 cache on every read cost
    more than the attention), and it writes each new token into spare room instead of
    concatenating a new tensor (allocating the whole cache anew on every token was the rest
    of a long context's decode step). `keys`/`values` stay views of the first tokens of that
    room, so everything else a DynamicLayer does (batch_select_indices, crop) works on them;
    once one of those replaced them, the next update moves them into fresh room."""

    def __init__(self, dtype: torch.dtype | None, **kwargs):
        super().__init__(**kwargs)
        self.dtype = dtype
        self.room: tuple[Tensor, Tensor] | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        if self.dtype is not None:
            key_states, value_states = key_states.to(self.dtype), value_states.to(self.dtype)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
        room = self.room
        if room is None or room[0].shape[-2] < n + m or room[0].data_ptr() != self.keys.data_ptr():
            B, H, _, D = key_states.shape
            cap = max(2 * (n + m), 64)
            room = (key_states.new_empty((B, H, cap, D)), value_states.new_empty((B, H, cap, D)))
            if n:
                room[0][:, :, :n], room[1][:, :, :n] = self.keys, self.values
            self.room = room
        room[0][:, :, n : n + m], room[1][:, :, n : n + m] = key_states, value_states
        self.keys, self.values = room[0][:, :, : n + m], room[1][:, :, : n + m]
        return self.keys, self.values


def decode_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty KV cache for decoding `model` (`DecodeLayer`s, in its autocast dtype if any)."""
    from mem1_core.models.model import DTYPES, model_autocast

    dtype = model_autocast(model)
    cache = DynamicCache()
    cache.layer_class_to_replicate = partial(DecodeLayer, DTYPES[dtype] if dtype else None)
    return cache
