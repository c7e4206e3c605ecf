"""Flow `mem1`: the whole pipeline as one parent flow; flow `mem1-nightly-eval`.

`mem1` runs the stages of `PIPELINE` in order — compose tasks → build the index → warm
start → train (PPO and the baselines) → objective-scaling evaluation → ablation summary —
each a subflow from its own module, all writing under one run directory
`runs_root/<run_name>`; each stage's adapter (one line) is in `STAGES`. The summary
artifact, `summary.json` / `summary.md` in the run directory and the returned headline are
built only from the stages that actually ran, so a failed pipeline never reads as a finished
one.

`mem1-nightly-eval` finds the newest checkpoint under a runs root
(mem1_core.runs.layout.newest_checkpoint_under) and evaluates it under the memory policy its
run trained with (recorded in the checkpoint's config.json).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from flows.common import (
    build_config,
    image_section,
    publish_markdown,
    publish_samples,
    publish_table,
    report_progress,
    resolved,
)
from mem1_core.config import config_json
from mem1_core.evaluation.run_summary import render_headline, render_summary, run_headline
from mem1_core.models.compute import machine_record
from mem1_core.runs.atomic import write_json, write_text
from mem1_core.runs.layout import CHECKPOINTS, newest_checkpoint_under
from mem1_core.training.actor_pool import reuse_actors

Scalar = int | float | str | bool | None

# Artifact keys (the Prefect UI groups an artifact's versions by key across runs).
RUN_DIR_KEY = "mem1-run-dir"
SUMMARY_KEY = "mem1-summary"
HEADLINE_KEY = "mem1-headline"
NIGHTLY_KEY = "mem1-nightly-eval"


@dataclass(frozen=True)
class StageResult:
    """What one stage hands to the rest of the pipeline and to the summary."""

    outputs: dict[str, Any]
    """The stage subflow's return value (paths under the run directory), JSON-able."""
    headline: dict[str, Scalar]
    """The few numbers of this stage that belong in the run's headline table."""


@dataclass(frozen=True)
class RunContext:
    """The parameters every stage sees, and the results of the stages before it."""

    profile: str
    config_path: str | None
    overrides: list[str]
    run_dir: Path
    results: Mapping[str, StageResult] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    """The config the parent built once, resolved (flows.common.resolved): every stage gets
    it and builds nothing from the profile again."""


Stage = Callable[[RunContext], StageResult]


# ---- stage adapters: call the stage's subflow, pick its headline numbers --------------------
# Each imports its subflow when it runs: `prefect deploy` and the worker load this module
# to find the flows, and the stages' imports (datasets, torch, …) cost seconds each.


def _compose(ctx: RunContext) -> StageResult:
    from flows.data import compose_tasks

    out = compose_tasks(
        profile=ctx.profile,
        config_path=ctx.config_path,
        overrides=ctx.overrides,
        out_dir=str(ctx.run_dir),
        config=ctx.config,
    )
    # Counted from the files written, not from anything the flow claims.
    counts = {f"{key} tasks": pq.read_metadata(path).num_rows for key, path in out["tasks"].items()}
    return StageResult(outputs=out, headline=counts)


def _index(ctx: RunContext) -> StageResult:
    from flows.index import build_index_flow

    out = build_index_flow(
        profile=ctx.profile,
        config_path=ctx.config_path,
        overrides=ctx.overrides,
        out_dir=str(ctx.run_dir),
        config=ctx.config,
    )
    keys = ("kind", "documents", "build_seconds", "size_mb", "cached")
    return StageResult(outputs=out, headline={k: out[k] for k in keys if k in out})


def _stage_args(ctx: RunContext) -> dict[str, Any]:
    return {
        "profile": ctx.profile,
        "config_path": ctx.config_path,
        "overrides": ctx.overrides,
        "run_dir": str(ctx.run_dir),
        "config": ctx.config,
    }


