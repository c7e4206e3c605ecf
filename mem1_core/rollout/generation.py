"""Generation backends: token-id contexts in, generated ids and their log-probs out.

The interface (`GenerationBackend.generate`) is what the rollout calls; the CPU
implementation here runs Hugging Face models with a KV cache over a left-padded batch and
drops finished rows from the cache as they stop; the vLLM backend implements the same
interface on GPUs.

The recorded log-prob of a token is its log-prob under the distribution it was sampled
from: log_softmax(logits / temperature) when sampling (top-p only truncates which tokens may
be drawn), log_softmax(logits) when greedy. The learner scores the masked trajectory at the
same temperature (verl does the same), so PPO's ratio compares like with like.

A context's first tokens that recur across calls (a task's prompt opens every turn's context,
under every memory) can be kept as keys and values in a `PrefixCache` the caller owns for as
long as the weights do not change (one rollout): they are computed once, and each later call
runs the model over the rest of the context only.

A turn stops on a token id (the tiny tokenizer's single-token tags, EOS) or on a string (a hub
tokenizer's tags as text, mem1_core.models.tags): a row stops after the first token at which
the decoded text of its generated ids contains a stop string (`StopStrings`). That token is
kept whole, characters after the stop string included, so the ids stay exactly as sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache

from mem1_core.models.tags import turn_text


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    """Generation of a row ends after it emits one of these (the stop token is kept)."""
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    stop_strings: tuple[str, ...] = ()
    """Generation of a row also ends after the token that completes one of these in the
    decoded text of its generated ids (kept, with whatever else that token carries)."""


@dataclass
class Generation:
    ids: list[int]
    logprobs: list[float]
    finish: str  # "stop" or "length"


class GenerationBackend(Protocol):
    def generate(
        self,
        contexts: Sequence[Sequence[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> list[Generation]: ...


def sample_next(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> Tensor:
    """logits (B, V) -> next token ids (B,), greedy when temperature == 0."""
    if temperature == 0.0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the most likely token
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class StopStrings:
    """Where a row's generation ends on stop strings: after the first token n such that
    turn_text(ids[:n]) contains one of `strings` (the definition; `index` computes it)."""

    def __init__(self, tokenizer, strings: Sequence[str]):
        if not strings or not all(strings):
            raise ValueError("stop strings must be non-empty")
        self.tok = tokenizer
        self.strings = tuple(strings)
        # Every token decodes to at least one byte, so a stop string of n bytes lies within its
        # last n tokens; a few more cover a token that decodes to nothing at the start of a
        # window (a Metaspace decoder drops a leading `▁`).
        self.window = max(len(s.encode()) for s in self.strings) + 4

    def hit(self, text: str) -> bool:
        return any(s in text for s in self.strings)

    def completes(self, ids: Sequence[int]) -> bool:
        """Whether the last of `ids` completes a stop string, given that no earlier one did
        (the check after each generated token): only the tail can hold it."""
        return self.hit(turn_text(self.tok, ids[-self.window :]))

    def index(self, ids: Sequence[int]) -> int | None:
        """The n of the definition, None if `ids` hold no stop string (a binary search: a
        prefix that contains one stays containing it as tokens are appended)."""
        if not ids or not self.hit(turn_text(self.tok, ids)):
            return None
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.hit(turn_text(self.tok, ids[:mid])):
                hi = mid
            else:
                lo = mid + 1
        return lo


class PrefixCache:
    """Keys and values of context prefixes, per layer `[kv heads, tokens, head dim]`, by their
    token ids: what HFBackend.generate reuses for the first `prefix_lens[i]` tokens of context
    i. Valid for one set of weights only: its owner drops it when they change (the rollout
    makes one per call). It holds at most `max_bytes`; once a prefix did not fit it takes no
    more, and the contexts it lacks run whole (a cache that evicted would compute and drop the
    same prompts every turn)."""

    def __init__(self, max_bytes: int = 2**30):
        self.kv: dict[tuple[int, ...], list[tuple[Tensor, Tensor]]] = {}
        self.max_bytes = max_bytes
        self.bytes = 0
        self.full = False

    def __len__(self) -> int:
        return len(self.kv)

    def put(self, key: tuple[int, ...], layers: list[tuple[Tensor, Tensor]]) -> None:
        size = sum(k.nbytes + v.nbytes for k, v in layers)
        if self.full or self.bytes + size > self.max_bytes:
            self.full = True
            return
        self.kv[key] = layers
        self.bytes += size


def _left_padded(contexts, pad_id: int, device) -> tuple[Tensor, Tensor, Tensor]:
    """ids, attention mask and position ids of `contexts` left-padded to the longest."""
    B, L = len(contexts), max(len(c) for c in contexts)
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((B, L), dtype=torch.long, device=device)
    for b, c in enumerate(contexts):
        ids[b, L - len(c) :] = torch.tensor(c, dtype=torch.long)
        attn[b, L - len(c) :] = 1
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


class HFBackend:
    """Hugging Face causal LM with a KV cache; batches rows and prunes finished ones.
    `tokenizer` is needed for stop strings (it decodes the generated ids)."""

    reuses_prefixes = True
    """generate takes `prefix_lens` and a `PrefixCache` (the rollout passes its prompts)."""

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        eos_id: int | None = None,
        max_batch: int = 64,
        tokenizer=None,
    ):
        self.model = model
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.max_batch = max_batch
        self.tokenizer = tokenizer

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.model.load_state_dict(state)

    @torch.no_grad()
    def generate(
        self, contexts, params, generator=None, prefix_lens=None, prefix_cache=None
    ) -> list[Generation]:
        """`prefix_lens[i]` (with `prefix_cache`): how many of context i's first tokens to
        take from the cache, computing and keeping them there on a miss."""
        if prefix_lens is not None and len(prefix_lens) != len(contexts):
            raise ValueError("prefix_lens needs one length per context")
        out: list[Generation] = []
        for i in range(0, len(contexts), self.max_batch):
            lens = None if prefix_lens is None else prefix_lens[i : i + self.max_batch]
            batch = contexts[i : i + self.max_batch]
            out += self._generate_batch(batch, params, generator, lens, prefix_cache)
        return out

    def _generate_batch(self, contexts, params, generator, prefix_lens, cache) -> list[Generation]:
        from mem1_core.models.model import compute_context

        with compute_context(self.model):  # `model.autocast`: bf16 compute on fp32 weights
            return self._generate_rows(contexts, params, generator, prefix_lens, cache)

    def _forward(self, ids: Tensor, attn: Tensor, pos: Tensor, cache: DynamicCache) -> Tensor:
        """The logits at the last column (the only ones generation reads: the vocabulary
        projection of every other position would be a fifth of a prefill's work)."""
        return self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]

    def _prefill(self, contexts, device, prefix_lens, store: PrefixCache | None):
        """-> the batch's KV cache over `contexts`, its attention mask, each row's next
        position and the logits at each context's end. Without a store, one left-padded
        forward. With one, each row's first prefix_lens[b] tokens but the last come from the
        store, and one forward runs the rest, laid out per row as
        [pad | prefix | pad | rest]: the pad between is masked like the left padding, and the
        positions are the context's own, so each row attends to exactly its context."""
        if store is None or prefix_lens is None:
            ids, attn, pos = _left_padded(contexts, self.pad_id, device)
            cache = DynamicCache()
            return cache, attn, pos[:, -1] + 1, self._forward(ids, attn, pos, cache)
        # all but the prefix's last token, which the context may end with: a prompt keeps one
        # key whether it is the whole context (a first turn) or opens it (every later turn)
        cut = [max(0, min(p, len(c)) - 1) for c, p in zip(contexts, prefix_lens, strict=True)]
        keys = [tuple(c[:k]) for c, k in zip(contexts, cut, strict=True)]
        todo = [k for k in dict.fromkeys(keys) if k and k not in store.kv]
        if todo and not store.full:
            ids, attn, pos = _left_padded(todo, self.pad_id, device)
            fresh = DynamicCache()
            self._forward(ids, attn, pos, fresh)
            L = ids.shape[1]
            for b, k in enumerate(todo):
                store.put(
                    k,
                    [
                        (
                            layer.keys[b, :, L - len(k) :].clone(),
                            layer.values[b, :, L - len(k) :].clone(),
                        )
                        for layer in fresh.layers
                    ],
                )
        keys = [k if k in store.kv else () for k in keys]  # what did not fit runs whole
        B, P = len(contexts), max(len(k) for k in keys)
        S = max(len(c) - len(k) for c, k in zip(contexts, keys, strict=True))
        cache = DynamicCache()
        if P:
            layers = next(store.kv[k] for k in keys if k)
            for li, (k0, v0) in enumerate(layers):
                K = k0.new_zeros((B, k0.shape[0], P, k0.shape[2]))
                V = v0.new_zeros((B, v0.shape[0], P, v0.shape[2]))
                for b, k in enumerate(keys):
                    if k:
                        K[b, :, P - len(k) :], V[b, :, P - len(k) :] = store.kv[k][li]
                cache.update(K, V, li)
        ids = torch.full((B, S), self.pad_id, dtype=torch.long, device=device)
        attn = torch.zeros((B, P + S), dtype=torch.long, device=device)
        pos = torch.zeros((B, S), dtype=torch.long, device=device)
        for b, (c, k) in enumerate(zip(contexts, keys, strict=True)):
            rest = len(c) - len(k)
            ids[b, S - rest :] = torch.tensor(c[len(k) :], dtype=torch.long)
            pos[b, S - rest :] = torch.arange(len(k), len(c))
            attn[b, P - len(k) : P] = 1
            attn[b, P + S - rest :] = 1
        next_pos = torch.tensor([len(c) for c in contexts], dtype=torch.long, device=device)
        return cache, attn, next_pos, self._forward(ids, attn, pos, cache)

    def _generate_rows(self, contexts, params, generator, prefix_lens, store) -> list[Generation]:
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        device = next(self.model.parameters()).device
        B = len(contexts)
        stops = set(params.stop_ids) | ({self.eos_id} if self.eos_id is not None else set())
        strings = self._stop_strings(params)
        cache, attn, next_pos, logits = self._prefill(contexts, device, prefix_lens, store)
        gen_ids: list[list[int]] = [[] for _ in range(B)]
        gen_lp: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B
        rows = list(range(B))  # original row of each live batch position
        for step in range(params.max_new_tokens):
            scale = params.temperature if params.temperature > 0 else 1.0
            logp = torch.log_softmax(logits.float() / scale, dim=-1)
            nxt = sample_next(logits, params.temperature, params.top_p, generator)
            chosen = logp.gather(-1, nxt[:, None]).squeeze(-1)
            keep = []
            for j, r in enumerate(rows):
                tok = int(nxt[j])
                gen_ids[r].append(tok)
                gen_lp[r].append(float(chosen[j]))
                if tok in stops or (strings is not None and strings.completes(gen_ids[r])):
                    finish[r] = "stop"
                else:
                    keep.append(j)
            if not keep or step == params.max_new_tokens - 1:
                break
            if len(keep) < len(rows):
                idx = torch.tensor(keep, device=device)
                cache.batch_select_indices(idx)
                attn, nxt, next_pos = attn[idx], nxt[idx], next_pos[idx]
                rows = [rows[j] for j in keep]
            attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
            logits = self._forward(nxt[:, None], attn, next_pos[:, None], cache)
            next_pos = next_pos + 1
        return [Generation(gen_ids[b], gen_lp[b], finish[b]) for b in range(B)]

    def _stop_strings(self, params: SamplingParams) -> StopStrings | None:
        if not params.stop_strings:
            return None
        if self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer: HFBackend(..., tokenizer=tok)")
        return StopStrings(self.tokenizer, params.stop_strings)
