"""Trajectories a person can read (mem1_core.evaluation.samples, `mem1 show`) on trajectories
built by hand, whose turns, tokens and pruning are known by construction; and the evaluation
stage's artifacts on the smoke profile."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from mem1_core.domains.outcome import objective_marks
from mem1_core.evaluation.samples import (
    SAMPLE_TASKS,
    sample_ns,
    samples_markdown,
    trajectory_markdown,
    trajectory_text,
    turn_views,
)
from mem1_core.trajectory.record import (
    Action,
    SegmentKind,
    SegmentRef,
    Trajectory,
    Turn,
    write_trajectories,
)

PROMPT = list(range(10))
INFO_1 = "<info>Doc 1 (Title: Venir Nes) Venir Nes (born 1821) was a poet.\n[HINT] You have 2 turns left.</info>"


def _mem1_trajectory(memory: str = "mem1") -> Trajectory:
    """Three turns: query, query, answer. Under `mem1` turn t reads the prompt and turn t-1's
    generation and info; under `full` everything so far."""
    gens = [
        ("<IS> Start. </IS><query> Venir Nes</query>", 5, Action.QUERY, "Venir Nes"),
        ("<IS> Q1: 1821. </IS><query> Bunman Vi</query>", 6, Action.QUERY, "Bunman Vi"),
        ("<IS> Q1: 1821. Q2: 1749. </IS><answer> 1821; 1750</answer>", 4, Action.ANSWER, None),
    ]
    infos = [(INFO_1, 7), ("<info>" + "x" * 500 + "\n[HINT] last turn.</info>", 8), ("", 0)]
    t = Trajectory("task-0", memory, PROMPT, [["1821"], ["1749"]], answer="1821; 1750")
    t.em, t.f1 = [1.0, 0.0], [1.0, 0.0]
    for i, ((text, n_gen, action, query), (info, n_info)) in enumerate(
        zip(gens, infos, strict=True)
    ):
        ctx = [SegmentRef(SegmentKind.PROMPT)]
        earlier = range(i) if memory == "full" else range(max(i - 1, 0), i)
        for s in earlier:
            ctx += [SegmentRef(SegmentKind.GEN, s), SegmentRef(SegmentKind.INFO, s)]
        t.turns.append(
            Turn(
                ctx, [100 + i] * n_gen, [0.0] * n_gen, action, [200 + i] * n_info, text, info, query
            )
        )
        t.turns[-1].context_tokens = len(t.context_ids(i))
    return t


def _history(t: Trajectory, turn: int) -> int:
    """Every token written before `turn`, by brute force: prompt, then each turn and its info."""
    ids = list(t.prompt_ids)
    for s in range(turn):
        ids += t.turns[s].gen_ids + t.turns[s].info_ids
    return len(ids)


def test_each_turn_shows_state_query_info_answer_and_tokens():
    t = _mem1_trajectory()
    views = turn_views(t, info_chars=30)
    assert [v.state for v in views] == ["Start.", "Q1: 1821.", "Q1: 1821. Q2: 1749."]
    assert [v.query for v in views] == ["Venir Nes", "Bunman Vi", None]
    assert [v.answer for v in views] == [None, None, "1821; 1750"]
    assert views[0].info == "Doc 1 (Title: Venir Nes) Venir"  # trimmed, without the hint
    assert views[1].info_chars == 500 and views[2].info is None
    assert [v.context_tokens for v in views] == [10, 22, 24]
    assert [v.generated_tokens for v in views] == [5, 6, 4]


@pytest.mark.parametrize("memory", ["mem1", "full"])
def test_pruned_tokens_are_the_history_left_out_of_the_context(memory):
    t = _mem1_trajectory(memory)
    for i, v in enumerate(turn_views(t)):
        assert v.pruned_tokens == _history(t, i) - len(t.context_ids(i))
    pruned = [v.pruned_tokens for v in turn_views(t)]
    assert pruned == ([0, 0, 12] if memory == "mem1" else [0, 0, 0])


def test_which_objectives_came_out_right():
    marks = objective_marks(_mem1_trajectory(), ["When was Venir Nes born?", "And Bunman Vi?"])
    assert [(m.answered, m.gold, m.right) for m in marks] == [
        ("1821", ["1821"], True),
        ("1750", ["1749"], False),
    ]
    text = trajectory_text(_mem1_trajectory(), ["When was Venir Nes born?", "And Bunman Vi?"])
    assert "Q1 [right] When was Venir Nes born?" in text and "Q2 [wrong]" in text
    assert "turn 3: 24 tokens in context, 12 pruned, 4 generated" in text


def test_the_markdown_keeps_model_text_inert():
    t = _mem1_trajectory()
    t.turns[0].gen_text = "<IS> a *b* <script>x</script> </IS><query> Venir Nes</query>"
    md = trajectory_markdown(t)
    assert "&lt;script&gt;" in md and "\\*b\\*" in md and "<script>" not in md
    assert "**Turn 3** · 24 tokens in context (12 pruned) · 4 generated" in md
    assert "1. **right**: gold “1821”, answered “1821”" in md
    assert "2. **wrong**: gold “1749”, answered “1750”" in md


def test_samples_are_the_first_tasks_at_n2_and_the_largest_n():
    assert sample_ns([1, 2, 4, 8, 16]) == [2, 16] and sample_ns([1, 4]) == [4]
    trajs = [_mem1_trajectory() for _ in range(5)]
    for i, t in enumerate(trajs):
        t.task_id = f"task-{i}"
    md = samples_markdown("mem1-ppo", "mem1", {2: trajs})
    assert [f"task-{i}" in md for i in range(5)] == [i < SAMPLE_TASKS for i in range(5)]


def test_mem1_show_prints_one_trajectory(tmp_path, capsys):
    from mem1_core.cli.main import main

    write_trajectories(
        [_mem1_trajectory()], tmp_path / "eval" / "trajectories" / "mem1-ppo_n2.parquet"
    )
    assert main(["show", str(tmp_path), "--agent", "mem1-ppo", "-n", "2", "--task", "0"]) == 0
    out = capsys.readouterr().out
    assert "<IS>     Q1: 1821. Q2: 1749." in out and "12 pruned" in out
    # its behaviour, counted by hand: two parts answered, two distinct queries, 1821 found in
    # the first <info> (1749 never), and kept in the last <IS>
    assert (
        "behaviour of this task: answered 2.0 of 2, queries 2.0 (2.0 distinct), turns 3.0 of 0, "
        "answered early 0.00, format errors 0.0, found 0.50, retention 1.00"
    ) in out
    assert "behaviour of its cell (1 tasks, mean): answered 2.0 of 2" in out
    assert main(["show", str(tmp_path), "--agent", "mem1-ppo", "-n", "4"]) == 2
    assert "mem1-ppo_n2" in capsys.readouterr().err  # says what the evaluation has
    assert main(["show", str(tmp_path), "--agent", "mem1-ppo", "-n", "2", "--task", "3"]) == 2


def test_nightly_runs_are_named_after_their_night_and_checkpoint(tmp_path):
    from flows.pipeline import nightly_run_name

    ckpt = tmp_path / "20261201-0700" / "ppo_mem1" / "checkpoints" / "iter_000007"
    got = nightly_run_name(date(2026, 12, 3), tmp_path, ckpt)
    assert got == "nightly · 2026-12-03 · 20261201-0700/ppo_mem1/iter_000007"
    assert (
        nightly_run_name(date(2026, 12, 3), tmp_path, None)
        == "nightly · 2026-12-03 · no checkpoint"
    )


@pytest.mark.slow
def test_the_evaluation_stage_writes_the_headline_and_publishes_readable_artifacts(
    tmp_path, monkeypatch
):
    """The smoke profile's evaluation stage (the teacher only: no stage trained here): the
    headline on disk, and artifacts that are markdown a person reads, not Python reprs."""
    import json

    import flows.stages as stages

    published: dict[str, str] = {}
    monkeypatch.setattr(stages, "publish_markdown", lambda k, md, d: published.__setitem__(k, md))
    monkeypatch.setattr(
        "flows.common.publish_markdown", lambda k, md, d: published.__setitem__(k, md)
    )
    monkeypatch.setattr(stages, "publish_table", lambda k, rows, d: published.__setitem__(k, rows))
    overrides = ["data.eval_objectives=[1,2]", "data.max_eval_tasks=2", "eval.scorer=mem1-paper"]
    result = stages.evaluate_objective_scaling.fn(
        profile="smoke", config_path=None, overrides=overrides, run_dir=str(tmp_path)
    )
    headline = json.loads((tmp_path / "eval" / "headline.json").read_text())
    assert headline["scorer"] == "mem1-paper" and headline["objectives"] == [1, 2]
    assert result["headline"] == headline["cells"]
    plots_md = published["objective-scaling-plots"]
    assert "{'" not in plots_md and "Ratios:" not in plots_md and "EM sum (0..N)" in plots_md
    assert all(isinstance(v, str) for r in published["objective-scaling"] for v in r.values())
    md = published["trajectories-teacher"]
    assert md == Path(result["samples"]["teacher"]).read_text()
    assert "## N = 2" in md and "`<IS>`" in md and "pruned" in md