def _warm_start(ctx: RunContext) -> StageResult:
    from flows.stages import warm_start

    out = warm_start(**_stage_args(ctx))
    if "skipped" in out:
        return StageResult(outputs=out, headline={"warm start": "skipped (no teacher)"})
    keys = ("steps", "seconds", "final_loss", "eval_reward_before", "eval_reward_after")
    return StageResult(outputs=out, headline={f"warm start {k}": out[k] for k in keys})


def _rollout_backend(metrics: dict[str, Any]) -> str | None:
    """`vllm 0.32.0` or `hf`: what a PPO stage's rollout workers generated with."""
    parts = [str(metrics[k]) for k in ("rollout_backend", "vllm_version") if metrics.get(k)]
    return " ".join(parts) or None


def _train_ppo(ctx: RunContext) -> StageResult:
    from flows.stages import train_ppo

    out = train_ppo(**_stage_args(ctx), memory="mem1")
    m = out["metrics"]
    return StageResult(
        outputs=out,
        headline={
            "ppo mem1 rollout backend": _rollout_backend(m),
            "ppo mem1 iterations": out["iterations"],
            "ppo mem1 last train reward": m.get("reward"),
            "ppo mem1 held-out reward": m.get("eval/reward"),
        },
    )


def _train_baselines(ctx: RunContext) -> StageResult:
    from flows.stages import train_ppo, train_sft_arm

    full = train_ppo(**_stage_args(ctx), memory="full")
    sft = train_sft_arm(**_stage_args(ctx))
    return StageResult(
        outputs={"ppo_full": full, "sft_mem1": sft},
        headline={
            "ppo full rollout backend": _rollout_backend(full["metrics"]),
            "ppo full held-out reward": full["metrics"].get("eval/reward"),
            "sft mem1 held-out reward": sft.get("eval_reward_after"),
        },
    )


def _evaluate(ctx: RunContext) -> StageResult:
    from flows.stages import evaluate_objective_scaling
    from mem1_core.domains.base import Units
    from mem1_core.evaluation.report import figures

    out = evaluate_objective_scaling(**_stage_args(ctx))
    # the stage's numbers, read off its headline (eval/headline.json), not recomputed, named
    # in its domain's units (QA: EM fraction and sum; WebShop: reward ×100 and success rate)
    shown = figures(Units.from_dict(out.get("units")))
    head: dict[str, Scalar] = {}
    for c in out["headline"]:
        for f in shown:
            head[f"{c['agent']} N={c['N']} {f.name}"] = c.get(f.key)
        head[f"{c['agent']} N={c['N']} peak tokens"] = c["peak_tokens"]
    head.update({f"{c['label']} at N={c['N']}": c["value"] for c in out["comparisons"]})
    return StageResult(outputs=out, headline=head)


def _ablation(ctx: RunContext) -> StageResult:
    from flows.stages import ablation_summary

    out = ablation_summary(run_dir=str(ctx.run_dir))
    return StageResult(outputs=out, headline={})


PIPELINE: tuple[str, ...] = (
    "compose-tasks",
    "build-index",
    "warm-start",
    "train-ppo",
    "train-baselines",
    "evaluate-objective-scaling",
    "ablation-summary",
)
"""Every stage of the pipeline, in the order it runs."""

LAST_RAY_STAGE = "train-baselines"
"""The last stage that trains on Ray actors (mem1_core.training.actor_pool keeps them until then)."""

STAGES: dict[str, Stage] = {
    "compose-tasks": _compose,
    "build-index": _index,
    "warm-start": _warm_start,
    "train-ppo": _train_ppo,
    "train-baselines": _train_baselines,
    "evaluate-objective-scaling": _evaluate,
    "ablation-summary": _ablation,
}
"""Every stage's adapter: name -> adapter (the keys are PIPELINE's)."""


# ---- run directory and summary ------------------------------------------------------------


def resolve_runs_root(runs_root: str | None) -> Path:
    """The runs root made absolute; `runs` under the working directory by default (a
    deployment's pull step sets that to the repository)."""
    return Path(runs_root or "runs").expanduser().resolve()


def default_run_name(now: datetime | None = None) -> str:
    return (now or datetime.now()).strftime("%Y%m%d-%H%M%S")


