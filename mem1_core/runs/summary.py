"""A pipeline run's summary.md: its status, run directory, every stage's state and the
headline numbers of the stages that ran (nothing is reported for a stage that did not)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
        elif name in summary["not_built"]:
            lines.append(f"| {name} | not built yet | |")
        else:
            lines.append(f"| {name} | not run | |")
    rows = summary["headline_rows"]
    lines += ["", "## Headline numbers", ""]
    if rows:
        lines += ["| stage | metric | value |", "| --- | --- | --- |"]
        lines += [f"| {r['stage']} | {r['metric']} | {r['value']} |" for r in rows]
    else:
        lines.append("No stage produced numbers.")
    if summary["not_built"]:
        lines += [
            "",
            "Stages not built yet (no results, nothing pretended): "
            + ", ".join(summary["not_built"])
            + ".",
        ]
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
