"""Small helpers shared by the flows: config from JSON-able parameters, artifacts."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext

from mem1_core.config import Config, config_from_dict, config_json, load_config


def build_config(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    config: dict[str, Any] | None = None,
    memory: str | None = None,
) -> Config:
    """A stage's config: `config`, the resolved values the parent flow built once (so
    the profile, file and overrides are then its record, not rebuilt); else built from the
    profile, the file and the overrides, as a stage flow run on its own does. `memory` sets
    rollout.memory as the config is built (the PPO stage trains both memories)."""
    if config is not None:
        values = dict(config)
        if memory is not None:
            values["rollout"] = {**values["rollout"], "memory": memory}
        return config_from_dict(values)
    extra = [f"rollout.memory={memory}"] if memory is not None else []
    return load_config(profile, config_path, [*(overrides or []), *extra])


def resolved(cfg: Config) -> dict[str, Any]:
    """The JSON-able values of `cfg` that the parent flow hands its stages (`config=`)."""
    return json.loads(config_json(cfg))


def run_dir(root: str | None, name: str) -> Path:
    path = Path(root or "runs") / name
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def metric_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's numbers as (metric, value) table rows."""
    from mem1_core.evaluation.summary import numeric_metrics

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


def stage_run_name() -> str:
    """`<stage> · <run name>` for a stage's subflow run (the run name is its run directory's
    name), so the UI lists `warm-start · 20261201-074101`, not a random pair of words."""
    from prefect.runtime import flow_run

    params = flow_run.parameters or {}
    where = params.get("run_dir") or params.get("out_dir")
    name = str(flow_run.flow_name)
    if params.get("memory") not in (None, "mem1"):
        name += f" ({params['memory']})"
    return f"{name} · {Path(where).name}" if where else name


FORWARDED_LOGGERS = ("mem1.progress", "mem1_core.models.compute")
"""The library's loggers a flow run's log shows: progress (already throttled), and the compute
dtype each process chose for this machine (once per process, with its reason)."""


class _RunLogHandler(logging.Handler):
    """Forwards the library's FORWARDED_LOGGERS lines to the log of the flow run they happen
    in, so each stage's progress shows in its own run's logs."""

    def emit(self, record: logging.LogRecord) -> None:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError

        try:
            get_run_logger().log(record.levelno, record.getMessage())
        except MissingContextError:
            pass


def report_progress(run_dir: Path) -> None:
    """Stages report progress to `<run_dir>/progress.json` (the launcher's status line) and to
    their flow run's log (mem1_core.runs.progress)."""
    from mem1_core.runs.progress import ENV

    os.environ[ENV] = str(run_dir / "progress.json")
    for name in FORWARDED_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(isinstance(h, _RunLogHandler) for h in logger.handlers):
            logger.addHandler(_RunLogHandler())
            logger.propagate = False


def image_section(plots: dict[str, str | Path]) -> str:
    """Markdown with each existing PNG inline (the UI shows a `data:` image, not a path)."""
    from mem1_core.evaluation.report import image_markdown

    parts = []
    for name, path in plots.items():
        if path and Path(path).is_file():
            parts.append(f"### {name}\n\n{image_markdown(path, name)}\n\n`{path}`\n")
    return "\n".join(parts)


def publish_samples(samples: dict[str, str], key: str | None = None) -> None:
    """Each agent's sample trajectories (eval/samples/<agent>.md) as a markdown artifact, keyed
    `trajectories-<agent>` (or `key`, for an agent whose name changes between runs: the
    nightly's checkpoint), so the UI groups the same agent's samples across runs."""
    for agent, path in samples.items():
        publish_markdown(
            key or f"trajectories-{agent}",
            Path(path).read_text(),
            # no `<IS>` here: the UI drops a description's angle-bracket tags as HTML
            f"Sample trajectories of {agent}: state, query, info and tokens per turn",
        )
