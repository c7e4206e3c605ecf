"""vllm_deployment: the deployment's vLLM rollouts. PPO iterations of the `ppo`
section's model with `rollout.backend=vllm`, driven, as the `mem1/train-eval` flows drive
them, from the Prefect venv's Python (no vLLM there: `--prefect-python`, default
$MEM1_VENV or ./.venv; benchmarks.gpu.deployment_driver) with the rollout worker a Ray actor
under the vLLM venv's Python (mem1_core.runs.rollout_python), each side on half the GPU.
Reports what metrics.jsonl says generated the rollouts (backend, vLLM version, interpreter),
the per-turn rollout / learner log-prob mismatch, and rollout tokens/s. CUDA only (skipped on
a CPU, and where either venv is missing); a subprocess, so its Ray and engine leave with it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.gpu.base import Check


def prefect_python(given: str | None) -> Path:
    """The Prefect venv's Python: --prefect-python, else $MEM1_VENV/bin/python, else ./.venv."""
    if given:
        return Path(given)
    return Path(os.environ.get("MEM1_VENV") or ROOT / ".venv") / "bin" / "python"


def run(c: Check) -> None:
    device, s, out, emit = c.device, c.sizes, c.out, c.emit
    from mem1_core.runs.rollout_python import vllm_python

    if device != "cuda":
        emit({"check": "vllm_deployment", "skipped": "CUDA only (the CPU path: ./dev test-vllm)"})
        return
    driver, workers = prefect_python(c.prefect_python), vllm_python(None)
    if not driver.is_file() or workers is None:
        missing = (
            f"no Prefect venv Python at {driver}"
            if not driver.is_file()
            else ("no vLLM venv (./dev setup-vllm, or $MEM1_VLLM_PYTHON)")
        )
        emit({"check": "vllm_deployment", "skipped": missing})
        return
    run = out / "vllm_deployment_run"
    if run.exists():
        import shutil

        shutil.rmtree(run)
    over = [
        "ppo.minutes=30",
        "ppo.checkpoint_every=100",
        "data.max_eval_tasks=4",
        *s.ppo_overrides,
        "rollout.backend=vllm",
        "rollout.gpu_memory_utilization=0.3",  # beside the learner on the same GPU
    ]
    env = os.environ | {"PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    env.pop("VIRTUAL_ENV", None)
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(driver), "-m", "benchmarks.gpu.deployment_driver", str(run), json.dumps(over)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the driver failed: {(done.stdout + done.stderr)[-1500:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    per_it = [
        {
            "iteration": r["iteration"],
            "rollout_tokens_per_s": r["gen_tokens"] / max(r["rollout_seconds"], 1e-9),
            "logp_mismatch_max": r["train/logp_mismatch_max"],
            "logp_mismatch_max_per_turn": {
                k.rsplit("/", 1)[-1]: v
                for k, v in r.items()
                if k.startswith("train/logp_mismatch_max/turn_")
            },
        }
        for r in rows
    ]
    last = rows[-1]
    steady = per_it[1:] or per_it  # the first iteration compiles and captures CUDA graphs
    emit(
        {
            "check": "vllm_deployment",
            "driver_python": str(driver),
            "rollout_backend": last.get("rollout_backend"),
            "vllm_version": last.get("vllm_version"),
            "rollout_python": last.get("rollout_python"),
            "wall_s": wall,
            "rollout_tokens_per_s": sum(r["rollout_tokens_per_s"] for r in steady) / len(steady),
            "per_iteration": per_it,
            # bf16 engine vs bf16 learner: not the fp32 ~1e-6 of the CPU test; a stale engine
            # (no weight sync) would be far off after the first update.
            "ok": len(rows) == len(per_it) > 0
            and all(r.get("rollout_backend") == "vllm" and r.get("vllm_version") for r in rows)
            and last.get("rollout_python") == workers,
        }
    )