def headline_rows(results: Mapping[str, StageResult]) -> list[dict[str, Scalar]]:
    """One row per headline number of the stages that ran: stage, metric, value."""
    return [
        {"stage": name, "metric": metric, "value": value}
        for name, result in results.items()
        for metric, value in result.headline.items()
    ]


def _label_flow_run(run_name: str, profile: str) -> None:
    """Name the flow run after its run directory, so the UI's run list shows it."""
    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    tags = sorted({*ctx.flow_run.tags, "mem1", f"profile:{profile}"})
    with get_client(sync_client=True) as client:
        client.update_flow_run(ctx.flow_run.id, name=run_name, tags=tags)


# ---- flows ---------------------------------------------------------------------------------


@flow(name="mem1", log_prints=True)
def mem1(
    profile: str = "tiny",
    config_path: str | None = None,
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    run_name: str | None = None,
) -> dict[str, Any]:
    """The whole pipeline under one run directory; returns the headline of the stages run."""
    cfg = build_config(profile, config_path, overrides)  # once: the stages get it resolved
    config = resolved(cfg)
    run_name = run_name or default_run_name()
    run_dir = resolve_runs_root(runs_root) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        {
            "profile": profile,
            "config_path": config_path,
            "overrides": list(overrides or []),
            "run_name": run_name,
            "config": config_json(cfg),
            # what it ran on: a run's timings and its compute dtype depend on the CPU
            "machine": machine_record(cfg.model.autocast),
        },
        run_dir / "run.json",
    )
    _label_flow_run(run_name, profile)
    report_progress(run_dir)
    print(f"run directory: {run_dir}")
    publish_markdown(
        RUN_DIR_KEY,
        f"# mem1 run `{run_name}`\n\nEverything this run writes (tasks, indexes, "
        f"checkpoints, Parquet, plots) is under\n\n`{run_dir}`\n",
        f"Run directory of mem1 run {run_name}",
    )

    results: dict[str, StageResult] = {}
    seconds: dict[str, float] = {}
    failed: str | None = None
    error: str | None = None
    try:
        with ExitStack() as actors:
            # The training stages share their Ray actors (start-up is ~30 s of imports per
            # run on a laptop); they are stopped once the last of them is done.
            actors.enter_context(reuse_actors())
            for name in PIPELINE:
                stage = STAGES[name]
                ctx = RunContext(
                    profile, config_path, list(overrides or []), run_dir, dict(results), config
                )
                t0 = time.perf_counter()
                try:
                    results[name] = stage(ctx)
                except BaseException:
                    failed, error = name, traceback.format_exc(limit=5)
                    raise
                finally:
                    seconds[name] = round(time.perf_counter() - t0, 2)
                if name == LAST_RAY_STAGE:
                    actors.close()
    finally:
        summary = {
            "run_name": run_name,
            "run_dir": str(run_dir),
            "profile": profile,
            "status": "failed" if failed else "completed",
            "pipeline": list(PIPELINE),
            "stages_run": list(results),
            "failed_stage": failed,
            "error": error,
            "seconds": seconds,
            "headline": {name: r.headline for name, r in results.items()},
            "headline_rows": headline_rows(results),
            "outputs": {name: r.outputs for name, r in results.items()},
            **run_headline(run_dir, {name: r.outputs for name, r in results.items()}),
        }
        markdown = render_summary(summary)
        write_json(summary, run_dir / "summary.json")
        write_text(markdown, run_dir / "summary.md")
        publish_markdown(SUMMARY_KEY, markdown, f"Summary of mem1 run {run_name}")
        if summary.get("agents"):
            publish_markdown(
                HEADLINE_KEY,
                render_headline(summary, images=False),
                f"Headline of run {run_name}: agents x N, the paper's comparisons",
            )
    return {
        k: summary[k]
        for k in (
            "run_name",
            "run_dir",
            "profile",
            "status",
            "stages_run",
            "seconds",
            "headline",
        )
    }


