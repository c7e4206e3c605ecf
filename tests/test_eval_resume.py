"""An interrupted objective-scaling evaluation resumes at the cell it stopped in (an
evaluation of SmolLM2 takes ~35 minutes a world, and a session may end inside it). A cell
is reused only when the same agent played the same tasks under the same configuration;
everything else is played again. Checked against playing every cell afresh."""

from __future__ import annotations

import json

import pytest

import mem1_core.evaluation.scaling as scaling
from mem1_core.config import RolloutConfig
from mem1_core.data.compose import compose
from mem1_core.data.qa_data import world_questions
from mem1_core.evaluation.scaling import Agent, evaluate_scaling
from mem1_core.evaluation.stage import policy_source
from mem1_core.qa.env import QAEnvironment
from mem1_core.qa.teacher import ScriptedTeacher
from mem1_core.rollout.loop import tasks_from_table

CFG = RolloutConfig()


@pytest.fixture(scope="module")
def setting(small_tokenizer, small_index, small_world):
    env = QAEnvironment(small_tokenizer, small_index, topk=3)
    questions = world_questions(small_world.questions).table
    tasks_by_n = {n: tasks_from_table(compose(questions, n, split="test")[0])[:6] for n in (1, 2)}
    every = [t for ts in tasks_by_n.values() for t in ts]

    def agents(lapsing_source="lapsing v1"):
        # a faithful teacher and one whose seeded lapses make its cells differ from the first's
        return [
            Agent("faithful", "mem1", None, ScriptedTeacher(small_tokenizer, every), "t"),
            Agent(
                "lapsing", "full", None,
                ScriptedTeacher(small_tokenizer, every, error_rate=0.5, seed=3), lapsing_source,
            ),
        ]  # fmt: skip

    return small_tokenizer, env, tasks_by_n, agents


@pytest.fixture
def played(monkeypatch):
    """The (agent, N) cells actually played, in order (the real run_eval still plays them)."""
    calls = []
    real = scaling.run_eval

    def counting(model, tokenizer, env, tasks, rollout_cfg, *, memory, backend, **kw):
        calls.append((backend.tasks_played_by, len(tasks[0].questions)))
        return real(model, tokenizer, env, tasks, rollout_cfg, memory=memory, backend=backend, **kw)

    monkeypatch.setattr(scaling, "run_eval", counting)
    return calls


def _named(agents):
    for a in agents:
        a.backend.tasks_played_by = a.name
    return agents


def _timeless(table):
    return table.drop(columns=["seconds_per_task"]).to_dict("records")


ALL = [("faithful", 1), ("faithful", 2), ("lapsing", 1), ("lapsing", 2)]


def test_a_rerun_reuses_finished_cells_and_plays_the_rest(setting, played, tmp_path):
    tok, env, tasks_by_n, agents = setting
    fresh = evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path / "fresh", False, key="k"
    )
    assert played == ALL
    assert fresh.loc[fresh.agent == "faithful", "em_frac"].tolist() == [1.0, 1.0]
    assert fresh.loc[fresh.agent == "lapsing", "em_frac"].max() < 1.0  # the cells differ

    # the same evaluation again: nothing is played, the table is the same to the bit
    played.clear()
    again = evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path / "fresh", False, key="k"
    )
    assert played == []
    assert again.to_dict("records") == fresh.to_dict("records")

    # interrupted: one cell never written, one torn mid-write, one without its record, one
    # record without the fields a finished cell writes
    traj = tmp_path / "fresh" / "trajectories"
    (traj / "lapsing_n2.parquet").unlink()
    (traj / "lapsing_n1.parquet").write_bytes(b"PAR1 torn")
    (traj / "faithful_n2.cell.json").unlink()
    short = json.loads((traj / "faithful_n1.cell.json").read_text())
    del short["seconds"]
    (traj / "faithful_n1.cell.json").write_text(json.dumps(short))
    resumed = evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path / "fresh", False, key="k"
    )
    assert played == [("faithful", 1), ("faithful", 2), ("lapsing", 1), ("lapsing", 2)]
    assert _timeless(resumed) == _timeless(fresh)
    record = json.loads((traj / "lapsing_n2.cell.json").read_text())
    assert record["task_ids"] == [t.task_id for t in tasks_by_n[2]] and record["key"] == "k"


