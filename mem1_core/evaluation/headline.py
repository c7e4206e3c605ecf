"""The headline of an evaluation, computed once: agents × N and the paper's comparisons at
every N, with standard errors. The evaluation writes it to `eval/headline.json`; the run
summary, the Prefect artifacts, `mem1 compare`, the nightly trend and the launcher only
render it (mem1_core.evaluation.report).

Schema (`HEADLINE_SCHEMA`):
- `scorer`: how answers were scored (`eval.scorer`).
- `domain`, `units` (absent in headlines written before them, which are QA's): the run's
  domain and how its headline names and scales its score (mem1_core.domains.base.Units:
  QA's EM as a fraction; WebShop's reward ×100 and its success rate).
- `objectives`: the N evaluated, ascending.
- `cells`: one per agent and `N`: `em_frac` ± `em_frac_se` (the mean task score: QA's EM as a
  fraction of objectives, WebShop's reward), `em_sum` ± `em_sum_se` (EM summed over objectives:
  the paper's 0..N scale, = em_frac × N), `score` ± `score_se` (the mean task score in the
  domain's units, em_frac × units.scale: QA's EM fraction, WebShop's reward ×100), where the
  domain defines success `success_rate` ± `success_rate_se` (the share of tasks whose score is
  units.success, from the per-task scores), `peak_tokens` ± `peak_tokens_se` (mean over all
  tasks), `peak_tokens_credited` (mean over the tasks that earned any credit: the paper's
  average), `tasks`, `credited_tasks`. A number not measured (a table written before it
  existed, or no spread to see) is null.
- `comparisons`: one per comparison and `N` where both of its agents were evaluated: `value`
  ± `se`, with the agents it compares (`a`, `b`); a score difference is in the domain's units
  (WebShop: reward ×100), in QA also as `value_sum` ± `se_sum` (on the 0..N scale); where both
  agents' per-task scores are known and cover the same tasks, also `se_paired` (and
  `se_sum_paired`).
- `task_em` (absent in headlines written before it): agent -> N (a string) -> task id -> that
  task's score (QA: its EM fraction), read from the evaluation's trajectories.

`se` treats the two agents of a comparison as independent samples. They played the same
tasks, so task difficulty, which both share, inflates it; `se_paired` is the standard error of
the mean per-task difference (the paired one: Miller 2024, "Adding Error Bars to Evals", §4),
usually smaller, and the one to test a difference between agents with.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from mem1_core.domains.base import Units
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
    """What a reader sees (`{score}`: the score's column in the domain's units)."""
    a: str
    """The role of the first agent (`mem1`, `full` or `sft`)."""
    b: str
    """The role of the second."""
    metric: str
    """The cell column compared (`em_frac` or `peak_tokens`)."""
    ratio: bool
    """a / b (with the delta-method error) if True, else a − b."""


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("mem1_minus_full_em", "MEM1 − full context, {score}", "mem1", "full", "em_frac", False),
    Comparison("rl_minus_sft_em", "RL − SFT (MEM1 memory), {score}", "mem1", "sft", "em_frac", False),
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


def _cell(r: Mapping[str, Any], units: Units, scores: Mapping[str, float] | None) -> dict[str, Any]:
    """A row of the evaluation table as a headline cell; `scores`: its per-task scores
    (task id -> score), where known, for the success rate."""
    n = int(r["n_objectives"])
    se = _number(r.get("em_frac_se"))
    cell = {
        "agent": r["agent"],
        "memory": r.get("memory", r.get("policy")),
        "N": n,
        "tasks": None if r.get("tasks") is None else int(r["tasks"]),
        "em_frac": _number(r["em_frac"]),
        "em_frac_se": se,
        # every task has N objectives, so a task's EM sum is N × its fraction: the same SE × N
        "em_sum": _number(r.get("em_sum", r["em_frac"] * n)),
        "em_sum_se": None if se is None else se * n,
        "score": _times(_number(r["em_frac"]), units.scale),
        "score_se": _times(se, units.scale),
        "peak_tokens": _number(r["peak_tokens"]),
        "peak_tokens_se": _number(r.get("peak_tokens_se")),
        "peak_tokens_credited": _number(r.get("peak_tokens_credited")),
        "credited_tasks": None if r.get("credited_tasks") is None else int(r["credited_tasks"]),
    }
    if units.success is not None:
        cell |= success_rate(scores, units.success)
    return cell


def success_rate(scores: Mapping[str, float] | None, success: float) -> dict[str, Any]:
    """`success_rate` ± `success_rate_se`: the share of tasks whose score is `success`, over
    the per-task scores (task id -> score); null where they are not known."""
    from mem1_core.evaluation.summary import standard_error

    if not scores:
        return {"success_rate": None, "success_rate_se": None}
    hits = [float(s == success) for s in scores.values()]
    return {
        "success_rate": sum(hits) / len(hits),
        "success_rate_se": _number(standard_error(hits)),
    }


def paired_se(a: Mapping[str, float] | None, b: Mapping[str, float] | None) -> float | None:
    """The standard error of the mean of a[t] − b[t] over tasks t (task id -> score): the
    error of a difference between two agents that played the same tasks. None unless both
    cover the same tasks, at least two of them."""
    from mem1_core.evaluation.summary import standard_error

    if not a or not b or set(a) != set(b) or len(a) < 2:
        return None
    return standard_error([a[t] - b[t] for t in a])


def task_scores(
    traj_dir: str | Path, table: pd.DataFrame
) -> dict[str, dict[str, dict[str, float]]]:
    """Per-task scores (QA: EM fractions) of every (agent, N) row of an evaluation table, from
    its trajectories (`<agent>_n<N>.parquet`, as mem1_core.evaluation.scaling writes them):
    agent -> str(N) -> task id -> score. A row without its file is left out."""
    import pyarrow.parquet as pq

    out: dict[str, dict[str, dict[str, float]]] = {}
    for agent, n in zip(table["agent"], table["n_objectives"], strict=True):
        path = Path(traj_dir) / f"{agent}_n{int(n)}.parquet"
        if not path.is_file():
            continue
        t = pq.read_table(path, columns=["task_id", "reward"]).to_pydict()
        out.setdefault(str(agent), {})[str(int(n))] = dict(
            zip(map(str, t["task_id"]), map(float, t["reward"]), strict=True)
        )
    return out


def _task_em(h: Mapping[str, Any], agent: str, n: int) -> dict[str, float] | None:
    return (h.get("task_em") or {}).get(agent, {}).get(str(n))


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


def _in_units(got: dict[str, Any], metric: str, n: int, units: Units) -> dict[str, Any]:
    """A score difference in the domain's units (× units.scale: WebShop's reward ×100) and,
    where a task's score is per objective, also on the paper's scale (summed over N)."""
    if metric != "em_frac":
        return got
    unscaled = got
    got = got | {k: _times(got[k], units.scale) for k in ("value", "se", "se_paired") if k in got}
    if not units.per_objective:
        return got
    got |= {"value_sum": unscaled["value"] * n, "se_sum": _times(unscaled["se"], n)}
    if "se_paired" in got:
        got["se_sum_paired"] = _times(unscaled["se_paired"], n)
    return got


def _times(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def compare_cells(
    c: Comparison,
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    n: int,
    tasks: tuple[Mapping[str, float] | None, Mapping[str, float] | None] | None = None,
    units: Units | None = None,
) -> dict[str, Any] | None:
    """Comparison `c` of two cells at N=`n` (cells as `build_headline` writes them):
    `value` ± `se`, a score difference in `units` (QA's by default, also on the 0..N scale);
    None where a number is missing. `tasks`: the two agents' per-task scores (task id ->
    score); where they cover the same tasks, a score difference also gets its paired error,
    `se_paired`."""
    got = _compare(c, a, b)
    if got is None:
        return None
    if tasks is not None and c.metric == "em_frac" and not c.ratio:
        se = paired_se(*tasks)
        if se is not None:
            got["se_paired"] = se
    return _in_units(got, c.metric, n, units or Units())


def compare_agents(
    h: Mapping[str, Any], c: Comparison, a: str, b: str, n: int
) -> dict[str, Any] | None:
    """Comparison `c` between agents `a` and `b` at N=`n` of headline `h`, with the paired
    error where `h` has both agents' per-task scores; None where either was not evaluated."""
    cells = {(x["agent"], x["N"]): x for x in h["cells"]}
    ca, cb = cells.get((a, n)), cells.get((b, n))
    if not ca or not cb:
        return None
    tasks = (_task_em(h, a, n), _task_em(h, b, n))
    return compare_cells(c, ca, cb, n, tasks, headline_units(h))


