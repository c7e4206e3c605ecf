"""Flows `train-ppo`, `train-grpo`, `train-sft`: build the Config, train into a run
directory, publish the final metrics (and the reward curve) as table artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, task

from flows.common import build_config, publish_table, run_dir
from mem1_core.config import Config

CURVE_KEYS = ("iteration", "reward", "kl", "tokens_per_s", "eval/reward", "eval/em_sum")


@task(name="train-rl", cache_policy=None)
def train_rl_task(
    cfg: Config, out: Path, estimator: str, resume: bool, init: str | None, use_ray: bool
) -> dict[str, Any]:
    from mem1_core.training.train_rl import train_rl

    return train_rl(
        cfg, out, estimator=estimator, resume=resume, init=init, use_ray=use_ray, show=False
    )


@task(name="train-sft", cache_policy=None)
def train_sft_task(cfg: Config, out: Path, resume: bool, init: str | None) -> dict[str, Any]:
    from mem1_core.training.sft import train_sft

    return train_sft(cfg, out, resume=resume, init=init)


def final_metrics_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The numeric entries of a metrics record as (metric, value) rows."""
    return [
        {"metric": k, "value": v}
        for k, v in sorted(metrics.items())
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]


def curve_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [{k: r.get(k) for k in CURVE_KEYS} for r in rows]


def publish_results(name: str, out: Path, result: dict[str, Any]) -> None:
    publish_table(
        f"{name}-final",
        final_metrics_rows(result.get("metrics", {})),
        f"{name}: final metrics of {out}",
    )
    curve = curve_rows(out)
    if curve:
        publish_table(f"{name}-curve", curve, f"{name}: reward per iteration in {out}")


def _rl(name: str, estimator: str, params: dict[str, Any]) -> dict[str, Any]:
    """The body of both RL flows; `params` are the flow's own parameters."""
    profile = params["profile"]
    cfg = build_config(profile, params["config_path"], params["overrides"])
    out = run_dir(params["runs_root"], params["run_name"] or f"{name}-{profile}")
    result = train_rl_task(cfg, out, estimator, params["resume"], params["init"], params["use_ray"])
    publish_results(name, out, result)
    return result


@flow(name="train-ppo", log_prints=True)
def train_ppo(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    run_name: str | None = None,
    resume: bool = False,
    init: str | None = None,
    use_ray: bool = True,
) -> dict[str, Any]:
    """PPO with a critic (the paper's RL) from `init` (e.g. the SFT warm start)."""
    return _rl("train-ppo", "gae", locals())


@flow(name="train-grpo", log_prints=True)
def train_grpo(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    run_name: str | None = None,
    resume: bool = False,
    init: str | None = None,
    use_ray: bool = True,
) -> dict[str, Any]:
    """GRPO (no critic); `GRPO_DEFAULTS` apply before `overrides`."""
    from mem1_core.training.train_rl import GRPO_DEFAULTS

    overrides = [*GRPO_DEFAULTS, *(overrides or [])]
    return _rl("train-grpo", "grpo", locals())


@flow(name="train-sft", log_prints=True)
def train_sft(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    run_name: str | None = None,
    resume: bool = False,
    init: str | None = None,
) -> dict[str, Any]:
    """Supervised training on teacher trajectories (mem1_core.training.sft)."""
    cfg = build_config(profile, config_path, overrides)
    out = run_dir(runs_root, run_name or f"train-sft-{profile}")
    result = train_sft_task(cfg, out, resume, init)
    publish_results("train-sft", out, result)
    return result
