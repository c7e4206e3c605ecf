"""`mem1 train grpo` for real on the smoke profile (in-process workers): GRPO's defaults
apply, the run lands in its run directory, the final metrics come back."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_train_grpo_command(tmp_path, monkeypatch, capsys):
    from mem1_core.cli.main import main

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
    out = tmp_path / "grpo"
    sets = [a for o in overrides for a in ("--set", o)]
    argv = ["train", "grpo", "--profile", "smoke", "--out", str(out), "--no-ray", "--no-progress"]
    assert main([*argv, *sets]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["out"] == str(out) and result["estimator"] == "grpo"
    (row,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["train/gen_tokens"] > 0 and "train/vf_loss" not in row  # no critic
    assert "train/kl_loss" in row  # GRPO_DEFAULTS: the KL is a loss term
    config = json.loads((out / "checkpoints" / "iter_000001" / "config.json").read_text())
    assert config["ppo"]["samples_per_task"] == 4 and config["ppo"]["kl_kind"] == "k3"
    assert not (out / "checkpoints" / "iter_000001" / "critic").exists()
