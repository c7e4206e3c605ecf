"""What an agent did on a task, beyond its score: the behaviour rows that tell apart the ways a
long task fails (docs/design.md §11: answering early, forgetting, wrong retrieval).

Per task, from its trajectory alone:
- `answered`: the objectives its `<answer>` answers: the parts of `a1; a2; …` that are neither
  empty nor `?` (the teacher's "unknown"); 0 when it never answered;
- `queries`, `distinct_queries`: the searches it issued (valid query turns), and how many of them
  differ once normalised (SQuAD normalisation);
- `turns`, `turns_budget`: the turns it used and the turn budget of its task;
- `early`: 1 when it answered with fewer distinct queries than the task has objectives (it cannot
  have searched every one of them), 0 when it answered after as many, None when it never
  answered;
- `format_errors`: its invalid turns;
- `found`: the fraction of objectives whose gold answer (any alias, normalised, as whole words)
  appeared in an `<info>` it received (retrieval reached it);
- `retention`: of the objectives found, the fraction whose gold answer is still in the last
  `<IS>` before the answer (the answering turn's own, or the last written where it never
  answered) or in the answer itself; None where nothing was found. Reported for MEM1 agents
  (the memory policies `mem1`, `mem1+recall`), for whom the `<IS>` is the only memory.

The paper reports none of these; they are this project's diagnosis of the horizon failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mem1_core.data.metrics import mentions, normalize_answer
from mem1_core.data.prompts import IS_CLOSE, IS_OPEN, UNKNOWN, split_answers
from mem1_core.trajectory.record import Action, Trajectory, Turn

BEHAVIOUR = ("answered", "queries", "distinct_queries", "turns", "turns_budget", "early",
             "format_errors", "found", "retention")  # fmt: skip
"""The behaviour figures of a task, in the order the tables show them."""
RETAINING_MEMORIES = ("mem1", "mem1+recall")
"""The memory policies whose `<IS>` is the agent's memory: retention is theirs."""


def last_state(turns: list[Turn]) -> str:
    """The text of the last complete `<IS> … </IS>` the turns wrote ('' if none)."""
    for turn in reversed(turns):
        text = turn.gen_text
        end = text.rfind(IS_CLOSE)
        start = text.rfind(IS_OPEN, 0, end) if end >= 0 else -1
        if start >= 0:
            return text[start + len(IS_OPEN) : end]
    return ""


def _info_body(text: str) -> str:
    """An `<info>` block without its last line (the environment's hint, which is no result)."""
    return text.rsplit("\n", 1)[0] if "\n" in text else text


def task_behaviour(tr: Trajectory) -> dict[str, Any]:
    """The behaviour figures (BEHAVIOUR) of one trajectory; see the module's docstring."""
    n = tr.n_objectives
    answered_at = next((k for k, t in enumerate(tr.turns) if t.action is Action.ANSWER), None)
    upto = tr.turns if answered_at is None else tr.turns[: answered_at + 1]
    queries = [t.query for t in upto if t.action is Action.QUERY and t.query]
    distinct = len({normalize_answer(q) for q in queries})
    parts = split_answers(tr.answer) if tr.answer is not None else []
    answered = sum(1 for p in parts if p and p != UNKNOWN)
    infos = [_info_body(t.info_text) for t in upto if t.info_text]
    found = [
        k for k, golds in enumerate(tr.golden_answers) if any(mentions(x, golds) for x in infos)
    ]
    retention = None
    if found and tr.memory in RETAINING_MEMORIES:
        memory = last_state(upto) + "\n" + (tr.answer or "")
        retention = sum(mentions(memory, tr.golden_answers[k]) for k in found) / len(found)
    return {
        "answered": float(answered),
        "queries": float(len(queries)),
        "distinct_queries": float(distinct),
        "turns": float(len(tr.turns)),
        "turns_budget": float(tr.max_turns),
        "early": None if answered_at is None else float(distinct < n),
        "format_errors": float(sum(1 for t in tr.turns if t.format_error)),
        "found": len(found) / n if n else None,
        "retention": retention,
    }


COLUMNS = ["task_id", "memory", "golden_answers", "answer", "max_turns", "turn_action",
            "turn_gen_text", "turn_info_text", "turn_query", "turn_format_error"]  # fmt: skip


def read_behaviour(path: str | Path) -> dict[str, dict[str, Any]] | None:
    """Task id -> its behaviour figures, from an evaluation cell's trajectories (Parquet);
    None for a file without the turns' columns (scores alone: no behaviour to read)."""
    import pyarrow.parquet as pq

    if not set(COLUMNS) <= set(pq.read_schema(path).names):
        return None
    return behaviour_of_rows(pq.read_table(path, columns=COLUMNS).to_pylist())


def behaviour_of_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Task id -> its behaviour figures, from a cell's trajectory rows (with _COLUMNS)."""
    out = {}
    for r in rows:
        turns = [
            Turn(context=[], gen_ids=[], gen_logprobs=[], action=Action(a), gen_text=g or "",
                 info_text=i or "", query=q, format_error=e)
            for a, g, i, q, e in zip(r["turn_action"], r["turn_gen_text"], r["turn_info_text"],
                                     r["turn_query"], r["turn_format_error"], strict=True)
        ]  # fmt: skip
        tr = Trajectory(r["task_id"], r["memory"], [], r["golden_answers"], turns,
                        answer=r["answer"], max_turns=r["max_turns"])  # fmt: skip
        out[str(r["task_id"])] = task_behaviour(tr)
    return out
