"""Tokenizers: the `tiny` tokenizer trained locally, and hub tokenizers as they come.

The tiny tokenizer is built so that copying is cheap (docs/design.md §7): the pre-tokenizer cuts
capitalised words into the world's consonant-vowel syllables, so an unseen name is a few
syllable tokens from a small inventory rather than an arbitrary BPE split, and every year
1000-2099 is a single token. The eight tags are single special tokens, so the environment
finds them in token ids without decoding (docs/design.md §4.1).

A hub tokenizer gets no new tokens: its tags stay text (mem1_core.models.tags, docs/design.md
§8), so the model's embedding table stays as it was trained. `train_byte_level_tokenizer` is a
stand-in for one (Qwen2.5's byte-level BPE and pre-tokenizer, trained locally) for tests and
checks that have no hub access.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mem1_core.data.prompts import TAGS
from mem1_core.data.world_model import CODAS, ONSETS, VOWELS

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
YEARS = range(1000, 2100)

# A syllable: onset, vowel, and a coda only when the next letter does not start a syllable
# of its own (a vowel, or the h of th/sh). Matches mem1_core.data.world's name inventory.
_ONSET = r"(?:th|sh|[bdfgklmnprstvz])"
_SYLLABLE = rf"▁?(?:[A-Z][hH]?|{_ONSET})[aeiou](?:[nrls](?![aeiouh]))?(?=[a-z]|\b|$)"
_SPLIT = (
    rf"▁?\d{{4}}(?!\d)"  # a year: one piece
    rf"|(?:^|(?<=▁)|▁)[a-z]+"  # an ordinary lowercase word stays whole
    rf"|{_SYLLABLE}"  # a capitalised word (a name) is cut into syllables
    rf"|▁?[A-Za-z]+|▁?\d+|▁?[^\sA-Za-z\d▁]|▁"
)


def train_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 3000) -> PreTrainedTokenizerFast:
    """Train the `tiny` BPE tokenizer on `texts` (the world corpus and task prompts)."""
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=False),
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=False)
    special = [PAD, EOS, UNK, *TAGS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=special,
        show_progress=False,
        initial_alphabet=list(
            "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:?!'\"()[]-"
        ),
    )
    # Every year and every syllable of the world's names appears often enough to become one
    # token, whatever the corpus holds, so unseen names and years tokenize like seen ones.
    syllables = [o + v + c for o in ONSETS for v in VOWELS for c in dict.fromkeys(CODAS)]
    extra = [
        " ".join(f"in {y}" for y in YEARS),
        " ".join(s.capitalize() for s in syllables),
        " ".join("Ba" + s for s in syllables),
    ] * 3
    tok.train_from_iterator(_chain(texts, extra), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(TAGS),
    )
    fast.padding_side = "left"
    return fast


def _chain(*iterables: Iterable[str]) -> Iterable[str]:
    for it in iterables:
        yield from it


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerFast:
    """A saved tiny tokenizer or any hub tokenizer, with no tokens added: a hub tokenizer's
    tags stay text (added tags would land on Qwen2.5's never-trained embedding rows).

    A tiny tokenizer saved next to a Qwen2 model (a policy directory) must not go through
    AutoTokenizer: it picks the class from the model's config (Qwen2Tokenizer), which
    replaces our syllable pre-tokenizer with byte-level BPE, silently changing every id.
    A `.gguf` file or a shipped model's short name reads the tokenizer of its de-quantized
    cache (mem1_core.models.gguf)."""
    from mem1_core.models.gguf import resolve_pretrained

    name_or_path = resolve_pretrained(name_or_path)
    config = Path(name_or_path) / "tokenizer_config.json"
    tok = None
    if config.is_file():
        cls = json.loads(config.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            tok = PreTrainedTokenizerFast.from_pretrained(str(name_or_path))
    if tok is None:
        tok = AutoTokenizer.from_pretrained(str(name_or_path))
    _pad_left(tok)
    return tok


def _pad_left(tok) -> None:
    """Rollouts batch left-padded contexts; a tokenizer without a pad token pads with EOS."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"


def tag_ids(tok) -> dict[str, int]:
    """Tag text -> its single token id; raises if a tag is not a single token."""
    ids = {}
    for t in TAGS:
        enc = tok.encode(t, add_special_tokens=False)
        if len(enc) != 1:
            raise ValueError(f"tag {t} is not a single token in this tokenizer: {enc}")
        ids[t] = enc[0]
    return ids


# Qwen2.5's pre-tokenizer pattern (its tokenizer.json): letters with one leading non-letter,
# single digits, punctuation runs with their newlines. So a tag is never one token: `</query>`
# is `</`, `query`, `>` or `>.\n`-like pieces, as in the real tokenizer.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
HUB_EOS = "<|endoftext|>"


def train_byte_level_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A stand-in for a pretrained hub tokenizer: byte-level BPE with Qwen2.5's pre-tokenizer
    and its `<|endoftext|>` (EOS and pad), trained on `texts`; MEM1's tags are not tokens of it."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[HUB_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=HUB_EOS, pad_token=HUB_EOS)
    fast.padding_side = "left"
    return fast
