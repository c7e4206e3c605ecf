"""Checkpoints: an exact round trip of weights, optimiser and RNG states; atomic writes;
keep-last-K; and a training run killed with SIGKILL and resumed that loses no completed
iteration and duplicates none."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mem1_core.config import ModelConfig, load_config
from mem1_core.models.model import build_tiny_model
from mem1_core.rl.critic import Critic
from mem1_core.training.checkpoint import (
    TrainState,
    checkpoint_problems,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_state,
    remove_partial,
    save_checkpoint,
)

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


def _setup(tokenizer, seed: int):
    torch.manual_seed(seed)
    policy = build_tiny_model(TINY, tokenizer)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * seed * torch.randn_like(p))
    critic = Critic.from_policy(policy)
    opts = {
        "policy": torch.optim.AdamW(policy.parameters(), lr=1e-2),
        "critic": torch.optim.AdamW(critic.parameters(), lr=1e-2),
    }
    ids = torch.randint(0, len(tokenizer), (2, 7))
    for _ in range(2):  # optimiser state (moments, step) worth restoring
        loss = policy(input_ids=ids).logits.pow(2).mean()
        loss = loss + critic.backbone(input_ids=ids).last_hidden_state.pow(2).mean()
        loss.backward()
        for o in opts.values():
            o.step()
            o.zero_grad()
    return policy, critic, opts


def _state(policy, critic, opts):
    return (
        {**policy.state_dict()},
        {**critic.state_dict()},
        {k: o.state_dict() for k, o in opts.items()},
    )


def _draws():
    return torch.rand(3), random.random(), np.random.rand(2)


def test_round_trip_restores_weights_optimisers_and_rng(small_tokenizer, tmp_path):
    policy, critic, opts = _setup(small_tokenizer, 1)
    cfg = load_config("smoke")
    path = save_checkpoint(
        tmp_path,
        TrainState(3, 12.5, {"init": None}),
        policy=policy,
        optimizers=opts,
        config=cfg,
        critic=critic,
        tokenizer=small_tokenizer,
    )
    expected, draws = _state(policy, critic, opts), _draws()
    other = _setup(small_tokenizer, 2)  # different weights, moments and RNG position
    state = load_checkpoint(path, policy=other[0], optimizers=other[2], critic=other[1])
    assert state == TrainState(3, 12.5, {"init": None})
    got = _state(*other)
    for a, b in zip(expected[:2], got[:2], strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in opts:
        e, g = expected[2][name]["state"], got[2][name]["state"]
        assert e.keys() == g.keys()
        for k in e:
            assert all(torch.equal(e[k][s], g[k][s]) for s in e[k])
    after = _draws()
    assert torch.equal(draws[0], after[0]) and draws[1] == after[1]
    assert np.array_equal(draws[2], after[2])
    # as JSON writes it (a tuple field comes back a list)
    assert json.loads((path / "config.json").read_text())["ppo"] == json.loads(
        json.dumps(cfg.ppo.to_dict())
    )
    assert (path / "policy" / "model.safetensors").is_file()
    assert (path / "critic" / "value_head.safetensors").is_file()
    assert (path / "policy" / "tokenizer.json").is_file()  # the policy dir stands alone


def test_keeps_the_last_k_and_ignores_partial_saves(small_tokenizer, tmp_path):
    policy, critic, opts = _setup(small_tokenizer, 1)
    for k in range(1, 5):
        save_checkpoint(
            tmp_path, TrainState(k), policy=policy, optimizers=opts, config={"k": k}, keep=2
        )
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000003", "iter_000004"]
    stale = tmp_path / ".iter_000005.abc.tmp"
    (stale / "policy").mkdir(parents=True)
    assert latest_checkpoint(tmp_path).name == "iter_000004"
    assert remove_partial(tmp_path) == [stale] and not stale.exists()
    assert latest_checkpoint(tmp_path / "missing") is None


def test_only_the_newest_checkpoint_keeps_its_optimiser_state(small_tokenizer, tmp_path, caplog):
    """AdamW's moments are 2/3 of a checkpoint; the older kept checkpoints drop them
    and stay intact by their manifests; resuming one restores its weights, moments afresh."""
    policy, critic, opts = _setup(small_tokenizer, 1)
    for k in range(1, 4):
        save_checkpoint(tmp_path, TrainState(k), policy=policy, optimizers=opts, config={}, keep=3)
    old, older, newest = (tmp_path / f"iter_00000{k}" for k in (1, 2, 3))
    assert (newest / "optimizer.pt").is_file()
    assert not (old / "optimizer.pt").exists() and not (older / "optimizer.pt").exists()
    assert checkpoint_problems(old) == [] and checkpoint_problems(newest) == []
    expected = {k: v.clone() for k, v in policy.state_dict().items()}
    other = _setup(small_tokenizer, 2)
    with caplog.at_level("WARNING"):
        load_checkpoint(older, policy=other[0], optimizers=other[2])
    assert "no optimiser state" in caplog.text
    assert all(torch.equal(expected[k], v) for k, v in other[0].state_dict().items())
    assert all(not o.state_dict()["state"] for o in other[2].values())  # fresh moments


def test_an_interrupted_save_leaves_no_checkpoint(small_tokenizer, tmp_path, monkeypatch):
    policy, critic, opts = _setup(small_tokenizer, 1)
    save_checkpoint(tmp_path, TrainState(1), policy=policy, optimizers=opts, config={})

    def dies(*args, **kwargs):
        raise KeyboardInterrupt  # as if killed while writing the optimiser state

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, TrainState(2), policy=policy, optimizers=opts, config={})
    assert [p.name for p in tmp_path.iterdir()] == ["iter_000001"]
    assert read_state(latest_checkpoint(tmp_path)).iteration == 1


# ---- kill and resume -------------------------------------------------------------------------

ITERATIONS = 4
OVERRIDES = [
    f"ppo.iterations={ITERATIONS}",
    "ppo.minutes=60",
    "ppo.checkpoint_every=2",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    "ppo.entropy_coef=0.01",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
    "ppo.eval_every=2",
    "ppo.eval_objectives=[1]",
]


def _command(out: Path, *extra: str) -> list[str]:
    sets = [a for o in OVERRIDES for a in ("--set", o)]
    return [
        "train",
        "ppo",
        "--profile",
        "smoke",
        "--out",
        str(out),
        "--no-ray",
        "--no-progress",
        *sets,
        *extra,
    ]


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.glob("*.parquet"))
    }


HOLD_AFTER_ITERATION_2 = """
import sys, time
from pathlib import Path

