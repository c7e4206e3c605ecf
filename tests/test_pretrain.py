"""What `mem1 pretrain` teaches beside the teacher's turns: the prompt's end is in the text, and
the question-list drills write the turn the scripted teacher writes for that state."""

from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
import pytest
import torch

from mem1_core.data.prompts import task_prompt
from mem1_core.qa.teacher import ScriptedTeacher
from mem1_core.rollout.loop import Task
from mem1_core.training.pretrain_data import _question_drill_rows, question_drill_text
from mem1_core.trajectory.record import Trajectory


def test_a_prompt_is_not_the_start_of_a_longer_one():
    # Without an end line, the prompt of 4 questions is the first part of the prompt of 5:
    # a model that has read 5-question lists continues "Question 5: ..." instead of its turn.
    qs = [f"Who is {i}?" for i in range(1, 6)]
    assert not task_prompt(qs).startswith(task_prompt(qs[:4]))
    assert task_prompt(qs).splitlines()[-1] == "Answer all 5 questions."
    assert task_prompt(qs[:1]).splitlines()[-1] == "Answer all 1 question."
    assert task_prompt(qs).endswith("\n")


@pytest.fixture(scope="module")
def planned(small_world):
    rows = [r for r in small_world.questions.to_pylist() if json.loads(r["plan"] or "[]")]
    return random.Random(3).sample(rows, 6)


def test_a_drill_for_the_first_question_is_the_teachers_first_turn(planned, small_tokenizer):
    task = Task(
        "t",
        task_prompt([r["question"] for r in planned]),
        [r["question"] for r in planned],
        [list(r["golden_answers"]) for r in planned],
        [r["plan"] for r in planned],
    )
    teacher = ScriptedTeacher(small_tokenizer, [task])
    traj = Trajectory("t", "mem1", [], task.golden_answers, max_turns=20)
    prompt, turn = question_drill_text(task.questions, task.plans)
    assert prompt == task.prompt
    assert turn == teacher.turn_text(traj, None)


def test_drill_rows_are_the_prompt_and_turn_ids_end_to_end(small_world, small_tokenizer):
    class Cfg:
        question_drills_per_world = 20
        drill_max_facts = 8

    rows = _question_drill_rows(small_world.questions, small_tokenizer, Cfg, random.Random(0))
    assert len(rows) == 20
    texts = [small_tokenizer.decode(r, skip_special_tokens=False) for r in rows]
    assert all("Answer all" in t and t.rstrip().endswith("</query>") for t in texts)
    ks = {t.count("Question ") for t in texts}
    assert len(ks) > 2 and max(ks) <= 8  # list lengths vary up to drill_max_facts


def test_a_task_file_of_another_composer_version_is_composed_again(tmp_path):
    from mem1_core.config import load_config
    from mem1_core.data.compose import COMPOSER_VERSION
    from mem1_core.qa.tasks import ensure_tasks
    from mem1_core.runs.layout import RunPaths

    cfg = load_config("smoke")
    paths = RunPaths(tmp_path / "run")
    path = ensure_tasks(cfg, paths, "test", 2)
    table = pq.read_table(path)
    old = table.replace_schema_metadata({b"generator": b"compose-0"})
    pq.write_table(
        old.set_column(
            table.schema.get_field_index("prompt"), "prompt", [["stale"] * table.num_rows]
        ),
        path,
    )
    again = pq.read_table(ensure_tasks(cfg, paths, "test", 2))
    assert again.schema.metadata[b"generator"] == COMPOSER_VERSION.encode()
    assert "stale" not in again["prompt"].to_pylist()


@pytest.mark.parametrize(("k", "wanted"), [(0, 1), (2, 3), (2, 7), (15, 16)])
def test_a_list_drill_answers_when_the_count_is_reached_and_goes_on_before(k, wanted):
    from mem1_core.training.pretrain_data import drill_text

    facts = [f"Name{i}" for i in range(k)]
    text = drill_text(facts, "Kalo Vesh", "Kalo Vesh is a city.", wanted)
    assert text.startswith(f"Answer all {wanted} question")
    last_state = text.rsplit("<IS>", 1)[1]
    carried = [f"Q{i}: {f}." for i, f in enumerate([*facts, "Kalo Vesh"], 1)]
    assert last_state.strip().startswith(" ".join(carried))
    if k + 1 == wanted:
        assert text.endswith(f"<answer> {'; '.join([*facts, 'Kalo Vesh'])}</answer>")
    else:
        assert last_state.endswith(f"Next: Q{k + 2}. </IS>") and "<answer>" not in text
    with pytest.raises(ValueError):
        drill_text(facts, "x", "y", k)  # fewer wanted than the list already holds


