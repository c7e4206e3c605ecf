"""Runs over time: two run directories side by side (`mem1 compare RUN_A RUN_B`, in their
domain's units), and the nightly evaluation's trend across nights (EM at each N for the
newest checkpoint), with the change from the previous night.

Both render what evaluations already write: `<run>/eval/headline.json` (one cell per agent
and N, mem1_core.evaluation.headline; computed from `eval/metrics.csv` for a run written
before it existed) and, for the trend, `<nightly_dir>/trend.csv`, to which each night appends
its headline's cells atomically (a killed night leaves the previous trend intact).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mem1_core.evaluation.headline import cells_table, headline_units, read_headline
from mem1_core.evaluation.report import figures, pm
from mem1_core.runs import atomic
from mem1_core.runs.layout import EVAL

TREND_COLUMNS = [
    "night",
    "checkpoint",
    "agent",
    "n_objectives",
    "em_frac",
    "em_frac_se",
    "em_sum",
    "em_sum_se",
    "peak_tokens",
    "peak_tokens_credited",
]
"""trend.csv's columns (a trend begun before em_sum reads NaN there for its old nights)."""


def read_eval_table(run: str | Path) -> pd.DataFrame:
    """A run's evaluation table; a clear error when the run has none."""
    path = Path(run) / "eval" / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no evaluation table (run the pipeline's evaluation stage, or "
            f"`mem1 evaluate --run {run} --out {Path(run) / 'eval'} ...`)"
        )
    table = pd.read_csv(path)
    if "em_frac_se" not in table:
        table["em_frac_se"] = float("nan")  # tables written before the standard error
    return table


def compare_runs(a: str | Path, b: str | Path) -> list[dict]:
    """Rows (agent, N) present in either run's headline, in their domain's units: the score
    ± SE of each (QA: EM fraction; WebShop: reward ×100), the difference b − a with its
    standard error, the units' other figures (QA: EM sum; WebShop: success rate) and the peak
    tokens of each."""
    keys = ["agent", "n_objectives"]
    heads = [read_headline(Path(r) / EVAL) for r in (a, b)]
    units = headline_units(heads[0])
    if headline_units(heads[1]).scaled != units.scaled:
        raise ValueError(
            f"{a} reports {units.scaled}, {b} {headline_units(heads[1]).scaled}: compare two "
            "runs of one domain"
        )
    score, *others = figures(units)
    cols = [c for f in (score, *others) for c in (f.key, f.se)] + ["peak_tokens"]
    ta, tb = (cells_table(h).reindex(columns=keys + cols) for h in heads)
    m = ta.merge(tb, on=keys, how="outer", suffixes=("_a", "_b"))
    rows = []
    for r in m.sort_values(keys).to_dict("records"):
        row = {"agent": r["agent"], "N": int(r["n_objectives"])}
        for side in ("a", "b"):
            row[f"{units.scaled} {side.upper()}"] = _pm_cell(r, score, side)
        va, vb = r[f"{score.key}_a"], r[f"{score.key}_b"]
        if pd.isna(va) or pd.isna(vb):
            row["B − A"] = ""
        else:
            se = math.hypot(_nan_zero(r[f"{score.se}_a"]), _nan_zero(r[f"{score.se}_b"]))
            row["B − A"] = pm(vb - va, se or None)
        for f in others:
            for side in ("a", "b"):
                row[f"{f.name} {side.upper()}"] = _pm_cell(r, f, side)
        for side in ("a", "b"):
            peak = r[f"peak_tokens_{side}"]
            row[f"peak {side.upper()}"] = "" if pd.isna(peak) else f"{peak:.0f}"
        rows.append(row)
    return rows


def _pm_cell(r: dict, f, side: str) -> str:
    """A merged row's figure `f` of run `side` ("a" or "b") ± its SE; empty where missing."""
    value = r[f"{f.key}_{side}"]
    return "" if pd.isna(value) else pm(value, _nan_none(r[f"{f.se}_{side}"]))


def _nan_none(x):
    return None if x is None or pd.isna(x) else float(x)


def _nan_zero(x) -> float:
    return 0.0 if x is None or pd.isna(x) else float(x)


def append_night(
    trend_csv: str | Path, night: str, checkpoint: str, table: pd.DataFrame
) -> pd.DataFrame:
    """Add one night's evaluation (its headline's `cells_table`, or an eval/metrics table) to
    the trend, replacing an earlier row of the same night so a rerun of a night does not count
    twice; returns the whole trend."""
    path = Path(trend_csv)
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=TREND_COLUMNS)
    new = table.assign(night=night, checkpoint=checkpoint)
    for col in TREND_COLUMNS:
        if col not in new:  # a table older than the column
            new[col] = float("nan")
    old = old.reindex(columns=TREND_COLUMNS)
    trend = pd.concat([old[old["night"] != night], new[TREND_COLUMNS]], ignore_index=True)
    trend = trend.sort_values(["night", "agent", "n_objectives"], kind="stable")
    atomic.write_text(trend.to_csv(index=False), path)
    return trend


def previous_night(trend: pd.DataFrame, night: str) -> list[dict]:
    """Tonight against the night before (same agent and N): EM fraction and its change."""
    nights = sorted(n for n in trend["night"].unique() if n < night)
    now = trend[trend["night"] == night]
    if not nights:
        return [
            {
                "agent": r.agent,
                "N": int(r.n_objectives),
                "tonight": pm(r.em_frac, _nan_none(r.em_frac_se)),
                "tonight EM sum": _sum(r),
                "previous": "",
                "change": "",
            }
            for r in now.itertuples()
        ]
    prev = trend[trend["night"] == nights[-1]].set_index(["agent", "n_objectives"])
    rows = []
    for r in now.itertuples():
        row = {
            "agent": r.agent,
            "N": int(r.n_objectives),
            "tonight": pm(r.em_frac, _nan_none(r.em_frac_se)),
            "tonight EM sum": _sum(r),
        }
        try:
            p = prev.loc[(r.agent, r.n_objectives)]
        except KeyError:
            row |= {"previous": "", "change": ""}
        else:
            se = math.hypot(_nan_zero(r.em_frac_se), _nan_zero(p["em_frac_se"]))
            row |= {
                "previous": pm(p["em_frac"], _nan_none(p["em_frac_se"])),
                "change": pm(r.em_frac - p["em_frac"], se or None),
            }
        rows.append(row)
    return rows


def _sum(r) -> str:
    return "" if pd.isna(r.em_sum) else pm(r.em_sum, _nan_none(r.em_sum_se))


def plot_trend(trend: pd.DataFrame, path: str | Path) -> Path:
    """EM fraction per night, one line per (agent, N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (agent, n), g in trend.groupby(["agent", "n_objectives"], sort=True):
        g = g.sort_values("night")
        ax.errorbar(
            g["night"],
            g["em_frac"],
            yerr=g["em_frac_se"].fillna(0),
            marker="o",
            capsize=2,
            label=f"{agent} N={n}",
        )
    ax.set_xlabel("night")
    ax.set_ylabel("EM fraction (± standard error)")
    ax.set_title("Nightly evaluation of the newest checkpoint")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.autofmt_xdate()
    return atomic.write_figure(fig, path, dpi=110)