@pytest.mark.parametrize(
    "change, replayed",
    [
        ("key", ALL),  # another configuration: nothing is reused
        ("source", [("lapsing", 1), ("lapsing", 2)]),  # that agent's policy was saved again
        ("tasks", [("faithful", 1), ("lapsing", 1)]),  # N=1's task list differs
        ("no key", ALL),  # resuming is asked for by giving a key
    ],
)
def test_a_cell_played_by_anything_else_is_played_again(
    setting, played, tmp_path, change, replayed
):
    tok, env, tasks_by_n, agents = setting
    evaluate_scaling(_named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k")
    played.clear()
    key = {"key": "k2", "no key": None}.get(change, "k")
    source = "lapsing v2" if change == "source" else "lapsing v1"
    tasks = {**tasks_by_n, 1: tasks_by_n[1][1:]} if change == "tasks" else tasks_by_n
    table = evaluate_scaling(_named(agents(source)), tok, env, tasks, CFG, tmp_path, False, key=key)
    assert played == replayed
    assert table.loc[table.n_objectives == 1, "tasks"].tolist() == [len(tasks[1])] * 2


def test_policy_source_changes_when_a_policy_is_saved_again(tmp_path):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "model.safetensors").write_bytes(b"weights")
    (policy / "config.json").write_text("{}")
    first = policy_source(policy)
    assert policy_source(policy) == first and str(policy.resolve()) in first
    (policy / "model.safetensors").write_bytes(b"other weights")
    assert policy_source(policy) != first
    assert policy_source("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub name as it is


def test_a_resumed_evaluation_counts_its_reused_cells_once(setting, monkeypatch, tmp_path):
    """The progress of a resumed evaluation starts at the tasks of its reused cells (its pace,
    and so its estimate, from the cells it plays) and ends at the total, not above or below."""
    tok, env, tasks_by_n, agents = setting
    evaluate_scaling(_named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k")
    (tmp_path / "trajectories" / "lapsing_n2.parquet").unlink()
    seen = []

    class Watched(scaling.StageProgress):
        def _emit(self, final):
            seen.append((self.start, self.done, self.total, final))
            super()._emit(final)

    monkeypatch.setattr(scaling, "StageProgress", Watched)
    evaluate_scaling(_named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k")
    total = 2 * sum(len(t) for t in tasks_by_n.values())
    reused = total - len(tasks_by_n[2])
    assert seen[0] == (reused, reused, total, False)
    assert max(done for _, done, _, _ in seen) == total and seen[-1] == (reused, total, total, True)


def test_a_cell_from_before_a_config_field_existed_is_reused_where_it_keeps_its_default(
    setting, played, tmp_path
):
    """The key hashes the whole config, so a field added to the code later changes it; the
    record's settings show the cell was played as that field's default plays, and it counts.
    Off its default, or a field that was there and changed, it is played again."""
    from mem1_core.config import Config, config_json

    tok, env, tasks_by_n, agents = setting
    now = json.loads(config_json(Config()))
    before = json.loads(json.dumps(now))
    del before["trajectory"]  # as if the section were added after the cells were played
    del before["rollout"]["keep_answers_prompt"]
    evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k1", settings=before
    )
    played.clear()
    evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k2", settings=now
    )
    assert played == []  # new fields at their defaults: the same play
    on = json.loads(json.dumps(now))
    on["rollout"]["keep_answers_prompt"] = True
    evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k3", settings=on
    )
    assert played == ALL
    played.clear()
    hotter = json.loads(json.dumps(on))
    hotter["rollout"]["temperature"] = 0.5  # a field both records have, changed
    evaluate_scaling(
        _named(agents()), tok, env, tasks_by_n, CFG, tmp_path, False, key="k4", settings=hotter
    )
    assert played == ALL