def headline_units(h: Mapping[str, Any]) -> Units:
    """The units a headline is in (QA's for one written before headlines recorded theirs)."""
    return Units.from_dict(h.get("units"))


def build_headline(
    table: pd.DataFrame,
    scorer: str = "squad",
    roles: Mapping[str, str] | None = None,
    task_em: Mapping[str, Mapping[str, Mapping[str, float]]] | None = None,
    units: Units | None = None,
    domain: str | None = None,
) -> dict[str, Any]:
    """THE headline of an evaluation table (eval/metrics: one row per agent and N). `roles`:
    role -> agent for the comparisons (default_roles when None). `task_em`: per-task scores
    (`task_scores`), which give the comparisons their paired errors and a domain with success
    its success rates. `units`, `domain`: the run's domain's (`domain_of(cfg)`: its `units`
    and `name`); QA's units when None."""
    units = units or Units()
    records = table.to_dict("records")
    scores_of = {a: dict(by_n) for a, by_n in (task_em or {}).items()}
    cells = [
        _cell(r, units, scores_of.get(str(r["agent"]), {}).get(str(int(r["n_objectives"]))))
        for r in records
    ]
    agents = {c["agent"]: c["memory"] for c in cells}
    roles = default_roles(agents) if roles is None else dict(roles)
    ns = sorted({c["N"] for c in cells})
    comparisons = []
    scores = {"cells": cells, "task_em": task_em or {}, "units": units.to_dict()}
    for c in COMPARISONS:
        if c.a not in roles or c.b not in roles:
            continue
        for n in ns:
            got = compare_agents(scores, c, roles[c.a], roles[c.b], n)
            if got is not None:
                comparisons.append(
                    {"comparison": c.name, "label": c.label.format(score=units.column), "N": n,
                     "a": roles[c.a], "b": roles[c.b], **got}
                )  # fmt: skip
    return {
        "schema": HEADLINE_SCHEMA,
        "scorer": scorer,
        **({"domain": domain} if domain is not None else {}),
        "units": units.to_dict(),
        "objectives": ns,
        "agents": list(agents),
        "roles": roles,
        "cells": cells,
        "comparisons": comparisons,
    } | ({"task_em": {a: dict(by_n) for a, by_n in task_em.items()}} if task_em else {})


