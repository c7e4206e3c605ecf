from __future__ import annotations

import math

import pytest

from mem1_core.data.metrics import (
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


# ---- the paper's scorer (MIT-MI/MEM1 Mem1/inference/eval.py), worked out by hand ------------
# Each expected value below is derived from eval.py's rules, not from running either scorer:
# lowercase; every punctuation character -> a space; whitespace collapsed; articles kept; a
# task whose answer splits on `;` into a number of parts other than N scores 0 everywhere;
# EM is membership among the normalised aliases; F1 is over word *sets*.


def test_paper_normalisation_spaces_punctuation_and_keeps_articles():
    from mem1_core.data.metrics import paper_normalize

    assert paper_normalize("  The Hay-Bunau, River! ") == "the hay bunau river"
    assert paper_normalize("O'Neil") == "o neil"  # SQuAD would give "oneil"


@pytest.mark.parametrize(
    ("answer", "golden", "paper_em", "paper_f1", "squad_em"),
    [
        # punctuation inside a name: both sides become "hay bunau" (squad: "haybunau")
        ("Hay-Bunau", [["Hay-Bunau"]], [1.0], [1.0], [1.0]),
        # articles kept: {silent, river} vs {the, silent, river}: p = 1, r = 2/3, F1 = 0.8
        ("Silent River", [["The Silent River"]], [0.0], [0.8], [1.0]),
        # punctuation to a space splits a word: "oneil" vs "o neil" share no word
        ("ONeil", [["O'Neil"]], [0.0], [0.0], [1.0]),
        # case only
        ("KALO vesh", [["Kalo Vesh"]], [1.0], [1.0], [1.0]),
        # three parts for two objectives: the whole task scores 0
        ("x; y; z", [["x"], ["y"]], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]),
        # one part for two objectives: 0 (squad scores the first)
        ("x", [["x"], ["y"]], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]),
        # a trailing `;` is a third (empty) part
        ("x; y;", [["x"], ["y"]], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]),
        # an empty part scores 0, the others as usual (not `a`: SQuAD drops it as an article)
        ("; y", [["x"], ["y"]], [0.0, 1.0], [0.0, 1.0], [0.0, 1.0]),
        # word sets: {new, york} == {new, york}: F1 1 although the strings differ (EM 0)
        ("new york", [["new york new york"]], [0.0], [1.0], [0.0]),
        # the best alias counts: "mir" matches the second; F1 max(0, 1)
        ("Mir", [["Kalo", "Mir"]], [1.0], [1.0], [1.0]),
        # {kalo, vesh, mir} vs {kalo, vesh}: p = 2/3, r = 1, F1 = 0.8
        ("Kalo Vesh Mir", [["Kalo Vesh"]], [0.0], [0.8], [0.0]),
        # no answer at all
        (None, [["x"], ["y"]], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]),
    ],
)
def test_the_paper_scorer_against_hand_worked_cases(answer, golden, paper_em, paper_f1, squad_em):
    from mem1_core.data.metrics import SCORERS

    em, f1 = SCORERS["mem1-paper"](answer, golden)
    assert em == paper_em
    assert f1 == pytest.approx(paper_f1)
    assert SCORERS["squad"](answer, golden)[0] == squad_em


def test_every_configurable_scorer_exists():
    from mem1_core.config import SCORER_NAMES, load_config
    from mem1_core.data.metrics import SCORERS

    assert set(SCORER_NAMES) == set(SCORERS)
    assert load_config("smoke").eval.scorer == "squad"  # the training reward stays the default
    assert load_config("smoke", overrides=["eval.scorer=mem1-paper"]).eval.scorer == "mem1-paper"
    with pytest.raises(ValueError, match="eval.scorer"):
        load_config("smoke", overrides=["eval.scorer=bleu"])


def test_rescoring_replaces_em_and_f1_and_leaves_the_rollout_alone():
    from mem1_core.evaluation.evaluate import rescore
    from mem1_core.trajectory.record import Trajectory

    t = Trajectory("t", "mem1", [1], [["the river"]], answer="River", em=[1.0], f1=[1.0])
    (paper,) = rescore([t], "mem1-paper")
    assert paper.em == [0.0] and paper.f1 == pytest.approx([2 * 1 * 0.5 / 1.5])
    assert t.em == [1.0]  # the squad-scored original is unchanged


def test_peak_tokens_averaged_both_ways():
    """Over all tasks (ours) and over the tasks that earned any credit (the paper's)."""
    from mem1_core.evaluation.summary import summarize
    from mem1_core.trajectory.record import Action, Trajectory, Turn

    trajs = []
    for em, peak in (([0.0, 0.0], 100), ([1.0, 0.0], 200), ([1.0, 1.0], 400)):
        t = Trajectory("t", "mem1", [1], [["x"], ["y"]], em=em, f1=em)
        t.turns.append(Turn([], [0] * 10, [0.0] * 10, Action.ANSWER, context_tokens=peak - 10))
        trajs.append(t)
    s = summarize(trajs)
    assert s["peak_tokens"] == pytest.approx(700 / 3)
    assert s["peak_tokens_credited"] == 300.0 and s["credited_tasks"] == 2
    assert s["em_sum"] == 1.0 and s["em_frac"] == 0.5
    assert math.isnan(summarize(trajs[:1])["peak_tokens_credited"])
