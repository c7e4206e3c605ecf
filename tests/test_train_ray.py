"""A smoke PPO run through real Ray actors (rollout worker, learner, retriever): every
iteration's output lands once, W&B writes offline into the run directory, and the rollout
worker samples with the weights the learner sent after each update."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from mem1_core.config import load_config

OVERRIDES = [
    "ppo.iterations=2",
    "ppo.minutes=60",
    "ppo.checkpoint_every=1",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    "ppo.actor_lr=1e-3",
    # The untrained model never answers (reward 0, zero advantages): an entropy bonus makes
    # the policy move, so a missing weight sync would show.
    "ppo.entropy_coef=0.05",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]


def _tree_logprobs(model, trajs, pad_id):
    from mem1_core.rl.batch import make_rollout_batch
    from mem1_core.trajectory.logprobs import forward_tree

    rb = make_rollout_batch(trajs, pad_id)
    with torch.no_grad():
        logp = forward_tree(model, rb.batch, "sdpa").logprobs
    return logp[rb.batch.loss_mask], rb.rollout_logp[rb.batch.loss_mask]


@pytest.mark.slow
def test_smoke_ppo_through_ray(tmp_path, monkeypatch, ray_cleanup):
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.model import load_model
    from mem1_core.models.policy import initial_policy
    from mem1_core.runs.layout import RunPaths
    from mem1_core.training.train_rl import train_rl
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = load_config("smoke", overrides=OVERRIDES)
    out = tmp_path / "run"
    result = train_rl(cfg, out, use_ray=True, show=False)

    assert result["iterations"] == 2 and result["checkpoint"].endswith("iter_000002")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1]
    assert all(r["train/optimizer_steps"] == 1 and r["train/skipped_steps"] == 0 for r in rows)
    assert "eval/reward" in rows[-1] and rows[-1]["eval/tasks"] == 2
    # Every iteration says what generated it: Hugging Face, in this (the driver's) venv.
    assert all(r["rollout_backend"] == "hf" and r["vllm_version"] is None for r in rows)
    assert all(Path(r["rollout_python"]).parent == Path(sys.executable).parent for r in rows)
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == [
        "iter_000000.parquet",
        "iter_000001.parquet",
    ]
    assert list((out / "wandb").glob("offline-run-*"))  # W&B offline, inside the run dir

    # Iteration 1 was sampled after the first update: its recorded log-probs are those of
    # the learner's updated policy (checkpoint iter_000001), not of the initial one.
    tok = ensure_tokenizer(cfg, RunPaths(out))
    trajs = read_trajectories(out / "trajectories" / "iter_000001.parquet")
    updated = load_model(out / "checkpoints" / "iter_000001" / "policy", cfg.model, tok)
    now, recorded = _tree_logprobs(updated, trajs, tok.pad_token_id)
    assert float((now - recorded).abs().max()) < 1e-4
    before, _ = _tree_logprobs(initial_policy(cfg, tok), trajs, tok.pad_token_id)
    assert float((before - recorded).abs().max()) > 1e-3
    assert rows[1]["train/logp_mismatch_max"] < 1e-4


@pytest.mark.slow
def test_runs_inside_reuse_actors_share_the_actors_and_train_as_fresh_ones(
    tmp_path, monkeypatch, ray_cleanup
):
    """The pipeline's two PPO stages (memory policies `mem1` then `full`) run on one set of
    actors; the second run must train exactly as it does on actors of its own."""
    import ray
    from safetensors.torch import load_file

    from mem1_core.training import actor_pool
    from mem1_core.training.train_rl import train_rl

    monkeypatch.setenv("WANDB_MODE", "disabled")
    one = [*OVERRIDES, "ppo.iterations=1"]
    mem1 = load_config("smoke", overrides=one)
    full = load_config("smoke", overrides=[*one, "rollout.memory=full"])
    fresh = train_rl(full, tmp_path / "fresh", use_ray=True, show=False)
    assert not ray.is_initialized()  # outside the pool a run stops what it started
    with actor_pool.reuse_actors():
        train_rl(mem1, tmp_path / "a", use_ray=True, show=False)
        (parked,) = actor_pool._parked.values()
        reused = train_rl(full, tmp_path / "b", use_ray=True, show=False)
        assert list(actor_pool._parked.values()) == [parked]  # run b ran on run a's actors
        assert ray.is_initialized()
    assert not ray.is_initialized()  # leaving the pool stopped the actors and their Ray

    def weights(result):
        return load_file(f"{result['checkpoint']}/policy/model.safetensors")

    want, got = weights(fresh), weights(reused)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
    for k in ("reward", "train/pg_loss", "train/policy_grad_norm", "train/vf_loss"):
        assert reused["metrics"][k] == pytest.approx(fresh["metrics"][k], rel=1e-5, abs=1e-7), k


def test_a_local_ray_that_times_out_at_start_is_started_again(monkeypatch, caplog):
    """Ray aborts a start whose raylet misses its fixed 30 s wait (a loaded machine): the
    private local Ray is started again, up to LOCAL_START_ATTEMPTS; other errors raise."""
    ray = pytest.importorskip("ray")
    from mem1_core.training import ray_start

    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) < ray_start.LOCAL_START_ATTEMPTS:
            raise Exception("The current node timed out during startup. This could happen ...")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    resources = load_config("smoke").resources
    assert ray_start.start_ray(resources) is True
    assert len(calls) == ray_start.LOCAL_START_ATTEMPTS and "starting it again" in caplog.text

    def fails(error: Exception):
        def init(**kwargs):
            raise error

        return init

    monkeypatch.setattr(ray, "init", fails(Exception("The current node timed out during startup")))
    with pytest.raises(Exception, match="timed out during startup"):  # the last try's raises
        ray_start.start_ray(resources)
    monkeypatch.setattr(ray, "init", fails(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="other"):  # not retried
        ray_start.start_ray(resources)
