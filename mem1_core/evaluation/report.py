"""The headline a person reads at a glance: one table of agents × N (EM fraction ± standard
error, peak tokens), rounded to what the noise supports, and the few ratios the paper
reports (MEM1 / full-context peak tokens at the largest N, MEM1's peak growth from N=1,
RL − SFT at the largest N). Plots go inline as `data:` URIs, so a Prefect markdown artifact
or `summary.md` shows the picture, not a file path.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path

import pandas as pd

MEM1, FULL, SFT, BASE = "mem1-ppo", "full-ppo", "mem1-sft", "warm-start"
"""The agent names the pipeline gives its arms (mem1_core.evaluation.agents)."""


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


def _se(row) -> float | None:
    se = getattr(row, "em_frac_se", None)
    return None if se is None or (isinstance(se, float) and math.isnan(se)) else float(se)


def headline_rows(table: pd.DataFrame) -> list[dict]:
    """One row per agent: `N=k EM` (fraction ± SE) and `N=k peak` (mean peak tokens)."""
    rows = []
    ns = sorted(int(n) for n in table["n_objectives"].unique())
    for agent, g in table.groupby("agent", sort=False):
        by_n = {int(r.n_objectives): r for r in g.itertuples()}
        row: dict = {"agent": agent, "memory": g["policy"].iloc[0]}
        for n in ns:
            r = by_n.get(n)
            row[f"N={n} EM"] = pm(r.em_frac, _se(r)) if r is not None else ""
        for n in ns:
            r = by_n.get(n)
            row[f"N={n} peak"] = f"{r.peak_tokens:.0f}" if r is not None else ""
        rows.append(row)
    return rows


def paper_ratios(table: pd.DataFrame) -> list[dict]:
    """The paper's comparisons at the largest N, each with what it is computed from."""
    t = table.set_index(["agent", "n_objectives"])
    ns = sorted(int(n) for n in table["n_objectives"].unique())
    big, small = ns[-1], ns[0]
    out = []

    def get(agent: str, n: int, col: str) -> float | None:
        try:
            v = t.loc[(agent, n), col]
        except KeyError:
            return None
        return None if pd.isna(v) else float(v)

    p_m, p_f = get(MEM1, big, "peak_tokens"), get(FULL, big, "peak_tokens")
    if p_m and p_f:
        out.append(
            {"ratio": f"MEM1 / full-context peak tokens at N={big}", "value": f"{p_m / p_f:.2f}"}
        )
    p_1 = get(MEM1, small, "peak_tokens")
    if p_m and p_1:
        out.append({"ratio": f"MEM1 peak tokens, N={big} / N={small}", "value": f"{p_m / p_1:.2f}"})
    for n in (big, *[n for n in ns if n >= 4 and n != big]):
        rl, sft = get(MEM1, n, "em_frac"), get(SFT, n, "em_frac")
        if rl is None or sft is None:
            continue
        se = math.hypot(get(MEM1, n, "em_frac_se") or 0.0, get(SFT, n, "em_frac_se") or 0.0)
        out.append({"ratio": f"RL − SFT EM fraction at N={n}", "value": pm(rl - sft, se or None)})
        break
    em_m, em_f = get(MEM1, big, "em_frac"), get(FULL, big, "em_frac")
    if em_m is not None and em_f is not None:
        se = math.hypot(get(MEM1, big, "em_frac_se") or 0.0, get(FULL, big, "em_frac_se") or 0.0)
        out.append(
            {
                "ratio": f"MEM1 − full-context EM fraction at N={big}",
                "value": pm(em_m - em_f, se or None),
            }
        )
    return out


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


def headline_markdown(table: pd.DataFrame, plots: dict[str, str | Path] | None = None) -> str:
    """The headline section of `summary.md` and the `mem1-headline` artifact."""
    parts = [
        "## Agents × N (EM fraction ± standard error; mean peak tokens)\n",
        markdown_table(headline_rows(table)),
        "\n## The paper's comparisons\n",
        markdown_table(paper_ratios(table)),
    ]
    for name, path in (plots or {}).items():
        if Path(path).exists():
            parts.append(f"\n### {name}\n\n{image_markdown(path, name)}\n")
    return "".join(parts)
