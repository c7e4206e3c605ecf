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
