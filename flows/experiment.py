"""Flow `mem1` of deployment `mem1/experiment`: the paper's experiment as one resumable deployment run.

An experiment (data/experiments/<name>.yaml; mem1_core.experiment.spec) trains a warm start
once, then each arm × training seed as a subflow run of its own (`ppo-mem1 · seed 1`), then
evaluates every agent × seed greedily on the run's own test split and on held-out worlds
(`evaluate · world 4242`), and publishes one headline across seeds and worlds: the claims
table, agents × N, the learning curves and EM / peak tokens against N.

Resuming: everything lives under `runs_root/run_name`. Started again with the same run name
(after a kill, a crash or the end of a session), the run skips every finished stage and
resumes the first that is not: a PPO arm at its newest checkpoint, an evaluation at its first
unplayed cell. Without a run name the run directory is named after the flow run, so Prefect's
own retry of a crashed or failed flow run (the UI's Retry: the same flow run, scheduled again
with the same parameters) resumes it too. Prefect's `retries=` never applies to a crash (the
process that would retry is the one that died); the run reruns only when it is retried or
started again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow

from flows.common import (
    image_section,
    publish_markdown,
    publish_samples,
    report_progress,
    resolved,
)

RUN_DIR_KEY = "mem1-experiment-run-dir"
CLAIMS_KEY = "mem1-experiment-claims"
HEADLINE_KEY = "mem1-experiment-headline"
PROGRESS_KEY = "mem1-experiment-progress"


def default_experiment_run_name(experiment: str, flow_run_id: str | None) -> str:
    """`smol-1a2b3c4d`: the experiment and the flow run's id, the same on every retry of it."""
    stem = Path(experiment).stem
    return f"{stem}-{flow_run_id[:8]}" if flow_run_id else stem


def _run_name_of_this_flow_run(params: dict[str, Any]) -> str:
    from prefect.runtime import flow_run

    return params.get("run_name") or default_experiment_run_name(
        params.get("experiment", "smol"), flow_run.id
    )


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    return f"experiment · {_run_name_of_this_flow_run(flow_run.parameters or {})}"


def _arm_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters or {}
    return f"{p['arm']} · seed {p['seed']}"  # ArmRun.label


def _eval_run_name() -> str:
    from prefect.runtime import flow_run

    return f"evaluate · world {(flow_run.parameters or {}).get('world')}"


# ---- subflows -----------------------------------------------------------------------------


@flow(name="train-arm", flow_run_name=_arm_run_name, log_prints=True)
def train_arm(
    experiment: str, overrides: list[str] | None, run_dir: str, arm: str, seed: int
) -> dict[str, Any]:
    """One arm under one training seed, from its warm start; skipped when finished, resumed at
    its newest checkpoint when started."""
    from mem1_core.experiment.configs import arm_config
    from mem1_core.experiment.parse import load_experiment
    from mem1_core.experiment.plan import arm_run, finished, warm_start_dir
    from mem1_core.runs.host_memory import release_freed_memory
    from mem1_core.runs.layout import RunPaths, resolve_init

    spec = load_experiment(experiment, overrides)
    cfg = arm_config(spec, arm, seed)
    root = Path(run_dir)
    run = arm_run(spec, root, arm, seed)
    if finished(run, cfg):
        print(f"{run.label}: finished before, reused ({run.dir})")
        if not run.rl:
            return json.loads((run.dir / "result.json").read_text())
        rows = RunPaths(run.dir).read_metrics()
        return {"out": str(run.dir), "iterations": rows[-1]["iteration"] + 1, "metrics": rows[-1]}
    init = resolve_init(warm_start_dir(root, spec.arms[arm].warm_start))
    if run.rl:
        from mem1_core.training.train_rl import train_rl

        started = run.dir.exists() and any(run.dir.iterdir())
        print(f"{run.label}: {'resuming' if started else 'training'} in {run.dir}")
        result = train_rl(cfg, run.dir, resume=started, init=init, use_ray=spec.ray, show=False)
    else:
        from mem1_core.training.sft import train_sft

        result = train_sft(
            cfg, run.dir, objectives=cfg.data.train_objectives, init=init,
            assets_dir=root, resume=True, progress=False,
        )  # fmt: skip
    release_freed_memory(run.label)  # the next arm trains in this process
    return result


