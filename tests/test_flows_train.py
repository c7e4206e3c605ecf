"""The train-grpo flow, run for real on an ephemeral Prefect (smoke, in-process workers):
GRPO's defaults apply, the run lands in the run directory, the final metrics come back."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def test_final_metrics_rows_keep_numbers_only():
    from flows.train import final_metrics_rows

    rows = final_metrics_rows(
        {"reward": 0.5, "estimator": "gae", "iteration": 3, "x": None, "flag": True}
    )
    assert rows == [{"metric": "iteration", "value": 3}, {"metric": "reward", "value": 0.5}]


@pytest.mark.slow
def test_train_grpo_flow(tmp_path, monkeypatch):
    from flows.train import train_grpo

    monkeypatch.setenv("WANDB_MODE", "disabled")
    overrides = [
        "ppo.iterations=1",
        "ppo.tasks_per_iteration=2",
        "ppo.minibatch_size=8",
        "ppo.micro_batch_size=8",
        "rollout.gen_tokens_base=8",
        "rollout.gen_tokens_per_objective=2",
        "data.max_eval_tasks=2",
    ]
    result = train_grpo(
        profile="smoke",
        overrides=overrides,
        runs_root=str(tmp_path),
        run_name="grpo",
        use_ray=False,
    )
    out = tmp_path / "grpo"
    assert result["out"] == str(out) and result["estimator"] == "grpo"
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["train/gen_tokens"] > 0 and "train/vf_loss" not in row  # no critic
    assert "train/kl_loss" in row  # GRPO_DEFAULTS: the KL is a loss term
    config = json.loads((out / "checkpoints" / "iter_000001" / "config.json").read_text())
    assert config["ppo"]["samples_per_task"] == 4 and config["ppo"]["kl_kind"] == "k3"
    assert not (out / "checkpoints" / "iter_000001" / "critic").exists()
