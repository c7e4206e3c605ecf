"""Overlapped rollouts (`ppo.overlap_rollouts`). Off, `train_rl` is the synchronous
loop: the same metrics, to the bit, as that loop written out with the Runtime. On, it is the
overlapped schedule written out the same way (iteration k+1 rolled out before update k), each
iteration after the first samples with the weights of the checkpoint one update before the
learner's (`rollout_staleness` 1), and the rollout importance weights see the gap; through
Ray too, where the rollout runs in another process beside the update. Kill-and-resume with
overlap: tests/test_checkpoint_resume.py."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from mem1_core.config import load_config

ITERATIONS = 3
OVERRIDES = [
    f"ppo.iterations={ITERATIONS}",
    "ppo.minutes=60",
    "ppo.checkpoint_every=1",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    "ppo.rollout_is=token",
    # The untrained model never answers (reward 0): an entropy bonus and a large step make
    # the policy move, so that one update of staleness shows in the log-probs.
    "ppo.actor_lr=1e-3",
    "ppo.entropy_coef=0.05",
    "rollout.gen_tokens_base=12",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
]
OVERLAP = "ppo.overlap_rollouts=true"
ASSETS = ("world", "tasks", "tokenizer", "indexes")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The comparisons are exact, and at more than one intra-op thread torch's CPU kernels are
    not bitwise reproducible: the reference loop run twice at 2 threads differed in 34 of its
    logged values (from the second iteration on, ~1e-7); at one thread it is the same each run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(*extra: str):
    return load_config("smoke", None, [*OVERRIDES, *extra])


def test_overlap_needs_the_rollout_correction():
    with pytest.raises(ValueError, match="ppo.rollout_is=token"):
        load_config("smoke", None, [OVERLAP])
    assert load_config("smoke", None, [OVERLAP, "ppo.rollout_is=sequence"]).ppo.overlap_rollouts
    assert load_config("smoke").ppo.overlap_rollouts is False


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The smoke run's world, tasks, tokenizer and index, built once for the module."""
    from mem1_core.domains.inputs import prepare

    root = tmp_path_factory.mktemp("assets")
    prepare(_config(), root)
    return root


def _run_dir(assets, path):
    for name in ASSETS:
        if (assets / name).exists():
            shutil.copytree(assets / name, path / name)
    return path


def _reference(cfg, root, overlap: bool) -> list[dict]:
    """The loop written out with the Runtime, in process: synchronous (roll out k, update,
    sync), or overlapped (roll out k+1 before update k). -> the learner's stats per iteration."""
    from mem1_core.domains.inputs import load_tasks, prepare
    from mem1_core.training.actor_start import start_runtime
    from mem1_core.training.train_rl import select_tasks

    paths = prepare(cfg, root)
    train = load_tasks(cfg, paths, "train", cfg.data.train_objectives)
    runtime = start_runtime(cfg, paths, init=None, use_ray=False)

    def roll(i):
        tasks = select_tasks(train, i, cfg.ppo.tasks_per_iteration, cfg.data.seed)
        return runtime.rollout(tasks, seed=cfg.model.seed * 1_000_003 + i)

    runtime.sync_weights()
    stats = []
    if not overlap:
        for it in range(ITERATIONS):
            stats.append(runtime.update(roll(it), it))
            runtime.sync_weights()
        return stats
    trajs = roll(0)
    for it in range(ITERATIONS):
        ahead = roll(it + 1) if it + 1 < ITERATIONS else None
        stats.append(runtime.update(trajs, it))
        runtime.sync_weights()
        trajs = ahead
    return stats


def _train(cfg, out, use_ray=False) -> list[dict]:
    from mem1_core.training.train_rl import train_rl

    result = train_rl(cfg, out, use_ray=use_ray, show=False)
    assert result["iterations"] == ITERATIONS
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _same(value, want) -> bool:
    """metrics.jsonl writes NaN as null."""
    return value is None if isinstance(want, float) and math.isnan(want) else value == want


def _assert_rows_equal(rows, reference):
    for row, stats in zip(rows, reference, strict=True):
        for k, v in stats.items():
            if not k.endswith("_seconds"):  # wall time (the update's and its phases')
                assert _same(row[f"train/{k}"], v), (row["iteration"], k, row[f"train/{k}"], v)


