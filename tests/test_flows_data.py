"""The compose-tasks flow, run for real on an ephemeral Prefect (the smoke world)."""

from __future__ import annotations

import os

import pyarrow.parquet as pq

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def test_compose_tasks_flow_writes_every_n(tmp_path):
    from flows.data import compose_tasks

    result = compose_tasks(profile="smoke", objectives=[1, 2], runs_root=str(tmp_path))
    # training tasks for the warm start (1, 2) and N=2; test tasks for every evaluated N
    assert set(result["tasks"]) == {"train_n1", "train_n2", "test_n1", "test_n2", "test_n4"}
    t = pq.read_table(result["tasks"]["test_n2"])
    assert set(t["split"].to_pylist()) == {"test"} and set(t["n_objectives"].to_pylist()) == {2}


def test_a_stage_given_the_parents_config_builds_nothing_from_the_profile(tmp_path):
    """The parent flow builds the config once and hands its resolved values on.
    A stage given them uses those values, even where its own profile and overrides would
    build another config (here `tiny`, whose world and caps are far larger)."""
    from flows.common import resolved
    from flows.data import compose_tasks
    from mem1_core.config import load_config

    parent = load_config("smoke", overrides=["data.max_train_tasks=5", "data.eval_objectives=[1]"])
    result = compose_tasks(
        profile="tiny", overrides=[], out_dir=str(tmp_path), config=resolved(parent)
    )
    assert set(result["tasks"]) == {"train_n1", "train_n2", "test_n1", "test_n2"}
    assert pq.read_metadata(result["tasks"]["train_n2"]).num_rows == 5
    # the smoke world, as the parent's config generates it (tiny's has other sizes)
    from mem1_core.data.world import generate_world, write_world

    write_world(generate_world(parent.world), tmp_path / "expected")
    written, expected = (
        pq.read_table(d / "questions.parquet") for d in (tmp_path / "world", tmp_path / "expected")
    )
    assert written.equals(expected)
    assert load_config("tiny").world != parent.world
