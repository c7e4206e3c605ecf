"""Generation backends: token-id contexts in, generated ids and their log-probs out.

The interface (`GenerationBackend.generate`) is what the rollout calls; the CPU
implementation here runs Hugging Face models with a KV cache over a left-padded batch and
drops finished rows from the cache as they stop; the vLLM backend implements the same
interface on GPUs.

The recorded log-prob of a token is its log-prob under the distribution it was sampled
from: log_softmax(logits / temperature) when sampling (top-p only truncates which tokens may
be drawn), log_softmax(logits) when greedy. The learner scores the masked trajectory at the
same temperature (verl does the same), so PPO's ratio compares like with like.

A trajectory's contexts overlap from turn to turn: each opens with its task's prompt (under
every memory), and under the full context each is the last one, what was generated in it and
the new `<info>`. A `TurnCache` the caller owns for as long as the weights do not change (one
rollout) keeps each trajectory's last sequence as keys and values: the next turn reuses them
up to the first token where its context differs, and runs the model over the rest only.

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
from mem1_core.rollout.kv_cache import (
    PREFILL_FORWARD_TOKENS,
    TurnCache,
    batch_layout,
    decode_cache,
    prefill_chunks,
    turn_cache_bytes,
)


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


class HFBackend:
    """Hugging Face causal LM with a KV cache; batches rows and prunes finished ones.
    `tokenizer` is needed for stop strings (it decodes the generated ids)."""

    reuses_prefixes = True
    """generate takes a key per context and a `TurnCache` (the rollout makes one with
    `turn_cache` and passes its trajectories' indices)."""

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

    def turn_cache(self) -> TurnCache:
        """A TurnCache for one rollout, sized by the memory free where the model runs."""
        return TurnCache(turn_cache_bytes(next(self.model.parameters()).device))

    @torch.no_grad()
    def generate(self, contexts, params, generator=None, keys=None, turns=None) -> list[Generation]:
        """`keys[i]` (with `turns`, a TurnCache): context i's trajectory. Its keys and values
        are taken from the cache as far as its last sequence reaches, and the cache then holds
        this call's sequence under the key."""
        if keys is not None and len(keys) != len(contexts):
            raise ValueError("keys needs one key per context")
        if keys is not None and len(set(keys)) != len(keys):
            raise ValueError("each context of a call needs its own key")
        out: list[Generation] = []
        for i in range(0, len(contexts), self.max_batch):
            ks = None if keys is None or turns is None else keys[i : i + self.max_batch]
            batch = contexts[i : i + self.max_batch]
            out += self._generate_batch(batch, params, generator, ks, turns)
        return out

    def _generate_batch(self, contexts, params, generator, keys, turns) -> list[Generation]:
        from mem1_core.models.model import compute_context

        with compute_context(self.model):  # `model.autocast`: bf16 compute on fp32 weights
            return self._generate_rows(contexts, params, generator, keys, turns)

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

    def _prefill(self, contexts, device, reused: list[int], kv: list):
        """-> the batch's KV cache over `contexts`, its attention mask, each row's next
        position and the logits at each context's end, as `_prefill_rows` lays them out.

        A left-padded forward computes every pad column in every layer: a WebShop batch whose
        new tokens run from ~150 (an item page) to ~650 (a results page) spent more than half
        its prefill on pads. So rows whose new tokens differ enough to pay for another
        forward (`prefill_chunks`, PREFILL_FORWARD_TOKENS) run in forwards of their own, and
        their keys and values are laid into one batch cache; decoding then runs the whole
        batch as before. Each row attends to exactly its own context either way (the results
        agree to float rounding)."""
        new = [len(c) - n for c, n in zip(contexts, reused, strict=True)]
        chunks = prefill_chunks(new, PREFILL_FORWARD_TOKENS)
        if len(chunks) == 1:
            return self._prefill_rows(contexts, device, reused, kv)
        B, P, S = len(contexts), max(reused), max(new)
        logits, parts = None, []
        for rows in chunks:
            part_cache, _, _, part_logits = self._prefill_rows(
                [contexts[r] for r in rows],
                device,
                [reused[r] for r in rows],
                [kv[r] for r in rows],
            )
            parts.append((rows, part_cache, max(reused[r] for r in rows)))
            if logits is None:
                logits = part_logits.new_empty((B, part_logits.shape[-1]))
            logits[torch.tensor(rows, device=device)] = part_logits
        # row r's reused and new columns, from its chunk's layout into the batch's (both
        # [pad | reused | pad | new], the reused part ending at the chunk's longest reuse)
        cache = decode_cache(self.model)
        for li in range(len(parts[0][1].layers)):
            k0 = parts[0][1].layers[li].keys
            K = k0.new_zeros((B, k0.shape[1], P + S, k0.shape[3]))
            V = torch.zeros_like(K)
            for rows, part_cache, part_p in parts:
                layer = part_cache.layers[li]
                for batch, chunk in ((K, layer.keys), (V, layer.values)):
                    for j, r in enumerate(rows):
                        n = reused[r]
                        batch[r, :, P - n : P] = chunk[j, :, part_p - n : part_p]
                        batch[r, :, P + S - new[r] :] = chunk[j, :, -new[r] :]
            cache.update(K, V, li)
        attn, next_pos = batch_layout(contexts, reused, P, S, device)
        return cache, attn, next_pos, logits

    def _prefill_rows(self, contexts, device, reused: list[int], kv: list):
        """-> the batch's KV cache over `contexts`, its attention mask, each row's next
        position and the logits at each context's end, in one forward. Row b's first
        reused[b] tokens come from kv[b] (a TurnCache entry's layers), and one forward runs the
        rest, laid out per row as [pad | reused | pad | rest] (`batch_layout`): the pad
        between is masked like the left padding, and the positions are the context's own, so
        each row attends to exactly its context (with nothing reused, one left-padded
        forward)."""
        B, P = len(contexts), max(reused)
        S = max(len(c) - n for c, n in zip(contexts, reused, strict=True))
        cache = decode_cache(self.model)
        if P:
            layers = next(layers for layers, n in zip(kv, reused, strict=True) if n)
            for li, (k0, v0) in enumerate(layers):
                K = k0.new_zeros((B, k0.shape[0], P, k0.shape[2]))
                V = v0.new_zeros((B, v0.shape[0], P, v0.shape[2]))
                for b, n in enumerate(reused):
                    if n:
                        K[b, :, P - n :] = kv[b][li][0][:, :n]
                        V[b, :, P - n :] = kv[b][li][1][:, :n]
                cache.update(K, V, li)
        ids = torch.full((B, S), self.pad_id, dtype=torch.long, device=device)
        pos = torch.zeros((B, S), dtype=torch.long, device=device)
        for b, (c, n) in enumerate(zip(contexts, reused, strict=True)):
            rest = len(c) - n
            ids[b, S - rest :] = torch.tensor(c[n:], dtype=torch.long)
            pos[b, S - rest :] = torch.arange(n, len(c))
        attn, next_pos = batch_layout(contexts, reused, P, S, device)
        return cache, attn, next_pos, self._forward(ids, attn, pos, cache)

    def _generate_rows(self, contexts, params, generator, keys, turns) -> list[Generation]:
        if any(len(c) == 0 for c in contexts):
            raise ValueError("every context needs at least one token")
        device = next(self.model.parameters()).device
        B = len(contexts)
        stops = set(params.stop_ids) | ({self.eos_id} if self.eos_id is not None else set())
        strings = self._stop_strings(params)
        reused, kv = [0] * B, [None] * B
        if keys is not None:
            reused = [turns.reusable(k, c) for k, c in zip(keys, contexts, strict=True)]
            kv = [turns.seqs[k][1] if n else None for k, n in zip(keys, reused, strict=True)]
        cache, attn, next_pos, logits = self._prefill(contexts, device, reused, kv)
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
            last = not keep or step == params.max_new_tokens - 1
            if keys is not None:  # the cache holds each finished row's context and ids
                kept = set() if last else set(keep)
                for j, r in enumerate(rows):
                    if j not in kept:
                        self._keep_turn(
                            turns, keys[r], contexts[r] + gen_ids[r][:-1], cache, attn, j
                        )
            if last:
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

    @staticmethod
    def _keep_turn(turns: TurnCache, key, ids: list[int], cache: DynamicCache, attn, j: int):
        """Put batch position j's keys and values (its unmasked columns: the context and the
        ids generated but the last, in order) into `turns` under `key`."""
        cols = attn[j].bool()
        layers = [(layer.keys[j][:, cols], layer.values[j][:, cols]) for layer in cache.layers]
        assert layers[0][0].shape[1] == len(ids)
        turns.put(key, ids, layers)

    def _stop_strings(self, params: SamplingParams) -> StopStrings | None:
        if not params.stop_strings:
            return None
        if self.tokenizer is None:
            raise ValueError("stop strings need the tokenizer: HFBackend(..., tokenizer=tok)")
        return StopStrings(self.tokenizer, params.stop_strings)