from mem1_core.cli.main import main
from mem1_core.training import iteration_log

logged = iteration_log.MetricsSink.log


def log_then_hold(self, record):
    logged(self, record)
    if record["iteration"] == 2:
        Path(sys.argv[1]).touch()
        time.sleep(3600)


iteration_log.MetricsSink.log = log_then_hold
sys.exit(main(sys.argv[2:]))
"""
"""The real `mem1 train ppo`, held (until the test's SIGKILL) right after iteration 2's
record is written: argv is the flag file it then creates, then the CLI's arguments."""


OVERLAP = ("--set", "ppo.overlap_rollouts=true", "--set", "ppo.rollout_is=token")
"""Overlapped rollouts: the killed run's rollout in flight is in no file, and the
resumed run redoes it with the checkpoint's weights."""


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_sigkill_then_resume_loses_and_duplicates_no_iteration(tmp_path, monkeypatch, overlap):
    from mem1_core.cli.main import main
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    mode = OVERLAP if overlap else ()
    held = tmp_path / "held"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_AFTER_ITERATION_2, str(held), *_command(out, *mode)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # Checkpoints come after iterations 1 and 3. Kill once iteration 2 is written (its
    # trajectories and its metrics row): the run is then past the iteration-2 checkpoint with
    # output newer than it, which the resume must drop and redo. The child holds there, so
    # the kill lands at that point however busy the machine (polling for the files instead
    # let a loaded machine's run reach its final checkpoint before the kill).
    deadline = time.monotonic() + 600
    while not held.exists():
        if proc.poll() is not None:
            pytest.fail(f"training exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "iteration 2 not written within 10 minutes"
        time.sleep(0.05)
    assert (out / "checkpoints" / "iter_000002" / "state.json").is_file()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()

    kept = read_state(latest_checkpoint(out / "checkpoints")).iteration
    assert kept == 2  # killed after the iteration-2 checkpoint, before the next one
    before = _snapshot(out / "trajectories")
    rows_before = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert "iter_000002.parquet" in before and rows_before[-1]["iteration"] == 2
    assert main(_command(out, *mode)) == 2  # no silent restart over an existing run

    assert main(_command(out, *mode, "--resume")) == 0

    after = _snapshot(out / "trajectories")
    assert sorted(after) == [f"iter_{i:06d}.parquet" for i in range(ITERATIONS)]
    for i in range(kept):  # covered by the checkpoint: untouched (same inode, time, bytes)
        name = f"iter_{i:06d}.parquet"
        assert after[name] == before[name]
    assert after["iter_000002.parquet"][:2] != before["iter_000002.parquet"][:2]  # redone
    redone, killed = (
        pq.read_table(pa.BufferReader(x["iter_000002.parquet"][2]))["task_id"]
        for x in (after, before)
    )
    assert redone.equals(killed)  # on the same tasks: the draw is fixed per iteration
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    assert rows[:kept] == [r for r in rows_before if r["iteration"] < kept]
    assert read_state(latest_checkpoint(out / "checkpoints")).iteration == ITERATIONS
    # Overlap: each iteration one update stale, but the first and the first after the
    # resume, whose rollouts started from the weights the learner then held.
    stale = [0, 1, 0, 1] if overlap else [0] * ITERATIONS
    assert [r["rollout_staleness"] for r in rows] == stale
    for i in range(ITERATIONS):
        trajs = read_trajectories(out / "trajectories" / f"iter_{i:06d}.parquet")
        assert len(trajs) == 4 and all(t.done for t in trajs)
        if not stale[i]:
            assert rows[i]["train/logp_mismatch_max"] < 1e-4  # workers had the learner's weights
    assert not list(out.rglob(".*.tmp"))
    assert (
        "eval/reward" in rows[-1] and (out / "eval" / f"iter_{ITERATIONS - 1:06d}.parquet").exists()
    )
    # The held-out curve at a second N (ppo.eval_objectives): every 2nd iteration, the one
    # before the kill kept, the one after it written once; each row's mean is its file's.
    curve = sorted(p.name for p in (out / "eval" / "n1").glob("*"))
    assert curve == ["iter_000001.parquet", "iter_000003.parquet"]
    for i in (1, 3):
        held = read_trajectories(out / "eval" / "n1" / f"iter_{i:06d}.parquet")
        assert len(held) == 2 and {t.n_objectives for t in held} == {1}
        assert rows[i]["eval/n1/reward"] == pytest.approx(sum(t.reward for t in held) / 2)
    assert not any("eval/n1/reward" in rows[i] for i in (0, 2))


def test_a_checkpoint_records_the_memory_policy_it_trained_under(tmp_path):
    """The nightly evaluation reads the memory from the checkpoint's config.json, not from
    its directory's name."""
    from mem1_core.training.checkpoint import checkpoint_memory

    path = tmp_path / "ppo_mem1"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"rollout": {"memory": "full"}}))
    assert checkpoint_memory(path) == "full"
    assert checkpoint_memory(tmp_path / "missing") is None


