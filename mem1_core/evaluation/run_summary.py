"""A pipeline run's summary.md: its status, run directory, every stage's state and the
headline numbers of the stages that ran (nothing is reported for a stage that did not)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mem1_core.runs.layout import EVAL

PLOTS = {
    "{score} vs N": ("eval", "em.png"),
    "peak tokens vs N": ("eval", "peak_tokens.png"),
    "RL vs SFT": ("ablation", "rl_vs_sft.png"),
    "PPO training reward": ("ablation", "reward_curve.png"),
}
"""The run's plots, as the evaluation and ablation stages write them (`{score}`: the score's
column in the evaluation's units, "EM fraction" or "reward ×100")."""


def run_headline(run_dir: str | Path, outputs: Mapping[str, Any]) -> dict[str, Any]:
    """What a person reads first, for summary.json: the evaluation's headline
    (`eval_headline`, eval/headline.json; computed from eval/metrics.csv for a run written
    before it existed) and its renderings (`agents`, `comparisons`, `headline_text`), the
    plots and where the W&B runs are. No headline keys when no evaluation ran."""
    from mem1_core.domains.base import Units
    from mem1_core.evaluation.headline import headline_units, read_headline
    from mem1_core.evaluation.report import agent_rows, comparison_rows, headline_text

    root = Path(run_dir)
    try:
        headline = read_headline(root / EVAL)
    except FileNotFoundError:
        headline = None
    score = (headline_units(headline) if headline else Units()).column
    out: dict[str, Any] = {
        "plots": {
            k.format(score=score): str(root / d / f)
            for k, (d, f) in PLOTS.items()
            if (root / d / f).is_file()
        },
        "wandb": _wandb_runs(outputs),
    }
    if headline is None:
        return out
    out["eval_headline"] = headline
    out["agents"] = agent_rows(headline)
    out["comparisons"] = comparison_rows(headline)
    out["headline_text"] = headline_text(headline)
    return out


def _wandb_runs(outputs: Mapping[str, Any]) -> list[dict]:
    found = []

    def walk(x: Any) -> None:
        if isinstance(x, Mapping):
            if isinstance(x.get("wandb"), Mapping):
                found.append(dict(x["wandb"]))
            for v in x.values():
                if isinstance(v, Mapping):
                    walk(v)

    walk(outputs)
    return found


def render_headline(summary: Mapping[str, Any], images: bool = True) -> str:
    """The compact headline of a summary: its evaluation's headline rendered (agents × N, the
    comparisons), optionally the plots inline, and the W&B runs."""
    from mem1_core.evaluation.headline import headline_units
    from mem1_core.evaluation.report import headline_markdown, image_markdown

    headline = summary.get("eval_headline")
    plots = (summary.get("plots") or {}) if images else {}
    lines = []
    if headline is not None:
        units = headline_units(headline)
        lines += [
            f"{units.figures} over held-out {units.held_out}, greedy.",
            "",
            headline_markdown(headline, plots),
        ]
    else:
        for name, path in plots.items():
            if Path(path).is_file():
                lines += [f"### {name}", "", image_markdown(path, name), ""]
    for w in summary.get("wandb") or []:
        lines.append(f"- W&B run `{w['name']}` (id `{w['id']}`, {w['mode']}): `{w['sync']}`")
    return "\n".join(lines) + "\n"


def _short(v: Any) -> Any:
    return f"{v:.4g}" if isinstance(v, float) else v


def render_summary(summary: Mapping[str, Any]) -> str:
    """The summary markdown: status, run directory, every stage's state, headline table."""
    lines = [
        f"# mem1 run `{summary['run_name']}` — {summary['status']}",
        "",
        f"- run directory: `{summary['run_dir']}`",
        f"- profile: `{summary['profile']}`",
        "",
        "| stage | state | seconds |",
        "| --- | --- | --- |",
    ]
    for name in summary["pipeline"]:
        if name in summary["seconds"]:
            state = "failed" if name == summary.get("failed_stage") else "ran"
            lines.append(f"| {name} | {state} | {summary['seconds'][name]:.1f} |")
        else:
            lines.append(f"| {name} | not run | |")
    if summary.get("eval_headline") or summary.get("plots"):
        lines += ["", render_headline(summary)]
    rows = summary["headline_rows"]
    lines += ["", "<details><summary>Every stage's numbers</summary>", ""]
    if rows:
        lines += ["| stage | metric | value |", "| --- | --- | --- |"]
        lines += [f"| {r['stage']} | {r['metric']} | {_short(r['value'])} |" for r in rows]
    else:
        lines.append("No stage produced numbers.")
    lines += ["", "</details>"]
    if summary.get("error"):
        lines += [
            "",
            f"## Failure in `{summary['failed_stage']}`",
            "",
            "```",
            summary["error"],
            "```",
        ]
    return "\n".join(lines) + "\n"
