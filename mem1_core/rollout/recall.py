"""Recall: a retrieval backstop for pruned memory (the `mem1+recall` memory, an extension beyond the paper).

Under MEM1 every `<info>` block older than the last turn is pruned; the agent's `<IS>` is its
only memory, so a fact it failed to fold in is gone. Under `mem1+recall` each pruned block
stays in a per-trajectory store, and a query written with a fixed prefix,
`<query> recall: Loshu Lor</query>`, is answered from that store instead of the retriever:
the past block that scores best under BM25 comes back as that turn's `<info>` (with the
usual turns-left hint). One block at a time, so the context stays as bounded as MEM1's.

Departures and choices, all deliberate:
- No new tag and no new prompt text: recall is an ordinary `<query>`, so the format
  fingerprint of the shipped base (mem1_core.models.base) is unchanged. Under every other
  memory a `recall: …` query is an ordinary search. The agent is not told recall exists; the
  scripted teacher demonstrates it (mem1_core.qa.teacher) and SFT / RL carry it over.
- The store is a pure function of the trajectory: the bodies of the `<info>` blocks the
  retriever returned on earlier turns (not format hints, not earlier recalls, which copy a
  block already stored). Every stored block is absent from the context in which the recalled
  block is read (MEM1 keeps only the newest one there, and the recall replaces it).
- BM25 (Robertson & Zaragoza 2009, with Lucene's non-negative idf) over lower-cased word
  tokens, k1 = 1.5, b = 0.75, computed here: a store holds at most one block per turn, so an
  index would cost more than it saves. `bm25s`'s `lucene` method (the project's retriever)
  gives the same scores divided by (k1 + 1), the same ranking. Ties go to the earliest block;
  no matching term at all gives "No results.", as an empty search does.
- The recalled block's ids are that turn's info ids, recorded like any other `<info>`, so
  every context is still rebuilt from id segments and the exactness contract holds.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from mem1_core.rollout.environment import NO_RESULTS, info_body
from mem1_core.rollout.memory import has_recall
from mem1_core.trajectory.record import Action, Trajectory

RECALL_PREFIX = "recall:"
"""A query that starts with this (case-insensitive) asks the store, under a recall memory."""
BM25_K1, BM25_B = 1.5, 0.75

_WORD = re.compile(r"\w+")


def terms(text: str) -> list[str]:
    """BM25's tokens: lower-cased runs of word characters (names stay whole, no stemming)."""
    return _WORD.findall(text.lower())


def bm25_scores(
    query: list[str], docs: list[list[str]], k1: float = BM25_K1, b: float = BM25_B
) -> list[float]:
    """BM25 of each doc for the query (each distinct query term counted once).
    query: terms; docs: D lists of terms -> D scores.

    score(q, d) = sum_{t in set(q)} idf(t) * tf(t,d) (k1 + 1) / (tf(t,d) + k1 (1 - b + b |d| / avgdl)),
    idf(t) = ln(1 + (D - df(t) + 0.5) / (df(t) + 0.5))."""
    if not docs:
        return []
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n or 1.0
    counts = [Counter(d) for d in docs]
    df = Counter(t for c in counts for t in c)
    scores = []
    for d, c in zip(docs, counts, strict=True):
        norm = k1 * (1 - b + b * len(d) / avgdl)
        s = 0.0
        for t in set(query):
            tf = c.get(t, 0)
            if tf:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * tf * (k1 + 1) / (tf + norm)
        scores.append(s)
    return scores


def recall_query(query: str | None) -> str | None:
    """The text a recall asks for (`recall: Loshu Lor` -> `Loshu Lor`), None if not a recall."""
    if query is None:
        return None
    q = query.strip()
    if not q.lower().startswith(RECALL_PREFIX):
        return None
    return q[len(RECALL_PREFIX) :].strip()


def is_recall(traj: Trajectory, t: int) -> bool:
    """Whether turn t of the trajectory was a recall: a `recall:` query under a recall memory."""
    turn = traj.turns[t]
    return (
        has_recall(traj.memory)
        and turn.action is Action.QUERY
        and recall_query(turn.query) is not None
    )


def recall_count(traj: Trajectory) -> int:
    return sum(is_recall(traj, t) for t in range(len(traj.turns)))


def store(traj: Trajectory) -> list[tuple[int, str]]:
    """(turn, body) of every block the retriever returned on the trajectory's turns so far,
    oldest first: what a recall searches."""
    return [
        (t, info_body(turn.info_text))
        for t, turn in enumerate(traj.turns)
        if turn.action is Action.QUERY and turn.info_text and not is_recall(traj, t)
    ]


def best_block(query: str, blocks: list[str]) -> str | None:
    """The block BM25 ranks first for the query (the earliest on a tie), None if no block
    shares a term with it."""
    scores = bm25_scores(terms(query), [terms(b) for b in blocks])
    if not scores or max(scores) <= 0.0:
        return None
    return blocks[scores.index(max(scores))]


def recall(traj: Trajectory, query: str) -> str:
    """The body of the `<info>` a recall of `query` gets: the best past block, or NO_RESULTS."""
    found = best_block(query, [body for _, body in store(traj)])
    return NO_RESULTS if found is None else found
