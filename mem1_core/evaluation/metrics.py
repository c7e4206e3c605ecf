"""Answer scoring (SQuAD normalisation, EM and F1 per objective) and the efficiency metrics
of docs/design.md §5 (peak tokens, dependency)."""

from __future__ import annotations

import re
import string
from collections import Counter

from mem1_core.data.prompts import UNKNOWN, split_answers

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD: lowercase, drop punctuation and articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, golds: list[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def f1_score(prediction: str, golds: list[str]) -> float:
    best = 0.0
    pred = normalize_answer(prediction).split()
    for g in golds:
        gold = normalize_answer(g).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred), common / len(gold)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def score_answer(
    answer_text: str | None, golden: list[list[str]]
) -> tuple[list[float], list[float]]:
    """EM and F1 per objective: answers split on `;` in question order; missing ones score 0."""
    preds = split_answers(answer_text) if answer_text is not None else []
    em = [exact_match(preds[i], g) if i < len(preds) else 0.0 for i, g in enumerate(golden)]
    f1 = [f1_score(preds[i], g) if i < len(preds) else 0.0 for i, g in enumerate(golden)]
    return em, f1


def unknown_rate(answers: list[str | None]) -> float:
    """Fraction of the objectives answered `?` in the given final answers (None: no answer,
    not counted): the mark of a fact the agent dropped from its memory, the habit of a
    forgetful teacher (mem1_core.rollout.teacher)."""
    parts = [a for text in answers if text is not None for a in split_answers(text)]
    return sum(a == UNKNOWN for a in parts) / max(len(parts), 1)


def peak_tokens(turn_lengths: list[tuple[int, int]]) -> int:
    """max over turns of (context tokens + tokens generated that turn), prompt included."""
    return max((c + g for c, g in turn_lengths), default=0)


def dependency(turn_lengths: list[tuple[int, int]]) -> int:
    """The paper's dependency: the sum over generated tokens of the number of tokens each
    attends to (its context plus the tokens generated before it in the turn)."""
    return sum(g * c + g * (g - 1) // 2 for c, g in turn_lengths)