@pytest.mark.slow
def test_the_held_out_curve_changes_nothing_the_run_trains(tmp_path, monkeypatch):
    # An experiment reuses a finished arm whatever its curve's cadence and N were
    # (mem1_core.experiment.plan.NEUTRAL): each rollout draws from a generator seeded for that
    # call, so a held-out point takes no randomness from the training that follows it.
    from safetensors.torch import load_file

    from mem1_core.training.train_rl import train_rl
    from mem1_core.trajectory.record import read_trajectories

    monkeypatch.setenv("WANDB_MODE", "disabled")
    base = [o for o in OVERRIDES if not o.startswith(("ppo.iterations", "ppo.eval_"))]
    curves = {"every": ["ppo.eval_every=1", "ppo.eval_objectives=[1, 3]"], "last": []}
    runs = {}
    for name, curve in curves.items():
        cfg = load_config("smoke", None, [*base, "ppo.iterations=2", *curve])
        runs[name] = train_rl(cfg, tmp_path / name, use_ray=False, show=False)
    every, last = (tmp_path / n for n in curves)
    assert (every / "eval" / "iter_000000.parquet").is_file()  # a point after each iteration
    assert not (last / "eval" / "iter_000000.parquet").exists()  # only after the last
    for i in range(2):
        a, b = (
            read_trajectories(r / "trajectories" / f"iter_{i:06d}.parquet") for r in (every, last)
        )
        assert [[t.gen_ids for t in x.turns] for x in a] == [
            [t.gen_ids for t in x.turns] for x in b
        ]
    weights = [
        load_file(Path(runs[n]["checkpoint"]) / "policy" / "model.safetensors") for n in curves
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
