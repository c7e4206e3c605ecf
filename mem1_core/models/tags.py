"""How a tokenizer encodes MEM1's tags: one special token each, or plain text.

Two schemes behind one interface (docs/design.md §8, "Tags: single tokens only where we own
the vocabulary"):
- `special`: the tiny tokenizer, which we train, has each of the eight tags as one special
  token. A turn's tags are found as token ids; a turn stops on the id of `</query>` or
  `</answer>`.
- `text`: a pretrained (hub) tokenizer keeps the tags as ordinary text, a few tokens each.
  Tokens added to it would land on embedding rows the base model never trained (Qwen2.5:
  ids 151,665+), so it could not read or write the format the prompt describes; MEM1 and
  Search-R1 keep their tags as text for that reason. A turn's tags are found in the decoded
  text of its generated ids, and a turn stops once that text contains `</query>` or
  `</answer>` (the token that completes one may carry more characters; they stay in the turn).

Either way contexts are built from id segments (docs/design.md §4.1): only the reading of a
generated turn (where its tags are, what its action says) goes through text.
"""

from __future__ import annotations

import bisect
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mem1_core.data.prompts import IS_CLOSE, IS_OPEN, TAGS


def turn_text(tok, ids: Sequence[int]) -> str:
    """The text of generated ids, as the environment and the stop strings read it: special
    tokens kept (an EOS is part of what was generated), no space clean-up."""
    return tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class TagSpan:
    """One tag found in a generated turn."""

    tag: str
    start: int
    """Where it starts in the scheme's reading of the turn: a character of the decoded text
    (`text`) or a token index (`special`). Orders the tags of a turn."""
    end: int
    """One past where it ends, in the same units."""
    first: int
    """Index of the token in which it starts."""
    last: int
    """Index of the token that completes it."""


class TagCodec(ABC):
    """What the environment, the memory policy and the stop rule need to know about tags."""

    scheme: str

    @abstractmethod
    def find(self, ids: Sequence[int]) -> list[TagSpan]:
        """Every tag in the generated ids, in order."""

    @abstractmethod
    def between(self, ids: Sequence[int], a: TagSpan, b: TagSpan) -> str:
        """The text between two tags of `ids` (a before b), stripped: a query or an answer."""

    @abstractmethod
    def stops(self, tags: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """What ends a turn that writes one of `tags`: (stop token ids, stop strings)."""

    @abstractmethod
    def before(self, ids: Sequence[int], a: TagSpan) -> str:
        """The text of `ids` before tag `a`, stripped (what a turn wrote outside its tags)."""

    def state_start(self, ids: Sequence[int]) -> int:
        """Index of the token where the turn's first `<IS>` starts, 0 if it has none (what
        MEM1 carries into the next context: mem1_core.rollout.memory)."""
        return next((s.first for s in self.find(ids) if s.tag == IS_OPEN), 0)

    def state_span(self, ids: Sequence[int]) -> tuple[int, int] | None:
        """Token slice [start, end) of the turn's first `<IS> … </IS>`, None if it has no
        closed state (what MEM1 keeps of an invalid turn: mem1_core.rollout.memory)."""
        spans = self.find(ids)
        opened = next((s for s in spans if s.tag == IS_OPEN), None)
        if opened is None:
            return None
        closed = next((s for s in spans if s.tag == IS_CLOSE and s.start > opened.start), None)
        return None if closed is None else (opened.first, closed.last + 1)


class SpecialTags(TagCodec):
    """Each tag is one special token (the tiny tokenizer)."""

    scheme = "special"

    def __init__(self, tok):
        from mem1_core.models.tokenizer import tag_ids

        self.tok = tok
        self.ids = tag_ids(tok)
        self._tag_of = {i: t for t, i in self.ids.items()}

    def find(self, ids: Sequence[int]) -> list[TagSpan]:
        return [
            TagSpan(self._tag_of[t], i, i + 1, i, i) for i, t in enumerate(ids) if t in self._tag_of
        ]

    def between(self, ids: Sequence[int], a: TagSpan, b: TagSpan) -> str:
        return self.tok.decode(list(ids[a.last + 1 : b.first]), skip_special_tokens=True).strip()

    def before(self, ids: Sequence[int], a: TagSpan) -> str:
        return self.tok.decode(list(ids[: a.first]), skip_special_tokens=True).strip()

    def stops(self, tags: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return tuple(self.ids[t] for t in tags), ()


_TAG_RE = re.compile("|".join(re.escape(t) for t in TAGS))


class TextTags(TagCodec):
    """Tags are plain text (a pretrained tokenizer); found in the decoded turn."""

    scheme = "text"

    def __init__(self, tok):
        self.tok = tok

    def find(self, ids: Sequence[int]) -> list[TagSpan]:
        text = turn_text(self.tok, ids)
        matches = list(_TAG_RE.finditer(text))
        if not matches:
            return []
        ends = token_ends(self.tok, ids, text)

        def tok_at(p: int) -> int:  # the token holding character p: the first that ends past it
            return min(bisect.bisect_right(ends, p), len(ids) - 1)

        return [
            TagSpan(m.group(), m.start(), m.end(), tok_at(m.start()), tok_at(m.end() - 1))
            for m in matches
        ]

    def between(self, ids: Sequence[int], a: TagSpan, b: TagSpan) -> str:
        return turn_text(self.tok, ids)[a.end : b.start].strip()

    def before(self, ids: Sequence[int], a: TagSpan) -> str:
        return turn_text(self.tok, ids)[: a.start].strip()

    def stops(self, tags: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        return (), tuple(tags)


def token_ends(tok, ids: Sequence[int], text: str) -> list[int]:
    """ends[k]: how many characters of `text` (= turn_text(tok, ids)) tokens 0..k decode to.

    One pass of the tokenizers library's streaming decoder (what vLLM detokenizes with): a
    token that ends inside a multi-byte character yields nothing until the character is
    complete. If the stream does not reproduce `text` (a decoder it does not cover), each
    prefix is decoded on its own instead: slower, same definition."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and ids:
        from tokenizers.decoders import DecodeStream

        stream, pieces, ends = DecodeStream(skip_special_tokens=False), [], []
        for i in ids:
            pieces.append(stream.step(backend, int(i)) or "")
            ends.append(ends[-1] + len(pieces[-1]) if ends else len(pieces[-1]))
        streamed = "".join(pieces)
        # what the stream still holds back is an unfinished character at the very end
        if text.startswith(streamed) and len(text) - len(streamed) <= 4:
            ends[-1] = len(text)
            return ends
    ends, top = [], 0
    for k in range(len(ids)):
        top = max(top, len(turn_text(tok, ids[: k + 1])))
        ends.append(min(top, len(text)))
    return ends


TAG_SCHEMES: dict[str, Callable[..., TagCodec]] = {"special": SpecialTags, "text": TextTags}


def tag_scheme(tok) -> str:
    """`special` if every tag is one added token of `tok` (the tiny tokenizer, or a policy
    saved when hub tokenizers still got the tags added), else `text`."""
    added = tok.get_added_vocab()
    single = all(t in added and tok.encode(t, add_special_tokens=False) == [added[t]] for t in TAGS)
    return "special" if single else "text"


def tag_codec(tok, scheme: str | None = None) -> TagCodec:
    """The codec of `tok`'s tags; `scheme` forces one (`special` needs single-token tags)."""
    scheme = scheme or tag_scheme(tok)
    if scheme not in TAG_SCHEMES:
        raise ValueError(f"unknown tag scheme {scheme!r}; choose one of {sorted(TAG_SCHEMES)}")
    return TAG_SCHEMES[scheme](tok)
