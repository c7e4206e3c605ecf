from __future__ import annotations

from mem1_core.evaluation.metrics import (
    dependency,
    exact_match,
    f1_score,
    normalize_answer,
    peak_tokens,
    score_answer,
    unknown_rate,
)


def test_squad_normalisation():
    assert normalize_answer("The  Silent, River!") == "silent river"
    assert exact_match("the Kalo Vesh.", ["Kalo Vesh"]) == 1.0
    assert exact_match("Kalo", ["Kalo Vesh", "Vesh"]) == 0.0
    assert exact_match("republic of tosperbol", ["Tosperbol", "Republic of Tosperbol"]) == 1.0


def test_f1_is_token_overlap():
    assert f1_score("Kalo Vesh Mir", ["Kalo Vesh"]) == 0.8  # p=2/3, r=1
    assert f1_score("nothing", ["Kalo"]) == 0.0


def test_answers_split_on_semicolons_in_order_missing_score_zero():
    gold = [["a"], ["b"], ["c"]]
    assert score_answer("a; b", gold)[0] == [1.0, 1.0, 0.0]
    assert score_answer("b; a; c", gold)[0] == [0.0, 0.0, 1.0]
    assert score_answer(None, gold)[0] == [0.0, 0.0, 0.0]


def test_unknown_rate_counts_objectives_answered_question_mark():
    # 6 objectives in the answered tasks, two of them `?` (" ? " too); no answer counts nothing
    assert unknown_rate(["?; Kalo", None, "Vesh; ? ", "1718; Mir"]) == 2 / 6
    assert unknown_rate([None]) == 0.0 and unknown_rate([]) == 0.0
    assert unknown_rate(["Kalo?"]) == 0.0  # only a bare `?` is an unknown


def test_peak_tokens_and_dependency_follow_their_definitions():
    turns = [(10, 3), (20, 2)]
    assert peak_tokens(turns) == 22
    # brute force: each generated token attends to its context and the tokens before it
    assert dependency(turns) == sum(c + j for c, g in turns for j in range(g))


def test_one_summary_for_training_and_evaluation():
    """Training's metrics.jsonl and evaluation's metrics table read one summary: the same
    numbers under the same names, plus training's old names for three of them."""
    from mem1_core.evaluation.summary import TRAINING_NAMES, summarize, training_summary
    from mem1_core.trajectory.record import Action, Trajectory, Turn

    a = Trajectory("t0", "mem1", [1, 2], [["x"]], em=[1.0], f1=[1.0], answer="x")
    a.turns.append(Turn([], [5, 6, 7], [0.0] * 3, Action.ANSWER, context_tokens=2))
    b = Trajectory("t1", "mem1", [1, 2, 3], [["y"], ["z"]], em=[0.0, 1.0], f1=[0.5, 1.0])
    evaluated = summarize([a, b], seconds=4.0)
    trained = training_summary([a, b], "eval/")
    assert evaluated["em_frac"] == 0.75 and evaluated["em_sum"] == 1.0
    assert evaluated["seconds_per_task"] == 2.0 and evaluated["answered_rate"] == 0.5
    assert all(trained[f"eval/{k}"] == v for k, v in evaluated.items() if k != "seconds_per_task")
    assert all(trained[f"eval/{old}"] == evaluated[new] for old, new in TRAINING_NAMES.items())
    assert summarize([])["tasks"] == 0
