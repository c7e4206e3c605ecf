"""PPO over a curriculum of task lengths (ppo.curriculum): which N each iteration trains on,
stagewise or as a mixture, checked against the schedule written out by hand, and through a
real smoke-profile run whose saved trajectories show the N each iteration played."""

from __future__ import annotations

import json

import pytest

from mem1_core.config import load_config
from mem1_core.training.train_rl import iteration_objectives, split_evenly


def test_stages_split_the_iterations_in_order_the_first_ones_longer():
    # 7 iterations over 1 -> 2 -> 4: stages of 3, 2, 2 iterations
    got = [iteration_objectives(i, 7, (1, 2, 4), False) for i in range(7)]
    assert got == [(1,), (1,), (1,), (2,), (2,), (4,), (4,)]
    assert [iteration_objectives(i, 3, (1, 2, 4), False) for i in range(3)] == [(1,), (2,), (4,)]
    # a mixture trains on every N each iteration
    assert {iteration_objectives(i, 5, (1, 2, 4), True) for i in range(5)} == {(1, 2, 4)}
    assert split_evenly(16, 3) == [6, 5, 5] and split_evenly(16, 1) == [16]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ppo.curriculum_mixture=true"], "give them"),
        (["ppo.curriculum=[1,0]"], ">= 1"),
        (["ppo.curriculum=[1,2,4]", "ppo.iterations=2"], "at least one iteration per stage"),
    ],
)
def test_a_bad_curriculum_says_what_to_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config("smoke", None, overrides)


@pytest.mark.slow
def test_a_run_trains_each_stage_on_its_n_and_records_the_horizon(tmp_path, monkeypatch):
    from mem1_core.training.train_rl import train_rl
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = load_config(
        "smoke",
        None,
        ["ppo.iterations=3", "ppo.curriculum=[1,2,4]", "ppo.tasks_per_iteration=2",
         "ppo.minibatch_size=2", "ppo.micro_batch_size=2", "ppo.checkpoint_every=3",
         "rollout.turns_per_objective=1", "rollout.gen_tokens_base=8",
         "rollout.gen_tokens_per_objective=1", "data.max_eval_tasks=1"],
    )  # fmt: skip
    out = tmp_path / "run"
    train_rl(cfg, out, use_ray=False, show=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_objectives"] for r in rows] == [[1], [2], [4]]
    assert [r["horizon"] for r in rows] == [1, 2, 4]
    from mem1_core.runs.layout import RunPaths

    played = [{t.n_objectives for t in read_trajectories(RunPaths(out).part(i))} for i in range(3)]
    assert played == [{1}, {2}, {4}]
