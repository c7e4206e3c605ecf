"""Trajectories a person can read: what an agent kept in `<IS>` turn by turn, what it asked,
what came back, how many tokens its context held (and how many the memory policy pruned),
and its outcome as its domain tells it (`Domain.sample_outcome`: which objectives came out
right; in WebShop, what was bought and its reward). One view of a trajectory (`turn_views`,
the outcome), rendered as markdown (the evaluation's per-agent sample artifact,
`eval/samples/<agent>.md`) or as text (`mem1 show`).

Samples are the first test tasks of an N (`SAMPLE_TASKS`), at N=2 (what the paper trains on)
and at the largest N evaluated, so every run and every night shows the same tasks.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mem1_core.data.prompts import ANSWER_CLOSE, ANSWER_OPEN, IS_CLOSE, IS_OPEN
from mem1_core.domains.outcome import Outcome, objectives_outcome
from mem1_core.rollout.environment import info_body
from mem1_core.runs import atomic
from mem1_core.trajectory.record import Action, Trajectory, read_trajectories

SAMPLE_TASKS = 2
"""Test tasks shown per agent and N: the first ones, so runs and nights show the same."""
INFO_CHARS = 240
"""An `<info>` block is trimmed to this many characters: enough to see what the search found."""
TRAIN_N = 2
"""The N the paper trains on; the samples show it beside the largest N."""

Describe = Callable[[Trajectory, Sequence[str] | None], Outcome]
"""How a domain tells a trajectory's outcome (`Domain.sample_outcome`); QA's by default."""


@dataclass(frozen=True)
class TurnView:
    """One turn as a reader sees it."""

    turn: int
    """1-based."""
    state: str | None
    """The `<IS>` the agent wrote (None: the turn had none)."""
    query: str | None
    answer: str | None
    """The `<answer>` text, on the turn that answered."""
    info: str | None
    """The `<info>` body that came back, trimmed to `INFO_CHARS` (None: no info)."""
    info_chars: int
    """The untrimmed body's length."""
    context_tokens: int
    """Tokens the agent read this turn (prompt included)."""
    generated_tokens: int
    pruned_tokens: int
    """Tokens of the history so far (prompt, every turn and info before this one) that the
    memory policy left out of this turn's context: 0 under full context."""
    format_error: str | None


def _between(text: str, open_tag: str, close_tag: str) -> str | None:
    m = re.search(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), text, re.DOTALL)
    return m.group(1).strip() if m else None


def _info(text: str) -> str:
    if not text:
        return ""
    try:
        return info_body(text).strip()
    except ValueError:  # not the environment's block (never expected): show it as it is
        return text.strip()


def turn_views(traj: Trajectory, info_chars: int = INFO_CHARS) -> list[TurnView]:
    """Each turn of `traj` as a reader sees it (see TurnView)."""
    views = []
    history = len(traj.prompt_ids)  # tokens written so far: prompt, then each turn and its info
    for t, turn in enumerate(traj.turns):
        body = _info(turn.info_text)
        views.append(
            TurnView(
                turn=t + 1,
                state=_between(turn.gen_text, IS_OPEN, IS_CLOSE),
                query=turn.query,
                answer=_between(turn.gen_text, ANSWER_OPEN, ANSWER_CLOSE)
                if turn.action is Action.ANSWER
                else None,
                info=(body[:info_chars] if body else None),
                info_chars=len(body),
                context_tokens=turn.context_tokens,
                generated_tokens=len(turn.gen_ids),
                pruned_tokens=history - turn.context_tokens,
                format_error=turn.format_error,
            )
        )
        history += len(turn.gen_ids) + len(turn.info_ids)
    return views


def _title(traj: Trajectory, outcome: Outcome) -> str:
    return (
        f"task `{traj.task_id}` (N={traj.n_objectives}): {outcome.summary}, "
        f"{len(traj.turns)} turns, peak {traj.peak_tokens} tokens"
    )


