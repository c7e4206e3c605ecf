"""Small helpers shared by the flows: config from JSON-able parameters, artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext

from mem1_core.config import Config, load_config
from mem1_core.evaluation.summary import numeric_metrics


def build_config(profile: str, config_path: str | None, overrides: list[str] | None) -> Config:
    return load_config(profile, config_path, list(overrides or []))


def run_dir(root: str | None, name: str) -> Path:
    path = Path(root or "runs") / name
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def metric_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's numbers as (metric, value) table rows."""
    return [{"metric": k, "value": v} for k, v in sorted(numeric_metrics(record).items())]


def _key(key: str) -> str:
    # Artifact keys: lowercase letters, digits and dashes only.
    return "".join(c if c.isalnum() else "-" for c in key.lower()).strip("-")


def in_flow_run() -> bool:
    return FlowRunContext.get() is not None


# Outside a flow run (a unit test calling a flow's `.fn()`) there is no run to attach an
# artifact to: publishing is then a no-op, here, for every flow.
def publish_table(key: str, rows: list[dict[str, Any]], description: str) -> None:
    if in_flow_run():
        create_table_artifact(key=_key(key), table=rows, description=description)


def publish_markdown(key: str, markdown: str, description: str) -> None:
    if in_flow_run():
        create_markdown_artifact(key=_key(key), markdown=markdown, description=description)