def upgraded(h: Mapping[str, Any]) -> dict[str, Any]:
    """A headline as this version writes it: one written before headlines recorded their
    units is QA's, each cell's `score` its EM fraction."""
    units = headline_units(h)
    cells = [
        {
            "score": _times(c["em_frac"], units.scale),
            "score_se": _times(c.get("em_frac_se"), units.scale),
        }
        | c
        for c in h["cells"]
    ]
    return {**h, "units": units.to_dict(), "cells": cells}


HEADLINE_FILE = "headline.json"


def write_headline(headline: Mapping[str, Any], eval_dir: str | Path) -> Path:
    return atomic.write_json(dict(headline), Path(eval_dir) / HEADLINE_FILE)


def read_headline(eval_dir: str | Path) -> dict[str, Any]:
    """An evaluation directory's headline: its headline.json; for an evaluation written before
    there was one, computed from its metrics.csv (scored `squad`, the only scorer then); for
    one written before `task_em`, recomputed with the per-task scores its trajectories hold
    (the paired errors), with its own scorer, roles and units; one written before units, QA's
    (`upgraded`)."""
    d = Path(eval_dir)
    path = d / "metrics.csv"
    if (d / HEADLINE_FILE).is_file():
        h = json.loads((d / HEADLINE_FILE).read_text())
        if "task_em" in h or not path.is_file() or not (d / "trajectories").is_dir():
            return upgraded(h)
        table = pd.read_csv(path)
        scores = task_scores(d / "trajectories", table)
        if not scores:
            return upgraded(h)
        units = headline_units(h)
        return build_headline(table, h["scorer"], h.get("roles"), scores, units, h.get("domain"))
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no evaluation table (run the pipeline's evaluation stage, or "
            f"`mem1 evaluate --run RUN --out {d} ...`)"
        )
    table = pd.read_csv(path)
    scorer = str(table["scorer"].iloc[0]) if "scorer" in table and len(table) else "squad"
    return build_headline(table, scorer, task_em=task_scores(d / "trajectories", table))


def cells_table(headline: Mapping[str, Any]) -> pd.DataFrame:
    """The headline's cells as a table with eval/metrics' column names (one row per agent and
    N, `n_objectives` for `N`), NaN where null."""
    table = pd.DataFrame(headline["cells"]).rename(columns={"N": "n_objectives"})
    numbers = [c for c in table.columns if c not in ("agent", "memory", "n_objectives")]
    return table.astype({c: float for c in numbers})
