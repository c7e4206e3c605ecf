"""Same seed, same machine, same command: the same results. Every training stage
stops on its count and nothing it computes reads the clock, so two runs of the smoke
pipeline's stages write the same evaluation table and the same training curves, to the bit,
but for what measures the clock itself (`seconds_per_task`, the paper's inference time; an
iteration's seconds and tokens per second).

Torch runs on one thread here: with several, a matmul's partial sums may be added in another
order from run to run (the last bits of a float). Pinned to one, the two runs are equal
(measured: every other column and key equal to the bit)."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import pytest
import torch

from mem1_core.config import load_config
from mem1_core.evaluation.stage import run_objective_scaling, trained_agents
from mem1_core.runs.layout import PPO_MEM1, SFT_MEM1, WARM_START
from mem1_core.training.sft import train_sft
from mem1_core.training.train_rl import train_rl

STAGES = (WARM_START, PPO_MEM1, SFT_MEM1)


def _timeless(row: dict) -> dict:
    """A table row or metrics line without what measures the clock."""
    return {k: v for k, v in row.items() if "seconds" not in k and not k.endswith("_per_s")}


def _table(root: Path) -> list[dict]:
    with open(root / "eval" / "metrics.csv", newline="") as f:
        return [_timeless(r) for r in csv.DictReader(f)]


def _curves(root: Path) -> dict[str, list[dict]]:
    return {
        stage: [_timeless(json.loads(x)) for x in (root / stage / "metrics.jsonl").open()]
        for stage in STAGES
    }


def _smoke_run(root: Path) -> dict:
    """The smoke pipeline's training and evaluation, in-process: warm start, PPO with MEM1
    memory (no Ray), the SFT arm, the objective-scaling evaluation."""
    cfg = load_config("smoke")
    warm = train_sft(cfg, root / WARM_START, warm_start=True, assets_dir=root, progress=False)
    ppo = train_rl(cfg, root / PPO_MEM1, init=root / WARM_START, use_ray=False, show=False)
    sft = train_sft(cfg, root / SFT_MEM1, init=root / WARM_START, assets_dir=root, progress=False)
    # the agents the pipeline's evaluation finds in the run: warm start, mem1-ppo, mem1-sft
    agents = trained_agents(root)
    run_objective_scaling(cfg, root, root / "eval", agents, teacher=False, progress=False)
    return {"warm": warm, "ppo": ppo, "sft": sft}


@pytest.mark.slow
def test_two_smoke_runs_with_one_seed_give_the_same_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = _smoke_run(tmp_path / "a")
        second = _smoke_run(tmp_path / "b")
    finally:
        torch.set_num_threads(threads)
    # Each stage ran its count: the smoke profile's caps sit far above what they take.
    assert first["warm"]["steps"] == second["warm"]["steps"] == 20
    assert first["sft"]["steps"] == second["sft"]["steps"] == 10
    assert first["ppo"]["iterations"] == second["ppo"]["iterations"] == 2
    for run in (first, second):
        assert {run[k]["stopped_by"] for k in ("warm", "sft", "ppo")} == {"count"}
    a, b = tmp_path / "a", tmp_path / "b"
    assert len(_table(a)) == 9  # 3 agents x N in {1, 2, 4}
    assert _table(a) == _table(b)
    assert _curves(a) == _curves(b)
    assert all(c[-1]["stopped_by"] == "count" for c in _curves(a).values())


CAPPED_PPO = (
    "ppo.iterations=3",
    "ppo.minutes=0",  # the cap ends the run after its first iteration
    "ppo.tasks_per_iteration=2",
    "rollout.gen_tokens_base=8",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=2",
)


def test_the_minutes_cap_stops_ppo_with_a_warning_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    cfg = load_config("smoke", None, list(CAPPED_PPO))
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.train_rl"):
        result = train_rl(cfg, tmp_path / "ppo", use_ray=False, show=False)
    assert result["iterations"] == 1 and result["stopped_by"] == "minutes"
    (row,) = [json.loads(x) for x in (tmp_path / "ppo" / "metrics.jsonl").open()]
    assert row["stopped_by"] == "minutes" and "eval/reward" in row  # the last iteration's eval
    assert "cap stopped it after 1 of 3 iterations" in caplog.text
