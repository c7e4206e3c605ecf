"""The behaviour rows (mem1_core.evaluation.behaviour) on trajectories built by hand, whose
counts are known: answers given, queries and distinct queries, turns against the budget, an
answer before every objective could be searched, format errors, answers found and kept."""

from __future__ import annotations

import pytest

from mem1_core.evaluation.behaviour import last_state, read_behaviour, task_behaviour
from mem1_core.experiment.headline import POOLED
from mem1_core.trajectory.record import Action, Trajectory, Turn, write_trajectories

GOLD = [["Ada Lovelace", "Ada"], ["1887"], ["Paris"]]


def _turn(action, gen="", info="", query=None, error=None) -> Turn:
    return Turn(context=[], gen_ids=[1], gen_logprobs=[0.0], action=action, gen_text=gen,
                info_text=info, query=query, format_error=error)  # fmt: skip


def _info(body: str) -> str:
    return f"<info>{body}\n[HINT] You have 3 turns left.</info>"


def forgetful(memory: str = "mem1") -> Trajectory:
    """Three objectives; it searches twice (once the same query again, cased otherwise), finds
    two answers, forgets one of them, writes one invalid turn, and answers two parts and a `?`
    on turn 5 of 8."""
    turns = [
        _turn(Action.QUERY, "<IS>start</IS><query>founder of X</query>", query="founder of X",
              info=_info("Doc 1 (Title: X) X was founded by Ada Lovelace.")),
        _turn(Action.INVALID, "<IS>Ada Lovelace founded X</IS> rambling", error="no action",
              info=_info("[FORMAT] invalid")),
        _turn(Action.QUERY, "<IS>Ada Lovelace founded X</IS><query>Founder of X!</query>",
              query="Founder of X!", info=_info("Doc 1 (Title: Z) Z moved to Paris in 1900.")),
        _turn(Action.QUERY, "<IS>Paris</IS><query>Y birth year</query>", query="Y birth year",
              info=_info("No results.")),
        # the hint line is no result: 1887 there must not count as found
        _turn(Action.ANSWER, "<IS>Z lives in Paris</IS><answer>Paris; ?; </answer>"),
    ]  # fmt: skip
    tr = Trajectory("t1", memory, [1], GOLD, turns, answer="Paris; ?; ", max_turns=8)
    tr.turns[3].info_text = "<info>No results.\n[HINT] 1887 turns left</info>"
    return tr


def test_a_forgetful_trajectory_has_the_counts_built_into_it():
    got = task_behaviour(forgetful())
    assert got == {
        "answered": 1.0,  # `Paris`; `?` and the empty part answer nothing
        "queries": 3.0, "distinct_queries": 2.0,  # `Founder of X!` is `founder of X` again
        "turns": 5.0, "turns_budget": 8.0,
        "early": 1.0,  # 2 distinct queries for 3 objectives
        "format_errors": 1.0,
        "found": pytest.approx(2 / 3),  # Ada Lovelace and Paris; 1887 never in a result
        "retention": 0.5,  # the last <IS> keeps Paris, Ada Lovelace is gone
    }  # fmt: skip


def test_the_answer_itself_retains_and_a_full_context_agent_has_no_retention():
    tr = forgetful()
    tr.answer = "Paris; Ada; "  # an alias counts
    assert task_behaviour(tr)["retention"] == 1.0 and task_behaviour(tr)["answered"] == 2.0
    assert task_behaviour(forgetful("full"))["retention"] is None


def test_a_task_never_answered_has_no_early_rate_and_keeps_its_last_state():
    tr = forgetful()
    tr.turns = tr.turns[:4]
    tr.answer = None
    got = task_behaviour(tr)
    assert got["early"] is None and got["answered"] == 0.0
    assert got["retention"] == 0.5  # `<IS>Paris</IS>`, the last one written
    assert last_state(tr.turns) == "Paris"
    nothing = Trajectory("t2", "mem1", [1], GOLD, [_turn(Action.INVALID, "garbage", error="x")],
                         max_turns=8)  # fmt: skip
    got = task_behaviour(nothing)
    assert (got["found"], got["retention"], got["queries"], got["format_errors"]) == (
        0.0, None, 0.0, 1.0,
    )  # fmt: skip


