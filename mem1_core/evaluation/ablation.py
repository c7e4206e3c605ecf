"""The ablation summary of a pipeline run: RL vs SFT from the same warm start across N (the
paper's RL-vs-SFT contrast, MEM1 §5.4), and the PPO training curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from mem1_core.evaluation.scaling import plot_curves, plot_metric_vs_n, read_jsonl
from mem1_core.runs import atomic
from mem1_core.runs.layout import ABLATION, EVAL, PPO_FULL, PPO_MEM1

ARMS = ("mem1-ppo", "mem1-sft", "warm-start")
"""The agents (rows of eval/metrics.csv) the RL-vs-SFT table compares."""


def ablation_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per arm and N: EM summed and as a fraction, and the unknown rate."""
    return [
        {
            "agent": r.agent,
            "N": int(r.n_objectives),
            "em_sum": round(r.em_sum, 3),
            "em_frac": round(r.em_frac, 3),
            # objectives answered `?`: the forgetful teacher's habit, kept by SFT (teacher.forget_rate)
            "unknown_rate": round(getattr(r, "unknown_rate", float("nan")), 3),
        }
        for r in table[table["agent"].isin(ARMS)].itertuples()
    ]


def ablation_summary(run_dir: str | Path) -> dict[str, Any]:
    """Read the run's evaluation table and training curves; write `ablation/` (the RL vs SFT
    plot and rows, the reward curves). -> rows and plot paths."""
    root = Path(run_dir)
    table = pd.read_csv(root / EVAL / "metrics.csv")
    out = root / ABLATION
    plot = plot_metric_vs_n(
        table[table["agent"].isin(ARMS)],
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
    rows = ablation_rows(table)
    atomic.write_json(rows, out / "rl_vs_sft.json")
    return {"rows": rows, "plots": [str(plot), str(curves)]}