def _md(text: str) -> str:
    """Model or corpus text made inert in markdown: HTML escaped (a `<tag>` would vanish in the
    UI), emphasis and link characters escaped, on one line."""
    text = html.escape(" ".join(text.split()), quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def trajectory_markdown(
    traj: Trajectory,
    questions: Sequence[str] | None = None,
    describe: Describe = objectives_outcome,
) -> str:
    """One trajectory: its outcome (QA: each objective's question, gold, answer, right or not;
    `describe`: its domain's), then each turn."""
    outcome = describe(traj, questions)
    lines = [f"### {_title(traj, outcome)}", ""]
    for m in outcome.marks:
        q = f"{_md(m.question)} — " if m.question else ""
        said = "no answer" if m.answered is None else f"answered “{_md(m.answered)}”"
        gold = " / ".join(_md(g) for g in m.gold)
        # words, not emoji: a browser without an emoji font draws empty boxes (seen in Chromium)
        lines.append(
            f"{m.index}. {'**right**' if m.right else '**wrong**'}: {q}gold “{gold}”, {said}"
        )
    lines += [f"- {label}: {_md(text)}" for label, text in outcome.facts]
    lines.append("")
    for v in turn_views(traj):
        lines.append(
            f"**Turn {v.turn}** · {v.context_tokens} tokens in context ({v.pruned_tokens} pruned)"
            f" · {v.generated_tokens} generated"
        )
        lines.append("")
        for label, text in _turn_fields(v):
            shown = "_(none)_" if text is None else _md(text)
            lines.append(f"- {f'`{label}`' if label.startswith('<') else label} {shown}")
        lines.append("")
    return "\n".join(lines)


def _turn_fields(v) -> list[tuple[str, str | None]]:
    """(label, text) of what a turn wrote and read, in the order both renderers show them:
    the state (None: none written), the action, a format error, the trimmed `<info>`."""
    fields: list[tuple[str, str | None]] = [("<IS>", v.state)]
    if v.query is not None:
        fields.append(("<query>", v.query))
    if v.answer is not None:
        fields.append(("<answer>", v.answer))
    if v.format_error:
        fields.append(("invalid turn:", v.format_error))
    if v.info is not None:
        more = (
            f" … (+{v.info_chars - len(v.info)} characters)" if v.info_chars > len(v.info) else ""
        )
        fields.append(("<info>", v.info + more))
    return fields


def trajectory_text(
    traj: Trajectory,
    questions: Sequence[str] | None = None,
    info_chars: int = INFO_CHARS,
    describe: Describe = objectives_outcome,
) -> str:
    """The same for a terminal (`mem1 show`)."""
    outcome = describe(traj, questions)
    lines = [_title(traj, outcome).replace("`", ""), ""]
    for m in outcome.marks:
        q = f"{m.question}\n      " if m.question else ""
        said = "(no answer)" if m.answered is None else m.answered
        lines.append(
            f"  Q{m.index} [{'right' if m.right else 'wrong'}] {q}gold: {' / '.join(m.gold)}"
            f"  answered: {said}"
        )
    lines += [f"  {label}: {' '.join(text.split())}" for label, text in outcome.facts]
    for v in turn_views(traj, info_chars):
        lines += [
            "",
            f"turn {v.turn}: {v.context_tokens} tokens in context, {v.pruned_tokens} pruned, "
            f"{v.generated_tokens} generated",
        ]
        for label, text in _turn_fields(v):
            shown = "(none)" if text is None else " ".join(text.split())
            lines.append(f"  {label:<8} {shown}" if label.startswith("<") else f"  {label} {shown}")
    return "\n".join(lines) + "\n"


def sample_ns(ns: Sequence[int]) -> list[int]:
    """The N whose samples are shown: N=2 (if evaluated) and the largest N."""
    return sorted({n for n in ns if n == TRAIN_N} | ({max(ns)} if ns else set()))


def trajectory_file(eval_dir: str | Path, agent: str, n: int) -> Path:
    """Where the evaluation wrote an agent's trajectories at N (mem1_core.evaluation.scaling)."""
    return Path(eval_dir) / "trajectories" / f"{agent}_n{n}.parquet"


def samples_markdown(
    agent: str,
    memory: str,
    by_n: Mapping[int, Sequence[Trajectory]],
    questions: Mapping[str, Sequence[str]] | None = None,
    describe: Describe = objectives_outcome,
) -> str:
    """An agent's sample artifact: per N (ascending), its first `SAMPLE_TASKS` trajectories.
    `questions`: task id -> its questions, where known; `describe`: how the domain tells an
    outcome."""
    lines = [
        f"# Sample trajectories: {agent} (memory `{memory}`)",
        "",
        f"The first {SAMPLE_TASKS} test tasks at each N (the same in every run). Each turn: the "
        "`<IS>` the agent wrote (under `mem1` its only memory), its query or answer, the "
        "`<info>` that came back (trimmed), and its context: tokens read, and tokens of the "
        "history so far that the memory policy pruned.",
        "",
    ]
    for n, trajs in sorted(by_n.items()):
        lines += [f"## N = {n}", ""]
        for t in trajs[:SAMPLE_TASKS]:
            lines.append(trajectory_markdown(t, (questions or {}).get(t.task_id), describe))
    return "\n".join(lines)


def write_samples(
    eval_dir: str | Path,
    agents: Mapping[str, str],
    ns: Sequence[int],
    questions: Mapping[str, Sequence[str]] | None = None,
    describe: Describe = objectives_outcome,
) -> dict[str, Path]:
    """eval/samples/<agent>.md for each agent (name -> memory) from its written trajectories
    at `sample_ns(ns)`, each outcome as `describe` (the run's Domain.sample_outcome) tells it;
    -> agent -> path."""
    out = {}
    for agent, memory in agents.items():
        by_n = {
            n: read_trajectories(trajectory_file(eval_dir, agent, n))[:SAMPLE_TASKS]
            for n in sample_ns(ns)
            if trajectory_file(eval_dir, agent, n).is_file()
        }
        text = samples_markdown(agent, memory, by_n, questions, describe)
        out[agent] = atomic.write_text(text, Path(eval_dir) / "samples" / f"{agent}.md")
    return out
