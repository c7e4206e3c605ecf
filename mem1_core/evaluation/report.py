"""Rendering the headline (mem1_core.evaluation.headline, computed once per evaluation) for a
person: agents × N (the score ± standard error in the domain's units, peak tokens both ways)
and the paper's comparisons at every N, rounded to what the noise supports, as markdown
(summary.md, Prefect artifacts) or aligned text (a terminal). Plots go inline as `data:` URIs,
so a Prefect markdown artifact or `summary.md` shows the picture, not a file path. Nothing
here computes a number the headline does not hold.

The columns and their names come from the units the headline records (its domain's `Units`):
QA's EM fraction and EM sum over the N objectives; WebShop's reward ×100 and success rate.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem1_core.domains.base import Units
from mem1_core.evaluation.headline import headline_units, upgraded


def decimals(se: float) -> int:
    """Digits that the noise supports: one significant digit of the standard error (two
    decimals at most for a fraction, one at least)."""
    if not se or not math.isfinite(se) or se <= 0:
        return 2
    return min(3, max(1, -math.floor(math.log10(se))))


def pm(mean: float, se: float | None) -> str:
    """`0.62 ± 0.04`, rounded to the standard error."""
    if se is None or (isinstance(se, float) and math.isnan(se)):
        return f"{mean:.2f}"
    d = decimals(se)
    return f"{mean:.{d}f} ± {se:.{d}f}"


def _pm_or_dash(mean: float | None, se: float | None) -> str:
    return "—" if mean is None else pm(mean, se)


def _tokens(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f}"


@dataclass(frozen=True)
class Figure:
    """One figure of a headline cell as the renderings name it."""

    name: str
    """"EM fraction", "EM sum", "reward ×100", "success rate"."""
    key: str
    """The cell's value."""
    se: str
    """The cell's standard error of it."""
    range: str = ""
    """What the agents table adds to the name: " (0..N)"."""


def figures(units: Units) -> list[Figure]:
    """The figures a headline in `units` shows per cell, first its score in its units: QA's EM
    fraction and its EM summed over the N objectives (the paper's 0..N scale); WebShop's
    reward ×100 and its success rate."""
    out = [Figure(units.column, "score", "score_se")]
    if units.per_objective:
        out.append(Figure(f"{units.score} sum", "em_sum", "em_sum_se", " (0..N)"))
    if units.success is not None:
        out.append(Figure("success rate", "success_rate", "success_rate_se"))
    return out


def agent_rows(headline: Mapping[str, Any]) -> list[dict[str, str]]:
    """Agents × N, one row per agent and N (in the headline's order): the figures of its units
    (`figures`), ± standard error, and peak tokens averaged both ways."""
    h = upgraded(headline)
    units = headline_units(h)
    # the paper's average over the tasks with credit (MIT-MI/MEM1 inference/eval.py skips tasks
    # without EM)
    credited = f"peak, {units.credited}"
    return [
        {"agent": c["agent"], "memory": c["memory"] or "", "N": str(c["N"])}
        | {f.name + f.range: _pm_or_dash(c.get(f.key), c.get(f.se)) for f in figures(units)}
        | {
            "peak, all tasks": _tokens(c["peak_tokens"]),
            credited: _tokens(c.get("peak_tokens_credited")),
        }
        for c in h["cells"]
    ]


def comparison_rows(headline: Mapping[str, Any]) -> list[dict[str, str]]:
    """The paper's comparisons at every N: value ± standard error (a score difference in the
    headline's units, QA's also on the 0..N scale, and its paired error where the headline has
    per-task scores)."""
    units = headline_units(headline)
    summed = f"{units.score} sum difference"
    # three decimals of a fraction, the same digits on the units' scale (reward ×100: one)
    digits = max(0, 3 - round(math.log10(units.scale)))
    rows = []
    for c in headline["comparisons"]:
        row = {
            "comparison": c["label"],
            "N": str(c["N"]),
            "value": pm(c["value"], c["se"]),
            "paired SE": "" if c.get("se_paired") is None else f"{c['se_paired']:.{digits}f}",
        }
        if units.per_objective:
            row[summed] = pm(c["value_sum"], c["se_sum"]) if c.get("value_sum") is not None else ""
        rows.append(row | {"agents": f"{c['a']} vs {c['b']}"})
    return rows


def scorer_line(headline: Mapping[str, Any]) -> str:
    """How the tasks were scored (the units' `scoring`) and how to read a comparison's error."""
    scoring = headline_units(headline).scoring.format(scorer=headline.get("scorer", "squad"))
    return (
        f"{scoring} A comparison's ± treats the agents as independent (conservative); "
        "its paired SE, over the tasks both played, is the error to test a difference with."
    )


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "_(no rows)_\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def text_table(rows: list[dict]) -> str:
    """The same rows aligned for a terminal."""
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    line = "  ".join(c.ljust(width[c]) for c in cols)
    body = ["  ".join(str(r.get(c, "")).ljust(width[c]) for c in cols) for r in rows]
    return "\n".join([line, "-" * len(line), *body]) + "\n"


def image_markdown(path: str | Path, alt: str) -> str:
    """A PNG inline as a `data:image/png;base64,…` URI (the Prefect UI renders it)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return f"![{alt}](data:image/png;base64,{data})"


def headline_markdown(
    headline: Mapping[str, Any], plots: Mapping[str, str | Path] | None = None
) -> str:
    """The headline section of `summary.md` and the `mem1-headline` artifact."""
    parts = [
        "## Agents × N\n\n",
        scorer_line(headline) + "\n\n",
        markdown_table(agent_rows(headline)),
    ]
    if headline["comparisons"]:
        parts += ["\n## The paper's comparisons, at every N\n\n"]
        parts += [markdown_table(comparison_rows(headline))]
    for name, path in (plots or {}).items():
        if Path(path).exists():
            parts.append(f"\n### {name}\n\n{image_markdown(path, name)}\n")
    return "".join(parts)


def headline_text(headline: Mapping[str, Any]) -> str:
    """The same for a terminal: agents × N, then the comparisons."""
    text = text_table(agent_rows(headline))
    if headline["comparisons"]:
        text += "\n" + text_table(comparison_rows(headline))
    return text