def _tree_logprobs(updates: int, cfg, out, part):
    """Log-probs of `part`'s generated tokens under the policy after `updates` updates (the
    initial one, or checkpoint iter_{updates}), over the flattened trees, and the ones its
    rollout recorded."""
    from mem1_core.domains.inputs import ensure_tokenizer
    from mem1_core.models.model import load_model
    from mem1_core.models.policy import initial_policy
    from mem1_core.rl.batch import make_rollout_batch
    from mem1_core.runs.layout import RunPaths
    from mem1_core.trajectory.logprobs import forward_tree
    from mem1_core.trajectory.record import read_trajectories

    tok = ensure_tokenizer(cfg, RunPaths(out))
    if updates == 0:
        model = initial_policy(cfg, tok)
    else:
        model = load_model(out / "checkpoints" / f"iter_{updates:06d}" / "policy", cfg.model, tok)
    rb = make_rollout_batch(read_trajectories(part), tok.pad_token_id)
    with torch.no_grad():
        logp = forward_tree(model, rb.batch, "sdpa").logprobs
    mask = rb.batch.loss_mask
    return logp[mask], rb.rollout_logp[mask]


def _assert_one_step_stale(cfg, out, rows):
    """Iteration k >= 1 was sampled with the weights after k - 1 updates (checkpoint
    iter_{k-1}; the initial policy for k = 1), not with the learner's of its update (iter_k),
    and its IS weights show it."""
    assert [r["rollout_staleness"] for r in rows] == [0] + [1] * (ITERATIONS - 1)
    assert rows[0]["train/logp_mismatch_max"] < 1e-4  # on-policy: the sampler's weights
    for k in range(1, ITERATIONS):
        part = out / "trajectories" / f"iter_{k:06d}.parquet"
        sampler, recorded = _tree_logprobs(k - 1, cfg, out, part)
        assert float((sampler - recorded).abs().max()) < 1e-4
        learner, _ = _tree_logprobs(k, cfg, out, part)
        assert float((learner - recorded).abs().max()) > 1e-3
        assert rows[k]["train/logp_mismatch_max"] > 1e-3
        assert rows[k]["train/rollout_is_mean"] != pytest.approx(1.0, abs=1e-6)
    for r in rows:
        assert r["rollout_busy_seconds"] > 0 and r["seconds"] >= r["rollout_seconds"]


@pytest.mark.slow
def test_off_is_the_synchronous_loop(assets, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = _config()
    rows = _train(cfg, _run_dir(assets, tmp_path / "run"))
    _assert_rows_equal(rows, _reference(cfg, _run_dir(assets, tmp_path / "ref"), overlap=False))
    assert all(r["rollout_staleness"] == 0 for r in rows)
    assert all(r["train/logp_mismatch_max"] < 1e-4 for r in rows)


@pytest.mark.slow
def test_on_trains_one_step_stale_rollouts(assets, tmp_path, monkeypatch):
    """In process (--no-ray) the overlapped schedule runs one step after the other."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = _config(OVERLAP)
    out = _run_dir(assets, tmp_path / "run")
    rows = _train(cfg, out)
    _assert_rows_equal(rows, _reference(cfg, _run_dir(assets, tmp_path / "ref"), overlap=True))
    _assert_one_step_stale(cfg, out, rows)
    assert "eval/reward" in rows[-1]


@pytest.mark.slow
def test_on_through_ray_samples_with_the_weights_before_the_update(
    assets, tmp_path, monkeypatch, ray_cleanup
):
    """On Ray the next rollout runs on the worker while the learner updates; the worker
    must sample it with the weights it held, not the ones sent after the update."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = _config(OVERLAP)
    out = _run_dir(assets, tmp_path / "run")
    rows = _train(cfg, out, use_ray=True)
    assert [r["iteration"] for r in rows] == list(range(ITERATIONS))
    _assert_one_step_stale(cfg, out, rows)
    assert all(r["train/optimizer_steps"] == 1 and r["train/skipped_steps"] == 0 for r in rows)