@flow(name="evaluate-world", flow_run_name=_eval_run_name, log_prints=True)
def evaluate_world(
    experiment: str, overrides: list[str] | None, run_dir: str, world: int
) -> dict[str, Any]:
    """Every agent × seed on world `world`, greedy, at the experiment's N; resumed at the first
    cell not yet played."""
    from mem1_core.evaluation.stage import run_objective_scaling
    from mem1_core.experiment.configs import agent_play_overrides, eval_config
    from mem1_core.experiment.parse import load_experiment
    from mem1_core.experiment.plan import eval_agents, split_agent, world_dirs
    from mem1_core.runs.host_memory import release_freed_memory

    spec = load_experiment(experiment, overrides)
    assets, out = world_dirs(Path(run_dir), world)
    agents = eval_agents(spec, Path(run_dir))
    print(f"world {world}: {[a[0] for a in agents]} at N={list(spec.objectives)}")
    own = {}  # agents that play under their arm's own rollout settings (a prompt lever)
    for name, _, _ in agents:
        agent = split_agent(name, spec.agents)[0]
        if agent_play_overrides(spec, agent):
            own[name] = eval_config(spec, world, agent)
    result = run_objective_scaling(
        eval_config(spec, world), assets, out, agents,
        teacher=spec.teacher, objectives=spec.objectives, progress=False, agent_configs=own,
    )  # fmt: skip
    release_freed_memory(f"evaluation of world {world}")
    return {"out": str(out), "samples": result["samples"]}


# ---- the experiment ------------------------------------------------------------------------


class Standing:
    """The experiment's standing in the UI while it runs (hours): a progress artifact (the
    share of each stage done, averaged over the stages; its description says which) and,
    after every stage, the headline so far (`mem1-experiment-headline`, marked not finished
    until the last stage: the curves of the arms trained so far, the cells played so far)."""

    def __init__(self, spec, cfg, run_dir: Path, name: str):
        self.spec, self.cfg, self.run_dir, self.name = spec, cfg, run_dir, name
        self.progress_id = None

    def update(self) -> dict[str, Any]:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        from flows.common import in_flow_run
        from mem1_core.experiment.plan import stage_status
        from mem1_core.experiment.report import write_experiment_headline

        stages = stage_status(self.spec, self.cfg, self.run_dir)
        percent = 100.0 * sum(min(1.0, s.done / s.total) for s in stages) / len(stages)
        about = f"Experiment run {self.name}: " + "; ".join(str(s) for s in stages)
        if in_flow_run():
            if self.progress_id is None:
                self.progress_id = create_progress_artifact(
                    percent, key=PROGRESS_KEY, description=about
                )
            else:
                update_progress_artifact(self.progress_id, percent, description=about)
        made = write_experiment_headline(self.run_dir)
        publish_markdown(
            HEADLINE_KEY,
            f"{made['markdown']}\n\n{image_section(made['plots'])}",
            f"Headline of experiment run {self.name}: claims, agents × N, curves"
            + ("" if made["headline"]["complete"] else " (so far)"),
        )
        return made


def timed(run_dir: Path, stage: str, fn, *args, done_before: bool = False):
    """Run `fn(*args)` (a subflow) and add its wall time to the stage's in walls.json,
    with the time of an attempt a kill stopped (mem1_core.experiment.walls)."""
    from mem1_core.experiment.walls import StageWalls

    with StageWalls(run_dir).stage(stage, count=not done_before):
        return fn(*args)