def nightly_run_name(night: date, runs_root: Path, checkpoint: Path | None) -> str:
    """`nightly · 2026-12-03 · RUN/ppo_mem1/iter_000007`: the night and the checkpoint it
    evaluates (its path under the runs root, without `checkpoints/`), so the UI's run list says
    what each night looked at instead of a random pair of words."""
    if checkpoint is None:
        return f"nightly · {night:%Y-%m-%d} · no checkpoint"
    try:
        parts = checkpoint.relative_to(runs_root).parts
    except ValueError:  # not under the root (never expected): run, stage and checkpoint
        parts = checkpoint.parts[-3:]
    return f"nightly · {night:%Y-%m-%d} · {'/'.join(p for p in parts if p != CHECKPOINTS)}"


def _nightly_flow_run_name() -> str:
    from prefect.runtime import flow_run

    root = resolve_runs_root((flow_run.parameters or {}).get("runs_root"))
    return nightly_run_name(date.today(), root, newest_checkpoint_under(root))


@flow(name="mem1-nightly-eval", flow_run_name=_nightly_flow_run_name, log_prints=True)
def nightly_eval(runs_root: str | None = None, profile: str = "tiny") -> dict[str, Any]:
    """Evaluate the newest checkpoint under `runs_root` across N and publish its tables."""
    cfg = build_config(profile, None, None)  # a bad profile fails here, before any search
    root = resolve_runs_root(runs_root)
    checkpoint = newest_checkpoint_under(root)
    if checkpoint is None:
        text = f"No checkpoint under `{root}` (looked in `*/{CHECKPOINTS}/`): nothing to evaluate."
        print(text)
        publish_markdown(
            NIGHTLY_KEY, f"# mem1 nightly evaluation\n\n{text}\n", "Nightly evaluation"
        )
        return {"runs_root": str(root), "checkpoint": None, "evaluated": False}
    from mem1_core.evaluation.stage import run_objective_scaling
    from mem1_core.training.checkpoint import checkpoint_memory

    run_dir = checkpoint.parents[1]  # the training run that wrote it holds its tasks and index
    out = run_dir / "nightly" / default_run_name()
    policy = checkpoint / "policy" if (checkpoint / "policy").is_dir() else checkpoint
    memory = checkpoint_memory(checkpoint) or cfg.rollout.memory  # the run's own, when recorded
    result = run_objective_scaling(
        cfg, run_dir, out, [(checkpoint.name, str(policy), memory)], teacher=False, progress=False
    )
    # the trend across nights, kept beside the runs it watches
    from mem1_core.evaluation.compare import append_night, plot_trend, previous_night
    from mem1_core.evaluation.headline import cells_table, read_headline
    from mem1_core.evaluation.report import agent_rows, headline_markdown, markdown_table

    headline = read_headline(out)  # what the evaluation wrote: rendered, not recomputed
    publish_table(
        NIGHTLY_KEY + "-table", agent_rows(headline), f"Nightly evaluation of {checkpoint}"
    )
    night = out.name
    trend = append_night(
        root / "nightly" / "trend.csv", night, str(checkpoint), cells_table(headline)
    )
    versus = previous_night(trend, night)
    trend_png = plot_trend(trend, root / "nightly" / "trend.png")
    text = (
        f"Checkpoint `{checkpoint}` evaluated under `{memory}` into `{out}`.\n\n"
        f"{headline_markdown(headline)}\n"
        f"## Tonight against the previous night\n\n{markdown_table(versus)}\n"
        f"{image_section({'EM per night': trend_png})}"
    )
    print(markdown_table(versus))
    publish_markdown(NIGHTLY_KEY, f"# mem1 nightly evaluation\n\n{text}\n", "Nightly evaluation")
    publish_samples(result["samples"], key=NIGHTLY_KEY + "-trajectories")
    return {
        "runs_root": str(root),
        "checkpoint": str(checkpoint),
        "evaluated": True,
        "out": str(out),
        "headline": result["headline"],
        "trend": str(root / "nightly" / "trend.csv"),
        "versus_previous": versus,
    }
