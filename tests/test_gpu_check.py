"""benchmarks/gpu_check.py, the prepared GPU script of issue #7, in its CPU mode: the
tree's training step equals the per-turn baseline's; the whole `--device cpu --quick` run
(FlexAttention forward exactness, the step comparison, PPO iterations) passes. On a GPU the
same script runs the CUDA-only parts (flex backward, peak memory, vLLM agreement)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_tree_training_step_equals_the_per_turn_baseline_on_cpu():
    gpu_check = _load()
    rows = []
    gpu_check.train_step("cpu", gpu_check.sizes_for("cpu", quick=True), rows.append)
    (row,) = rows
    assert row["ok"] and row["summed_logp_rel_gap"] <= 1e-4
    assert [v["variant"] for v in row["variants"]] == ["tree_sdpa", "per_turn"]
    assert row["flat_tokens"] < row["per_turn_tokens"]  # MEM1's tree reads shared tokens once


@pytest.mark.slow
def test_cpu_quick_mode_end_to_end(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    argv = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--threads", "1"]
    done = subprocess.run(
        [*argv, "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert rows == [
        json.loads(x) for x in (tmp_path / "gpu_check.jsonl").read_text().splitlines()
    ] + [rows[-1]]
    by = {r["check"]: r for r in rows}
    assert by["exactness"]["ok"] and by["exactness"]["max_abs_dlogp_flex_vs_def"] <= 1e-4
    assert by["train_step"]["ok"] and by["ppo"]["ok"] and by["ppo"]["iterations"] == 2
    assert by["ppo"]["rollout_tokens_per_s"] > 0 and by["ppo"]["train_tokens_per_s"] > 0
    assert by["vllm"].get("ok", True) and by["summary"]["ok"]
