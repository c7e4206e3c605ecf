"""benchmarks/gpu_check.py, the prepared GPU script, in its CPU mode: the
tree's training step equals the per-turn baseline's; text-tag stops (tags as text under a pretrained tokenizer) end turns where
the closing tag is completed; the whole `--device cpu --quick` run (FlexAttention forward
exactness, the step comparison, PPO iterations, text stops) passes. On a GPU the
same script runs the CUDA-only parts (flex backward, peak memory, vLLM agreement)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
sys.path.insert(0, str(ROOT))  # the benchmarks package lives in the checkout, not the install


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
    # the tree's training step equals the per-turn baseline's, reading shared tokens once
    step = by["train_step"]
    assert step["ok"] and step["summed_logp_rel_gap"] <= 1e-4
    assert [v["variant"] for v in step["variants"]] == ["tree_sdpa", "per_turn"]
    assert step["flat_tokens"] < step["per_turn_tokens"]
    assert by["ppo"]["ok"] and by["ppo"]["iterations"] == 2
    assert by["ppo"]["rollout_tokens_per_s"] > 0 and by["ppo"]["train_tokens_per_s"] > 0
    # text-tag stops, the Hugging Face half (vLLM's row skips without vLLM):
    # closing tags of 3 tokens, the last carrying `\n` or `.\n`, end the turn there
    hf = by["text_stops"]
    assert hf["ok"] and hf["tag_scheme"] == "text" and not hf["tags_in_vocab"]
    assert [r["tail_after_tag"] for r in hf["scripts"]] == ["\n", ".\n"]
    assert all(r["closing_tag_tokens"] >= 2 and r["recites_past_the_tag"] for r in hf["scripts"])
    # the vLLM rows pass where vLLM is installed, and say they skipped (no error) where not
    for name in ("text_stops_vllm", "vllm"):
        if importlib.util.find_spec("vllm") is not None:
            assert by[name]["ok"] is True, by[name]
        else:
            assert by[name] == {"check": name, "skipped": by[name]["skipped"]}, by[name]
            assert "not available" in by[name]["skipped"]
    assert by["summary"] == {"check": "summary", "failed": [], "ok": True}
    assert "CUDA only" in by["vllm_deployment"]["skipped"]
    assert by["smol"] == {"check": "smol", "skipped": "CUDA only (an hour on a CPU)"}


def test_the_deployment_vllm_section_never_runs_on_a_cpu(tmp_path):
    """`vllm_deployment` drives PPO from the Prefect venv with vLLM rollout workers
    under .venv-vllm, sized for a GPU: on a CPU it only says it skipped (./dev test-vllm covers
    the CPU path)."""
    from benchmarks.gpu import vllm_deployment
    from benchmarks.gpu.base import Check, sizes_for

    rows = []
    vllm_deployment.run(Check("cpu", sizes_for("cpu", quick=True), tmp_path, rows.append))
    assert rows == [{"check": "vllm_deployment", "skipped": rows[0]["skipped"]}]
    assert "CUDA only" in rows[0]["skipped"] and not any(tmp_path.iterdir())
