"""Flow `mem1` of deployment `mem1/experiment-report`: one headline from an experiment's parts.

Parts of an experiment run on machines that share no disk; each exports its records
(`mem1 experiment export RUN --out DIR`, a local path or an fsspec URL). This flow merges any
mix of records and run directories (mem1_core.experiment.merge: a pair that should not be
paired is refused in one line), writes the headline one run of the whole experiment writes
(headline.{json,md}, curves.png, scaling.png) under `out`, and shows it in the UI with every
part's provenance: its run, commit, CPU and wall time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import image_section, publish_markdown

REPORT_KEY = "mem1-experiment-report"


def _report_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    return f"report · {Path(str(p.get('out') or 'report')).name}"


@flow(name="mem1", flow_run_name=_report_run_name, log_prints=True)
def experiment_report(sources: list[str], out: str) -> dict[str, Any]:
    """Merge `sources` (exported records or run directories, paths or URLs) into one headline
    under `out`."""
    from mem1_core.experiment.merge import merge_records
    from mem1_core.experiment.records import read_records
    from mem1_core.experiment.report import parts_markdown, write_report

    rec = merge_records([read_records(s) for s in sources])
    made = write_report(rec, Path(out), f"{len(rec.parts)} parts merged")
    h = made["headline"]
    publish_markdown(
        REPORT_KEY,
        f"{parts_markdown(h)}\n{made['markdown']}\n\n{image_section(made['plots'])}",
        f"Experiment {h['experiment']}: {len(rec.parts)} parts merged"
        + ("" if h["complete"] else " (not finished)"),
    )
    print(f"{len(rec.parts)} parts, {len(rec.tasks)} task rows -> {Path(out) / 'headline.md'}")
    return {"out": out, "parts": [p["label"] for p in h["parts"]], "complete": h["complete"]}