SMALL_PRETRAIN = [
    "pretrain.tasks_per_world=4",
    "pretrain.drills_per_world=4",
    "pretrain.question_drills_per_world=4",
    "pretrain.eval_objectives=[1]",
    "pretrain.eval_tasks=2",
    "pretrain.batch_size=2",
    "model.base=null",
]
"""A pretraining of seconds: a few tasks and drills per world, a 2-task evaluation."""


def test_pretraining_continues_from_a_base_with_its_weights_tokenizer_and_history(tmp_path):
    """`pretrain.init`: the continued run starts from the base's own weights (at lr 0 they come
    out unchanged, where a fresh start would be other random weights), adopts its tokenizer
    and carries its history into the new manifest."""
    import matplotlib.pyplot as plt
    from safetensors.torch import load_file

    from mem1_core.config import load_config
    from mem1_core.training.pretrain import pretrain

    small = ["pretrain.steps=3", "pretrain.eval_every=2", *SMALL_PRETRAIN]
    first = pretrain(load_config("smoke", overrides=small), tmp_path / "a", progress=False)
    first_dir = tmp_path / "a" / "base"
    # the count decides: 3 steps, held-out at steps 0 and 2 (eval_every) and at the end
    assert first["steps"] == 3 and first["stopped_by"] == "count"
    assert [e["step"] for e in first["held_out"]] == [0, 2, 3]
    last = json.loads((tmp_path / "a" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last == {"step": 3, "minutes": last["minutes"], "stopped_by": "count"}
    # the curve is drawn beside the weights: held-out N=1 and the loss, two panels
    height, width, _ = plt.imread(first_dir / "curve.png").shape
    assert width > 1.5 * height
    first["history"] = [{"what": "the first run"}]
    (first_dir / "manifest.json").write_text(json.dumps(first))
    cfg = load_config(
        "smoke", overrides=[*small, f"pretrain.init={first_dir}", "pretrain.lr=0", "model.seed=9"]
    )
    second = pretrain(cfg, tmp_path / "b", progress=False)
    a = load_file(first_dir / "model.safetensors")
    b = load_file(tmp_path / "b" / "base" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    tok_a = (first_dir / "tokenizer.json").read_text()
    assert (tmp_path / "b" / "base" / "tokenizer.json").read_text() == tok_a
    assert second["init"]["path"] == str(first_dir.resolve())
    assert second["history"][0] == {"what": "the first run"} and len(second["history"]) == 2
    with pytest.raises(ValueError, match="not a base directory"):
        pretrain(
            load_config("smoke", overrides=[*small, f"pretrain.init={tmp_path}"]),
            tmp_path / "c",
            progress=False,
        )


def test_held_out_series_is_each_n_in_step_order_with_its_standard_error():
    from mem1_core.evaluation.scaling import held_out_series

    evals = [
        {"step": 20, "minutes": 2.0, "em_n1": 0.5, "se_n1": 0.1, "em_n2": 0.25, "se_n2": 0.05},
        {"step": 10, "minutes": 1.0, "em_n1": 0.0, "se_n1": 0.0},  # N=2 not measured here
    ]
    assert held_out_series(evals) == {1: [(10, 0.0, 0.0), (20, 0.5, 0.1)], 2: [(20, 0.25, 0.05)]}


def test_pretraining_stops_at_its_minute_cap_with_a_warning_and_says_so(tmp_path, caplog):
    """pretrain.minutes is a cap: a run slower than planned stops there, warns,
    and records `stopped_by: minutes`."""
    from mem1_core.config import load_config
    from mem1_core.training.pretrain import pretrain

    small = ["pretrain.steps=1000", "pretrain.minutes=0.001", *SMALL_PRETRAIN]
    with caplog.at_level("WARNING", logger="mem1_core.training.pretrain"):
        got = pretrain(load_config("smoke", overrides=small), tmp_path / "a", progress=False)
    assert got["stopped_by"] == "minutes" and got["steps"] < 1000
    assert "cap stopped it after" in caplog.text
