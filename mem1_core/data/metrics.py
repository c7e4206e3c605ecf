"""Answer scoring (EM and F1 per objective) and the efficiency metrics of docs/design.md §5
(peak tokens, dependency).

Two scorers, one signature (`Scorer`), chosen by `eval.scorer`:
- `squad` (the default): SQuAD normalisation, answers split on `;` and matched in order. It is
  MEM1's training reward and Search-R1's EM, so training and evaluation read one number.
- `mem1-paper`: MIT-MI/MEM1 `Mem1/inference/eval.py` (`compute_score`, `preprocess_text`), for
  numbers set beside the paper's. Stricter: punctuation becomes a space (so `Hay-Bunau` is two
  words, not `haybunau`), articles stay, a task whose answer does not have exactly N
  `;`-separated parts scores 0 on every objective, and F1 is over word *sets*. Departure: that
  script finds the last `<answer>…</answer>` in the whole solution text and gives 0 when the
  tags are unbalanced; here the environment's parse of the final turn (mem1_core.qa.env)
  supplies the answer, and an unparsable turn has none (0 as well).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable

from mem1_core.data.prompts import ANSWER_SEPARATOR, UNKNOWN, split_answers

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """SQuAD: lowercase, drop punctuation and articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def mentions(text: str, golds: list[str]) -> bool:
    """Whether any gold alias, normalised, appears in the normalised `text` as whole words."""
    padded = f" {normalize_answer(text)} "
    return any((g := normalize_answer(x)) and f" {g} " in padded for x in golds)


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


def paper_normalize(s: str) -> str:
    """MEM1's `preprocess_text`: lowercase, each punctuation character turned into a space
    (articles kept), whitespace collapsed and stripped."""
    s = "".join(" " if ch in _PUNCT else ch for ch in s.lower())
    return " ".join(s.split())


def _set_f1(pred: str, gold: str) -> float:
    """F1 over the word sets of two normalised strings (0 when either is empty)."""
    p, g = set(pred.split()), set(gold.split())
    common = len(p & g)
    if not p or not g or not common:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def score_answer_paper(
    answer_text: str | None, golden: list[list[str]]
) -> tuple[list[float], list[float]]:
    """EM and F1 per objective as MIT-MI/MEM1's eval.py scores them: all 0 unless the answer
    splits on `;` into exactly N parts; then part i against objective i's aliases."""
    zeros = [0.0] * len(golden)
    if answer_text is None:
        return zeros, list(zeros)
    preds = [paper_normalize(a) for a in answer_text.split(ANSWER_SEPARATOR)]
    if len(preds) != len(golden):  # eval.py: `if len(answers) != len(ground_truths): return 0`
        return zeros, list(zeros)
    em, f1 = [], []
    for pred, aliases in zip(preds, golden, strict=True):
        gold = [paper_normalize(g) for g in aliases]
        em.append(float(pred in gold))
        f1.append(max((_set_f1(pred, g) for g in gold), default=0.0))
    return em, f1


Scorer = Callable[[str | None, list[list[str]]], tuple[list[float], list[float]]]
"""(final answer text or None, gold aliases per objective) -> (EM, F1) per objective."""

SCORERS: dict[str, Scorer] = {"squad": score_answer, "mem1-paper": score_answer_paper}
"""`eval.scorer` -> its scorer (mem1_core.config.evaluation.SCORER_NAMES lists the names)."""


def unknown_rate(answers: list[str | None]) -> float:
    """Fraction of the objectives answered `?` in the given final answers (None: no answer,
    not counted): the mark of a fact the agent dropped from its memory, the habit of a
    forgetful teacher (mem1_core.qa.teacher)."""
    parts = [a for text in answers if text is not None for a in split_answers(text)]
    return sum(a == UNKNOWN for a in parts) / max(len(parts), 1)


def peak_tokens(turn_lengths: list[tuple[int, int]]) -> int:
    """max over turns of (context tokens + tokens generated that turn), prompt included."""
    return max((c + g for c, g in turn_lengths), default=0)


def dependency(turn_lengths: list[tuple[int, int]]) -> int:
    """The paper's dependency: the sum over generated tokens of the number of tokens each
    attends to (its context plus the tokens generated before it in the turn)."""
    return sum(g * c + g * (g - 1) // 2 for c, g in turn_lengths)
