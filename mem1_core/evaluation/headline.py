"""The headline of an evaluation, computed once: agents × N and the paper's comparisons at
every N, with standard errors. The evaluation writes it to `eval/headline.json`; the run
summary, the Prefect artifacts, `mem1 compare`, the nightly trend and the launcher only
render it (mem1_core.evaluation.report).

Schema (`HEADLINE_SCHEMA`):
- `scorer`: how answers were scored (`eval.scorer`).
- `objectives`: the N evaluated, ascending.
- `cells`: one per agent and `N`: `em_frac` ± `em_frac_se` (EM as a fraction of objectives),
  `em_sum` ± `em_sum_se` (EM summed over objectives: the paper's 0..N scale, = em_frac × N),
  `peak_tokens` ± `peak_tokens_se` (mean over all tasks), `peak_tokens_credited` (mean over
  the tasks that earned any credit: the paper's average), `tasks`, `credited_tasks`. A number
  not measured (a table written before it existed, or no spread to see) is null.
- `comparisons`: one per comparison and `N` where both of its agents were evaluated: `value`
  ± `se`, with the agents it compares (`a`, `b`); an EM difference also as `value_sum` ±
  `se_sum` (on the 0..N scale).

Standard errors of a comparison treat its two agents as independent samples. They ran on the
same tasks, so the true (paired) error is smaller: the stated one is conservative.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mem1_core.runs import atomic

HEADLINE_SCHEMA = 1
"""Bumped when a field of headline.json changes meaning."""

MEM1, FULL, SFT = "mem1-ppo", "full-ppo", "mem1-sft"
"""The agent names the pipeline gives its arms (mem1_core.evaluation.stage.TRAINED_AGENTS)."""


@dataclass(frozen=True)
class Comparison:
    """One of the paper's comparisons between two roles' agents at the same N."""

    name: str
    """Its key in headline.json."""
    label: str
    """What a reader sees."""
    a: str
    """The role of the first agent (`mem1`, `full` or `sft`)."""
    b: str
    """The role of the second."""
    metric: str
    """The cell column compared (`em_frac` or `peak_tokens`)."""
    ratio: bool
    """a / b (with the delta-method error) if True, else a − b."""


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("mem1_minus_full_em", "MEM1 − full context, EM fraction", "mem1", "full", "em_frac", False),
    Comparison("rl_minus_sft_em", "RL − SFT (MEM1 memory), EM fraction", "mem1", "sft", "em_frac", False),
    Comparison("mem1_over_full_peak", "MEM1 / full context, peak tokens", "mem1", "full", "peak_tokens", True),
)  # fmt: skip
"""The paper's comparisons (MEM1 §5: Table 1's EM and peak-token columns, §5.4 RL vs SFT)."""


def default_roles(agents: Mapping[str, str]) -> dict[str, str]:
    """role -> agent name among `agents` (name -> memory policy): the pipeline's names where
    present; else, for `mem1 evaluate --agent …`, the first trained agent under `mem1` whose
    name starts with `mem1` and the first under `full` (the scripted teacher is a reference,
    never a role)."""
    trained = {n: m for n, m in agents.items() if not n.startswith("teacher")}
    roles: dict[str, str] = {}
    mem1 = (
        MEM1
        if MEM1 in trained
        else next(
            (n for n, m in trained.items() if m == "mem1" and n.startswith("mem1") and n != SFT),
            None,
        )
    )
    full = FULL if FULL in trained else next((n for n, m in trained.items() if m == "full"), None)
    for role, name in (("mem1", mem1), ("full", full), ("sft", SFT if SFT in trained else None)):
        if name is not None:
            roles[role] = name
    return roles


def _number(x: Any) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _cell(r: Mapping[str, Any]) -> dict[str, Any]:
    n = int(r["n_objectives"])
    se = _number(r.get("em_frac_se"))
    return {
        "agent": r["agent"],
        "memory": r.get("memory", r.get("policy")),
        "N": n,
        "tasks": None if r.get("tasks") is None else int(r["tasks"]),
        "em_frac": _number(r["em_frac"]),
        "em_frac_se": se,
        # every task has N objectives, so a task's EM sum is N × its fraction: the same SE × N
        "em_sum": _number(r.get("em_sum", r["em_frac"] * n)),
        "em_sum_se": None if se is None else se * n,
        "peak_tokens": _number(r["peak_tokens"]),
        "peak_tokens_se": _number(r.get("peak_tokens_se")),
        "peak_tokens_credited": _number(r.get("peak_tokens_credited")),
        "credited_tasks": None if r.get("credited_tasks") is None else int(r["credited_tasks"]),
    }


def _compare(c: Comparison, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict | None:
    va, vb = a[c.metric], b[c.metric]
    if va is None or vb is None or (c.ratio and not vb):
        return None
    sa, sb = a.get(f"{c.metric}_se"), b.get(f"{c.metric}_se")
    if c.ratio:
        value = va / vb
        # delta method for a ratio of independent means
        se = (
            value * math.hypot(sa / va, sb / vb)
            if sa is not None and sb is not None and va
            else None
        )
    else:
        value = va - vb
        se = math.hypot(sa, sb) if sa is not None and sb is not None else None
    return {"value": value, "se": se}


def _with_sum(got: dict[str, Any], metric: str, n: int) -> dict[str, Any]:
    """An EM-fraction difference also on the paper's scale (EM summed over N objectives)."""
    if metric != "em_frac":
        return got
    se = got["se"]
    return got | {"value_sum": got["value"] * n, "se_sum": None if se is None else se * n}


