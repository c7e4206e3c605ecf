"""The evaluation stage of a run: load saved policies, run the objective-scaling evaluation,
write the table, the plots and the headline (eval/headline.json)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path

from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
from mem1_core.domains.registry import domain_of
from mem1_core.evaluation.headline import build_headline, task_scores, write_headline
from mem1_core.evaluation.samples import write_samples
from mem1_core.evaluation.scaling import Agent, evaluate_scaling, scaling_plots
from mem1_core.evaluation.vllm_cells import choose_player
from mem1_core.models.model import load_model
from mem1_core.models.policy import adopt_init_tokenizer
from mem1_core.runs import atomic
from mem1_core.runs.layout import PPO_FULL, PPO_MEM1, SFT_MEM1, WARM_START, RunPaths, resolve_init

log = logging.getLogger(__name__)

TRAINED_AGENTS: tuple[tuple[str, str, str], ...] = (
    ("warm-start", WARM_START, "mem1"),
    ("mem1-ppo", PPO_MEM1, "mem1"),
    ("mem1-sft", SFT_MEM1, "mem1"),
    ("full-ppo", PPO_FULL, "full"),
    # the full-context agent's policy with its context cut to the last turns
    ("truncate-ppo", PPO_FULL, "truncate"),
)
"""(agent name, stage directory, memory policy) of the agents a pipeline run trains."""


def trained_agents(run_dir: str | Path) -> list[tuple[str, str, str]]:
    """(name, policy dir, memory policy) of every trained agent found in the run."""
    found = []
    for name, sub, memory in TRAINED_AGENTS:
        try:
            found.append((name, str(resolve_init(Path(run_dir) / sub)), memory))
        except FileNotFoundError:
            continue
    return found


def policy_source(path: str | Path) -> str:
    """A saved policy's identity for resuming an evaluation: its directory and each file's
    size and modification time (a policy saved again there is another policy); a hub name
    as it is."""
    p = Path(path)
    if not p.is_dir():
        return str(path)
    stamp = []
    for f in sorted(f for f in p.rglob("*") if f.is_file()):
        st = f.stat()
        stamp.append((f.relative_to(p).as_posix(), st.st_size, st.st_mtime_ns))
    return f"{p.resolve()} {hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]}"


def policy_dir(path: str | Path) -> str | None:
    """The directory a policy loads from (a shipped model's de-quantized cache), or None for
    a hub name: what a vLLM engine can start from."""
    from mem1_core.models.gguf import resolve_pretrained

    local = Path(resolve_pretrained(path))
    return str(local.resolve()) if (local / "config.json").is_file() else None


def _play_settings(cfg, own) -> str:
    """The rollout settings an agent plays under beyond the evaluation's (part of its cells'
    identity: a cell played under other settings is played again)."""
    if own is None:
        return ""
    mine, theirs = own.rollout.to_dict(), cfg.rollout.to_dict()
    return " " + json.dumps({k: v for k, v in mine.items() if theirs.get(k) != v}, sort_keys=True)


def run_objective_scaling(
    cfg,
    run_dir: str | Path,
    out_dir: str | Path,
    agents: list[tuple[str, str, str]],
    *,
    teacher: bool = True,
    objectives: tuple[int, ...] | None = None,
    progress: bool = True,
    agent_configs: dict | None = None,
) -> dict:
    """agents: (name, policy_dir, memory policy); `agent_configs`: agent name -> the config it
    plays under where that differs from `cfg` in how it plays (its rollout settings: an arm
    trained with another prompt), played here, not by the vLLM player, under its own
    environment. Writes `out_dir`'s trajectories, metrics,
    plots, headline.json and samples/<agent>.md (mem1_core.evaluation.samples), in the units
    and words of the run's domain; returns the headline's cells (`headline`), comparisons and
    units, and the paths. `teacher` adds the scripted
    teacher's rows where it can play the tasks (the world's). A rerun into the same `out_dir` resumes: cells
    already played by the same policies under the same configuration are read back, not
    played again (evaluate_scaling's `key`)."""
    # Every agent reads with its own tokenizer: the run adopts theirs (all must agree).
    for _name, path, _memory in agents:
        adopt_init_tokenizer(cfg, RunPaths(Path(run_dir).resolve()), Path(path))
    paths: RunPaths = prepare(cfg, run_dir)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    ns = objectives or cfg.data.eval_objectives
    tasks_by_n = {n: load_tasks(cfg, paths, "test", n)[: cfg.data.eval_tasks(n)] for n in ns}
    player = choose_player(cfg, paths.root)
    own = agent_configs or {}
    built = [
        Agent(
            name, memory, None, source=policy_source(path) + _play_settings(cfg, own.get(name)),
            policy=None if name in own else policy_dir(path),
            load=functools.partial(load_model, path, cfg.model, tok),
            env=make_env(own[name], paths, tok) if name in own else None,
            rollout=own[name].rollout if name in own else None,
        )
        for name, path, memory in agents
    ]  # fmt: skip
    every = [t for ts in tasks_by_n.values() for t in ts]
    if teacher and env.scripted_teacher(every, cfg.teacher, lapses=False) is None:
        if not built:
            raise ValueError(
                "nothing to evaluate: the scripted teacher plays only the world's tasks (their "
                "plans), not these; give an agent (--agent NAME=DIR)"
            )
        log.info("no teacher rows: the scripted teacher plays only the world's tasks (plans)")
        teacher = False
    if teacher:
        # the teacher as a reference row under both memories: its peak tokens show what each
        # memory costs when the play is perfect
        # in the state format the run's teacher taught, without its lapses
        for name, memory in (("teacher", "mem1"), ("teacher-full", "full")):
            scripted = env.scripted_teacher(every, cfg.teacher, lapses=False)
            built.append(Agent(name, memory, None, scripted, source="scripted teacher"))
    out = Path(out_dir)
    # a rerun into the same directory resumes at the first cell not yet played under this
    # configuration (the teacher's settings, world and rollout budgets are all in it)
    # (the engine and where it runs are not in it: a cell reads back the same whichever
    # engine played it; both as a key made before they were had them, so its cells still count)
    settings = cfg.to_dict()
    settings["eval"].pop("backend")
    settings["resources"]["rollout_python"] = None
    key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    table = evaluate_scaling(
        built, tok, env, tasks_by_n, cfg.rollout, out,
        progress=progress, scorer=cfg.eval.scorer, key=key.hexdigest(), player=player,
        settings=json.loads(json.dumps(settings, default=str)),
    )  # fmt: skip
    domain = domain_of(cfg)
    plots = scaling_plots(table, out, domain.units)
    questions = {t.task_id: t.questions for t in every}
    agent_memory = {a.name: a.memory for a in built}
    samples = write_samples(out, agent_memory, ns, questions, domain.sample_outcome)
    headline = evaluation_headline(cfg, out, table)
    result = {
        "headline": headline["cells"],
        "comparisons": headline["comparisons"],
        "units": headline["units"],
        "headline_json": str(write_headline(headline, out)),
        "scorer": cfg.eval.scorer,
        "plots": {k: str(v) for k, v in plots.items()},
        "samples": {agent: str(path) for agent, path in samples.items()},
        "table": str(out / "metrics.csv"),
    }
    result |= domain.evaluation_extras(cfg, paths, out, [a.name for a in built], ns)
    atomic.write_json(result, out / "summary.json")
    return result


def evaluation_headline(cfg, out_dir: str | Path, table) -> dict:
    """An evaluation's headline from its table and the trajectories under `out_dir` (their
    per-task scores), in the units of the run's domain (QA: EM; WebShop: reward ×100 and
    success rate)."""
    domain = domain_of(cfg)
    scores = task_scores(Path(out_dir) / "trajectories", table)
    return build_headline(
        table, cfg.eval.scorer, task_em=scores, units=domain.units, domain=domain.name
    )