def test_an_answer_after_searching_each_objective_is_not_early(tmp_path):
    turns = [
        _turn(Action.QUERY, f"<IS>s{k}</IS><query>q{k}</query>", query=f"q{k}",
              info=_info(f"Doc {k}"))
        for k in range(3)
    ] + [_turn(Action.ANSWER, "<IS>Ada; 1887; Paris</IS><answer>Ada; 1887; Paris</answer>")]  # fmt: skip
    tr = Trajectory("t3", "mem1", [1], GOLD, turns, answer="Ada; 1887; Paris", max_turns=8)
    assert task_behaviour(tr)["early"] == 0.0 and task_behaviour(tr)["answered"] == 3.0
    # read back from a cell's Parquet file, the same figures
    write_trajectories([tr, forgetful()], tmp_path / "c.parquet")
    back = read_behaviour(tmp_path / "c.parquet")
    assert back == {"t3": task_behaviour(tr), "t1": task_behaviour(forgetful())}


def test_the_headline_pools_behaviour_per_task_over_seeds_then_over_tasks():
    from mem1_core.experiment.headline import world_headline
    from mem1_core.experiment.report import behaviour_markdown

    def b(answered, retention):
        return {"answered": answered, "queries": 2.0, "distinct_queries": 2.0, "turns": 4.0,
                "turns_budget": 10.0, "early": 1.0, "format_errors": 0.0, "found": 0.5,
                "retention": retention}  # fmt: skip

    behaviour = {
        "mem1-ppo-s0": {4: {"a": b(1.0, 1.0), "b": b(2.0, None), "c": b(4.0, 0.0)}},
        "mem1-ppo-s1": {4: {"a": b(3.0, 0.5), "b": b(2.0, None), "c": b(0.0, None)}},
    }
    scores = {a: {4: {t: (0.5, 100.0) for t in "abc"}} for a in behaviour}
    world = world_headline(scores, ["mem1-ppo"], behaviour)
    cells = {(c["agent"], c["seed"]): c["behaviour"] for c in world["cells"]}
    # per task over the seeds: answered a 2, b 2, c 2 -> 2 ± 0; retention a 0.75, c 0.0 (b: none)
    pooled = cells[("mem1-ppo", POOLED)]
    assert pooled["answered"] == 2.0 and pooled["answered_se"] == 0.0
    assert pooled["retention"] == pytest.approx(0.375) and pooled["retention_tasks"] == 2
    assert pooled["retention_se"] == pytest.approx(0.375)  # sd 0.530 over 2 tasks / sqrt 2
    seed0 = cells[("mem1-ppo", 0)]
    assert seed0["answered"] == pytest.approx(7 / 3) and seed0["retention"] == 0.5
    table = behaviour_markdown(world)
    assert "| mem1-ppo | 4 | 2.00 ± 0.00 / 4 | 2.0 (2.0) | 4.0 / 10 |" in table
    assert "mem1-ppo · seed 1" in table  # the per-seed rows, folded


def test_a_claims_row_says_what_drives_it_and_effects_are_no_claims():
    from mem1_core.experiment.headline import experiment_headline
    from mem1_core.experiment.report import claims_markdown, headline_markdown
    from mem1_core.experiment.spec import Above

    def b(answered, found, retention):
        return {"answered": answered, "queries": 4.0, "distinct_queries": 4.0, "turns": 6.0,
                "turns_budget": 10.0, "early": 0.0, "format_errors": 0.0, "found": found,
                "retention": retention}  # fmt: skip

    tasks = [f"t{k}" for k in range(8)]
    behaviour = {
        "mem1-ppo-s0": {4: {t: b(3.0, 0.75, 0.5) for t in tasks}},
        "mem1-sft-s0": {4: {t: b(2.0, 0.5, 1.0) for t in tasks}},
    }
    scores = {
        "mem1-ppo-s0": {4: {t: (float(k % 2), 50.0) for k, t in enumerate(tasks)}},
        "mem1-sft-s0": {4: {t: (0.0, 50.0) for t in tasks}},
    }
    h = experiment_headline({0: scores}, 0, 2, 2.0, 0.3, "x", ["mem1-ppo", "mem1-sft"],
                            behaviours={0: behaviour},
                            effects=(Above("mem1-ppo", "mem1-sft", (4,)),))  # fmt: skip
    (rl,) = [c for c in h["claims"] if c["key"] == "rl_above_sft@4"]
    assert rl["worlds"]["0"]["drivers"]["mem1-sft"] == {"answered": 2.0, "found": 0.5,
                                                        "retention": 1.0}  # fmt: skip
    row = claims_markdown(h).splitlines()[2]
    assert row.endswith(
        "| mem1-sft answers 2.0 of 4 (found 0.50, kept 1.00); mem1-ppo 3.0 (0.75, 0.50) |"
    )
    (effect,) = h["effects"]
    assert (
        effect["label"] == "mem1-ppo − mem1-sft at N=4"
        and effect["worlds"]["0"][POOLED]["value"] == 0.5
    )
    md = headline_markdown(h)
    assert (
        "## Effects (measured, not claimed" in md
        and "Holm-corrected over the 1 claim × world" in md
    )