def compare_cells(
    c: Comparison, a: Mapping[str, Any], b: Mapping[str, Any], n: int
) -> dict[str, Any] | None:
    """Comparison `c` of two cells at N=`n` (cells as `build_headline` writes them):
    `value` ± `se`, an EM difference also on the 0..N scale; None where a number is missing."""
    got = _compare(c, a, b)
    return None if got is None else _with_sum(got, c.metric, n)


def build_headline(
    table: pd.DataFrame, scorer: str = "squad", roles: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """THE headline of an evaluation table (eval/metrics: one row per agent and N). `roles`:
    role -> agent for the comparisons (default_roles when None)."""
    records = table.to_dict("records")
    cells = [_cell(r) for r in records]
    agents = {c["agent"]: c["memory"] for c in cells}
    roles = default_roles(agents) if roles is None else dict(roles)
    by = {(c["agent"], c["N"]): c for c in cells}
    ns = sorted({c["N"] for c in cells})
    comparisons = []
    for c in COMPARISONS:
        if c.a not in roles or c.b not in roles:
            continue
        for n in ns:
            a, b = by.get((roles[c.a], n)), by.get((roles[c.b], n))
            got = compare_cells(c, a, b, n) if a and b else None
            if got is not None:
                comparisons.append(
                    {"comparison": c.name, "label": c.label, "N": n,
                     "a": roles[c.a], "b": roles[c.b], **got}
                )  # fmt: skip
    return {
        "schema": HEADLINE_SCHEMA,
        "scorer": scorer,
        "objectives": ns,
        "agents": list(agents),
        "roles": roles,
        "cells": cells,
        "comparisons": comparisons,
    }


HEADLINE_FILE = "headline.json"


def write_headline(headline: Mapping[str, Any], eval_dir: str | Path) -> Path:
    return atomic.write_json(dict(headline), Path(eval_dir) / HEADLINE_FILE)


def read_headline(eval_dir: str | Path) -> dict[str, Any]:
    """An evaluation directory's headline: its headline.json; for an evaluation written before
    there was one, computed from its metrics.csv (scored `squad`, the only scorer then)."""
    d = Path(eval_dir)
    if (d / HEADLINE_FILE).is_file():
        return json.loads((d / HEADLINE_FILE).read_text())
    path = d / "metrics.csv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no evaluation table (run the pipeline's evaluation stage, or "
            f"`mem1 evaluate --run RUN --out {d} ...`)"
        )
    table = pd.read_csv(path)
    scorer = str(table["scorer"].iloc[0]) if "scorer" in table and len(table) else "squad"
    return build_headline(table, scorer)


def cells_table(headline: Mapping[str, Any]) -> pd.DataFrame:
    """The headline's cells as a table with eval/metrics' column names (one row per agent and
    N, `n_objectives` for `N`), NaN where null."""
    table = pd.DataFrame(headline["cells"]).rename(columns={"N": "n_objectives"})
    numbers = [c for c in table.columns if c not in ("agent", "memory", "n_objectives")]
    return table.astype({c: float for c in numbers})