# The flow is named `mem1`, as the pipeline's is, so that its deployment is `mem1/experiment`
# beside `mem1/train-eval`; the run names (`experiment · smol-…`) tell the two apart.
@flow(name="mem1", flow_run_name=_flow_run_name, log_prints=True)
def experiment(
    experiment: str = "smol",
    overrides: list[str] | None = None,
    runs_root: str | None = None,
    run_name: str | None = None,
    reuse: str | None = None,
    seeds: list[int] | None = None,
    part: str | None = None,
) -> dict[str, Any]:
    """The experiment `experiment` (a name under data/experiments/, or a YAML path), with
    `overrides` (`section.field=value`) over its settings, under `runs_root/run_name`; `reuse`:
    a finished run whose warm start and arms are linked, not trained again. `seeds`, `part`:
    run only what those training seeds, or that part of the file's `parts:`, need
    (mem1_core.experiment.parts); its records merge with the other parts'."""
    from flows.pipeline import resolve_runs_root
    from flows.stages import warm_start
    from mem1_core.experiment.configs import arm_config, base_config, warm_start_config
    from mem1_core.experiment.parse import load_experiment
    from mem1_core.experiment.parts import select_overrides
    from mem1_core.experiment.plan import (
        arm_runs,
        check_run_dir,
        eval_worlds,
        finished,
        link_reused,
        warm_start_dir,
        warm_start_stage,
    )
    from mem1_core.experiment.spec import warm_start_subdir

    overrides = [*(overrides or []), *select_overrides(seeds, part)]  # every subflow's too
    spec = load_experiment(experiment, overrides)  # a bad file fails here, before any work
    cfg = base_config(spec)
    name = _run_name_of_this_flow_run({"experiment": experiment, "run_name": run_name})
    run_dir = resolve_runs_root(runs_root) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    check_run_dir(run_dir, spec, cfg)
    report_progress(run_dir)  # the launcher's status line, and each stage's log
    if reuse:
        print(
            f"linked from {reuse}: {link_reused(spec, cfg, Path(reuse), run_dir) or 'nothing new'}"
        )
    print(f"experiment {spec.name}: run directory {run_dir}")
    publish_markdown(
        RUN_DIR_KEY,
        f"# Experiment `{spec.name}`, run `{name}`\n\nEverything it writes is under\n\n"
        f"`{run_dir}`\n\nStarted again with `run_name={name}`, it resumes there.\n",
        f"Run directory of experiment run {name}",
    )
    standing = Standing(spec, cfg, run_dir, name)
    standing.update()
    for ws in spec.used_warm_starts():  # the plain one, then each named one an arm needs
        warm_done = (warm_start_dir(run_dir, ws) / "result.json").is_file()
        timed(run_dir, warm_start_stage(ws), warm_start, spec.profile, None,
              list(spec.overrides), str(run_dir), resolved(warm_start_config(spec, ws)),
              warm_start_subdir(ws), done_before=warm_done)  # fmt: skip
        if not warm_done:
            standing.update()
    for run in arm_runs(spec, run_dir):
        done = finished(run, arm_config(spec, run.arm, run.seed))
        timed(run_dir, run.label, train_arm, experiment, overrides, str(run_dir), run.arm,
              run.seed, done_before=done)  # fmt: skip
        if not done:
            standing.update()
    samples = {}
    for w in eval_worlds(spec, cfg):
        got = timed(run_dir, f"evaluation, world {w}", evaluate_world, experiment, overrides,
                    str(run_dir), w)  # fmt: skip
        samples = got["samples"]
        made = standing.update()  # after the last world: the whole headline
    from mem1_core.experiment.report import claims_heading, claims_markdown

    h = made["headline"]
    publish_markdown(
        CLAIMS_KEY,
        f"# The paper's claims: experiment `{spec.name}`\n\n{claims_heading(h)}.\n\n"
        f"{claims_markdown(h)}",
        f"Claims of experiment run {name}, per world, per seed and pooled",
    )
    publish_samples(samples)  # the last world's sample trajectories
    print(claims_markdown(made["headline"]))
    return {
        "run_name": name,
        "run_dir": str(run_dir),
        "headline": str(run_dir / "eval" / "headline.json"),
        "claims": [
            {"label": c["label"], **{w: g["verdict"] for w, g in c["worlds"].items()}}
            for c in made["headline"]["claims"]
        ],
    }
