"""The training and evaluation stages of the `mem1` pipeline, each a subflow writing under
the run directory:

- `warm-start`: SFT on 1-objective teacher trajectories (the tag format), or the profile's
  pretrained base, `warm_start/`; on real QA data without a base there is neither (no
  teacher plays it) and PPO starts from the pretrained model.
- `train-ppo`: PPO with the `mem1` memory policy on N-objective tasks from the warm start,
  `ppo_mem1/`.
- `train-baselines`: the same PPO with the `full` memory policy (the Search-R1-style
  full-context agent), `ppo_full/`; and the SFT arm of the ablation: SFT on N-objective
  teacher trajectories under `mem1` from the same warm start, `sft_mem1/` (not on real QA
  data).
- `evaluate-objective-scaling`: every agent (and the teacher) on test tasks for each N,
  `eval/` (trajectories, metrics.{parquet,csv}, headline.json, plots).
- `ablation-summary`: RL vs SFT across N, and the training curves, `ablation/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import (
    build_config,
    image_section,
    metric_rows,
    publish_markdown,
    publish_samples,
    publish_table,
    stage_run_name,
)
from mem1_core.runs.host_memory import release_freed_memory
from mem1_core.runs.layout import EVAL, PPO_FULL, PPO_MEM1, SFT_MEM1, WARM_START

ROLLOUT_KEYS = ("rollout_backend", "vllm_version", "rollout_python")
"""What a PPO stage's rollout workers generated with (RolloutWorker.describe), in its table."""


def rollout_label(metrics: dict[str, Any]) -> str:
    """`vllm 0.32.0 (PYTHON)` or `hf (PYTHON)`: a PPO stage's rollout backend, for a line."""
    backend = " ".join(str(metrics[k]) for k in ROLLOUT_KEYS[:2] if metrics.get(k)) or "unknown"
    python = metrics.get("rollout_python")
    return f"{backend} ({python})" if python else backend


def _resume(out: Path) -> bool:
    return out.exists() and any(out.iterdir())


@flow(name="warm-start", flow_run_name=stage_run_name, log_prints=True)
def warm_start(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    run_dir: str,
    config: dict[str, Any] | None = None,
    out_name: str = WARM_START,
) -> dict[str, Any]:
    """`config`: the parent flow's resolved config (flows.common.build_config); `out_name`: the
    warm start's directory under the run (an experiment's named warm starts have their own)."""
    from mem1_core.training.sft import NO_TEACHER, has_warm_start, train_sft

    cfg = build_config(profile, config_path, overrides, config)
    if not has_warm_start(cfg):
        print(f"warm start skipped: {NO_TEACHER}")
        return {"skipped": NO_TEACHER}
    root = Path(run_dir)
    out = root / out_name
    result = train_sft(cfg, out, warm_start=True, assets_dir=root, resume=True, progress=False)
    release_freed_memory("warm start")  # the PPO stage's actors start beside this process
    publish_table(
        "warm-start",
        metric_rows(result),
        f"warm start in {out}",
    )
    return result


# The Prefect flow name stays `train-ppo-mem1` (deployments and flow-run names are public);
# the function is `train_ppo`: it trains the full-context agent too (memory="full").
@flow(name="train-ppo-mem1", flow_run_name=stage_run_name, log_prints=True)
def train_ppo(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    run_dir: str,
    memory: str = "mem1",
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """PPO under the memory policy `memory` from the warm start."""
    from mem1_core.training.sft import has_warm_start
    from mem1_core.training.train_rl import train_rl

    cfg = build_config(profile, config_path, overrides, config, memory=memory)
    root = Path(run_dir)
    # mem1+recall is an arm of its own, not the full-context agent's directory
    out = root / {"mem1": PPO_MEM1, "mem1+recall": "ppo_mem1+recall"}.get(memory, PPO_FULL)
    init = root / WARM_START if has_warm_start(cfg) else None  # None: the pretrained model
    result = train_rl(cfg, out, resume=_resume(out), init=init, show=False)
    m = result["metrics"]
    rollout = rollout_label(m)
    print(f"PPO ({memory}): rollouts with {rollout}")
    publish_table(
        f"ppo-{memory}",
        [{"metric": k, "value": m[k]} for k in ROLLOUT_KEYS if m.get(k)]
        + [{"metric": f"node of {a}", "value": n} for a, n in m.get("actor_nodes", {}).items()]
        + metric_rows(m),
        f"PPO ({memory}) in {out}; rollouts: {rollout}",
    )
    return result


@flow(name="train-sft-arm", flow_run_name=stage_run_name, log_prints=True)
def train_sft_arm(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    run_dir: str,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from mem1_core.runs.layout import resolve_init
    from mem1_core.training.sft import NO_TEACHER, has_teacher, train_sft

    cfg = build_config(profile, config_path, overrides, config, memory="mem1")
    if not has_teacher(cfg):
        print(f"SFT arm skipped: {NO_TEACHER}")
        return {"skipped": NO_TEACHER}
    root = Path(run_dir)
    result = train_sft(
        cfg,
        root / SFT_MEM1,
        objectives=cfg.data.train_objectives,
        init=resolve_init(root / WARM_START),
        assets_dir=root,
        resume=True,
        progress=False,
    )
    release_freed_memory("SFT arm")
    return result


@flow(name="evaluate-objective-scaling", flow_run_name=stage_run_name, log_prints=True)
def evaluate_objective_scaling(
    profile: str,
    config_path: str | None,
    overrides: list[str] | None,
    run_dir: str,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from mem1_core.evaluation.headline import read_headline
    from mem1_core.evaluation.report import agent_rows, headline_markdown
    from mem1_core.evaluation.stage import run_objective_scaling, trained_agents

    cfg = build_config(profile, config_path, overrides, config)
    root = Path(run_dir)
    result = run_objective_scaling(
        cfg, root, root / EVAL, trained_agents(root), teacher=True, progress=False
    )
    release_freed_memory("evaluation")
    headline = read_headline(root / EVAL)  # what the stage wrote: rendered, not recomputed
    publish_table("objective-scaling", agent_rows(headline), f"Agents × N, {root / EVAL}")
    publish_markdown(
        "objective-scaling-plots",
        f"# Objective scaling\n\nTable: `{result['table']}`\n\n"
        f"{headline_markdown(headline)}\n{image_section(result['plots'])}",
        "objective scaling: agents × N, the paper's comparisons at every N, plots",
    )
    publish_samples(result["samples"])
    return result


@flow(name="ablation-summary", flow_run_name=stage_run_name, log_prints=True)
def ablation_summary(run_dir: str) -> dict[str, Any]:
    """RL vs SFT from the same warm start, across N; and the training curves."""
    from mem1_core.evaluation.ablation import ablation_summary as summarize_ablation

    result = summarize_ablation(run_dir)
    if result["rows"]:
        publish_table("rl-vs-sft", result["rows"], "RL vs SFT across N (EM)")
    plots = {Path(p).stem.replace("_", " "): p for p in result["plots"]}
    publish_markdown("rl-vs-sft-plots", f"# RL vs SFT\n\n{image_section(plots)}", "ablation plots")
    return result
