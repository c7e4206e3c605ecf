"""The RL-toolbox options through a real training run (smoke profile, in-process workers): a
run that combines them trains, logs what they did, and, killed after its first
checkpoint and resumed, continues with the KL coefficient the adaptive controller had
reached (it is checkpointed, not restarted from ppo.kl_coef)."""

from __future__ import annotations

import json

import pytest

from mem1_core.config import load_config

OVERRIDES = [
    # `mem1 train grpo`'s defaults, then RLOO in their place, and the rest of the toolbox
    "ppo.adv_estimator=rloo",
    "ppo.samples_per_task=2",
    "ppo.kl_in_loss=true",
    "ppo.kl_kind=k3",
    "ppo.policy_loss=gspo",
    "ppo.loss_agg_mode=seq-mean-token-sum-norm",
    "ppo.rollout_is=token",
    "ppo.kl_ctrl=adaptive",
    "ppo.target_kl=0.05",
    "ppo.kl_horizon=20",
    "ppo.kl_coef=0.01",
    # a small run
    "ppo.minutes=60",
    "ppo.checkpoint_every=1",
    "ppo.tasks_per_iteration=2",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=2",
    "ppo.entropy_coef=0.05",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]


@pytest.mark.slow
def test_a_run_with_the_toolbox_trains_and_resumes_its_kl_coefficient(tmp_path, monkeypatch):
    from mem1_core.rl.kl_control import adaptive_kl_coef
    from mem1_core.training.checkpoint import read_state
    from mem1_core.training.train_rl import train_rl

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    first = train_rl(load_config("smoke", None, [*OVERRIDES, "ppo.iterations=1"]), out,
                     use_ray=False, show=False)  # fmt: skip
    assert first["estimator"] == "rloo" and first["iterations"] == 1
    (row0,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert row0["train/kl_coef"] == 0.01 and row0["train/optimizer_steps"] == 1
    assert row0["train/rollout_is_threshold"] == 2.0
    assert row0["train/rollout_is_truncated_frac"] == 0.0  # HF on CPU: no sampler gap
    assert "train/seq_ratio_dev" in row0 and "train/vf_loss" not in row0
    # The coefficient the controller moved to after iteration 0 is in the checkpoint.
    reached = adaptive_kl_coef(0.01, row0["train/kl_ctrl_measured"], 4, 0.05, 20)
    assert read_state(first["checkpoint"]).extra["kl_coef"] == pytest.approx(reached)

    second = train_rl(load_config("smoke", None, [*OVERRIDES, "ppo.iterations=2"]), out,
                      resume=True, use_ray=False, show=False)  # fmt: skip
    assert second["iterations"] == 2
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert rows[1]["train/kl_coef"] == pytest.approx(reached) != 0.01
