"""The training and evaluation stages of the `mem1` pipeline, each a subflow writing under
the run directory:

- `warm-start`: SFT on 1-objective teacher trajectories (the tag format), `warm_start/`.
- `train-ppo`: PPO with the `mem1` memory policy on N-objective tasks from the warm start,
  `ppo_mem1/`.
- `train-baselines`: the same PPO with the `full` memory policy (the Search-R1-style
  full-context agent), `ppo_full/`; and the SFT arm of the ablation: SFT on N-objective
  teacher trajectories under `mem1` from the same warm start, `sft_mem1/`.
- `evaluate-objective-scaling`: every agent (and the teacher) on test tasks for each N,
  `eval/` (trajectories, metrics.{parquet,csv}, plots).
- `ablation-summary`: RL vs SFT across N, and the training curves, `ablation/`.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import build_config, publish_markdown, publish_table
from mem1_core.config import Config

WARM, PPO_MEM1, PPO_FULL, SFT_MEM1, EVAL, ABLATION = (
    "warm_start",
    "ppo_mem1",
    "ppo_full",
    "sft_mem1",
    "eval",
    "ablation",
)


def _with_memory(cfg: Config, memory: str) -> Config:
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, memory=memory))


def _resume(out: Path) -> bool:
    return out.exists() and any(out.iterdir())


@flow(name="warm-start", log_prints=True)
def warm_start(
    profile: str, config_path: str | None, overrides: list[str] | None, run_dir: str
) -> dict[str, Any]:
    from mem1_core.training.sft import train_sft

    cfg = build_config(profile, config_path, overrides)
    root = Path(run_dir)
    out = root / WARM
    result = train_sft(cfg, out, warm_start=True, assets_dir=root, resume=True, progress=False)
    publish_table(
        "warm-start",
        [{"metric": k, "value": v} for k, v in result.items() if isinstance(v, (int, float))],
        f"warm start in {out}",
    )
    return result


@flow(name="train-ppo-mem1", log_prints=True)
def train_ppo_mem1(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    run_dir: str,
    memory: str = "mem1",
    policy: str | None = None,
) -> dict[str, Any]:
    """PPO under the memory policy `memory` from the warm start. (`policy` is its old name:
    still read, with a warning, for one release.)"""
    from mem1_core.training.train_rl import train_rl

    if policy is not None:
        message = "train-ppo-mem1: the parameter `policy` is now `memory`; `policy` will stop "
        print(f"{message}working in the next release")  # the flow run's log
        warnings.warn(f"{message}working in the next release", DeprecationWarning, stacklevel=2)
        memory = policy
    cfg = _with_memory(build_config(profile, config_path, overrides), memory)
    root = Path(run_dir)
    out = root / (PPO_MEM1 if memory == "mem1" else PPO_FULL)
    result = train_rl(cfg, out, estimator="gae", resume=_resume(out), init=root / WARM, show=False)
    publish_table(
        f"ppo-{memory}",
        [
            {"metric": k, "value": v}
            for k, v in result["metrics"].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ],
        f"PPO ({memory}) in {out}",
    )
    return result


@flow(name="train-sft-arm", log_prints=True)
def train_sft_arm(
    profile: str, config_path: str | None, overrides: list[str] | None, run_dir: str
) -> dict[str, Any]:
    from mem1_core.runs.layout import resolve_init
    from mem1_core.training.sft import train_sft

    cfg = _with_memory(build_config(profile, config_path, overrides), "mem1")
    root = Path(run_dir)
    return train_sft(
        cfg,
        root / SFT_MEM1,
        objectives=cfg.data.train_objectives,
        init=resolve_init(root / WARM),
        assets_dir=root,
        resume=True,
        progress=False,
    )


def agents_of(root: Path) -> list[tuple[str, str, str]]:
    """(name, policy dir, memory policy) of every trained agent found in the run."""
    from mem1_core.runs.layout import resolve_init

    found = []
    for name, sub, memory in (
        ("warm-start", WARM, "mem1"),
        ("mem1-ppo", PPO_MEM1, "mem1"),
        ("mem1-sft", SFT_MEM1, "mem1"),
        ("full-ppo", PPO_FULL, "full"),
        ("truncate-ppo", PPO_FULL, "truncate"),
    ):
        try:
            found.append((name, str(resolve_init(root / sub)), memory))
        except FileNotFoundError:
            continue
    return found


@flow(name="evaluate-objective-scaling", log_prints=True)
def evaluate_objective_scaling(
    profile: str, config_path: str | None, overrides: list[str] | None, run_dir: str
) -> dict[str, Any]:
    from mem1_core.evaluation.stage import run_objective_scaling

    cfg = build_config(profile, config_path, overrides)
    root = Path(run_dir)
    result = run_objective_scaling(
        cfg, root, root / EVAL, agents_of(root), teacher=True, progress=False
    )
    publish_table(
        "objective-scaling", result["headline"], f"EM and peak tokens per N, {root / EVAL}"
    )
    plots = "\n".join(f"- {k}: `{v}`" for k, v in result["plots"].items())
    publish_markdown(
        "objective-scaling-plots",
        f"# Objective scaling\n\nTable: `{result['table']}`\n\nPlots (PNG):\n{plots}\n\n"
        f"Ratios: {result['ratios']}\n",
        "objective-scaling plots and ratios",
    )
    return result


@flow(name="ablation-summary", log_prints=True)
def ablation_summary(run_dir: str) -> dict[str, Any]:
    """RL vs SFT from the same warm start, across N; and the training curves."""
    import pandas as pd

    from mem1_core.evaluation.scaling import plot_curves, plot_metric_vs_n, read_jsonl
    from mem1_core.runs import atomic

    root = Path(run_dir)
    table = pd.read_csv(root / EVAL / "metrics.csv")
    arms = table[table["agent"].isin(["mem1-ppo", "mem1-sft", "warm-start"])]
    out = root / ABLATION
    plot = plot_metric_vs_n(
        arms,
        "em_sum",
        "EM (sum over objectives)",
        "RL vs SFT from the same warm start",
        out / "rl_vs_sft.png",
    )
    curves = plot_curves(
        {
            "ppo mem1": read_jsonl(root / PPO_MEM1 / "metrics.jsonl"),
            "ppo full": read_jsonl(root / PPO_FULL / "metrics.jsonl"),
        },
        "iteration",
        "reward",
        "training reward (EM fraction)",
        "PPO training reward",
        out / "reward_curve.png",
    )
    rows = [
        {
            "agent": r.agent,
            "N": int(r.n_objectives),
            "em_sum": round(r.em_sum, 3),
            "em_frac": round(r.em_frac, 3),
            # objectives answered `?`: the forgetful teacher's habit, kept by SFT (teacher.forget_rate)
            "unknown_rate": round(getattr(r, "unknown_rate", float("nan")), 3),
        }
        for r in arms.itertuples()
    ]
    atomic.write_json(rows, out / "rl_vs_sft.json")
    if rows:
        publish_table("rl-vs-sft", rows, "RL vs SFT across N (EM)")
    publish_markdown(
        "rl-vs-sft-plots", f"# RL vs SFT\n\n- `{plot}`\n- `{curves}`\n", "ablation plots"
    )
    return {"rows": rows, "plots": [str(plot), str(curves)]}
