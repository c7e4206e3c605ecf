"""The multi-turn rollout: a batch of tasks, a generation backend, an environment (any
domain: mem1_core.rollout.environment) and a memory policy -> trajectories.

Each turn, every live trajectory's context is rebuilt from id segments by the memory policy
(never from decoded text, docs/design.md §4.1), all live contexts are generated together, the
environment acts on every new turn in one call (the QA retriever answers every query of the
turn in one batched call), and each trajectory records its context references, generated ids
and log-probs, info ids and timing. The loop never asks which domain it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from mem1_core.config import RolloutConfig
from mem1_core.rollout.environment import Environment
from mem1_core.rollout.generation import GenerationBackend, SamplingParams
from mem1_core.rollout.memory import get_memory
from mem1_core.trajectory.record import Action, Trajectory, Turn


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str
    questions: list[str]
    golden_answers: list[list[str]]
    plans: list[str]

    @property
    def n_objectives(self) -> int:
        return len(self.questions)


def tasks_from_table(table: pa.Table) -> list[Task]:
    return [
        Task(r["task_id"], r["prompt"], r["questions"], r["golden_answers"], r.get("plans") or [])
        for r in table.to_pylist()
    ]


def rollout(
    tasks: list[Task],
    backend: GenerationBackend,
    env: Environment,
    cfg: RolloutConfig,
    *,
    memory: str | None = None,
    greedy: bool = False,
    samples_per_task: int = 1,
    generator: torch.Generator | None = None,
    progress: bool = False,
) -> list[Trajectory]:
    """Run every task to the end (an answer, or the turn budget) and return trajectories,
    `samples_per_task` per task (a GRPO group), in task order."""
    memory = memory or cfg.memory
    context_of = get_memory(memory)
    opts = {
        "state_start": env.codec.state_start,
        "state_span": env.codec.state_span,
        "truncate_turns": cfg.truncate_turns,
    }
    trajs: list[Trajectory] = []
    for g, task in enumerate(tasks):
        prompt_ids = env.encode_prompt(task.prompt)
        for s in range(samples_per_task):
            trajs.append(
                Trajectory(
                    task.task_id,
                    memory,
                    list(prompt_ids),
                    task.golden_answers,
                    group=g,
                    sample=s,
                    max_turns=cfg.max_turns(task.n_objectives),
                )
            )
    temperature = 0.0 if greedy else cfg.temperature
    bar = tqdm(
        total=len(trajs), desc=f"rollout[{memory}]", unit="traj", disable=not progress, leave=False
    )
    # a trajectory's contexts overlap from turn to turn (the prompt; under the full context,
    # everything before): a backend that can keeps each one's last sequence as keys and values
    # for the whole rollout (the weights stay as they are until it returns)
    turn_kv = backend.turn_cache() if getattr(backend, "reuses_prefixes", False) else None
    live = list(range(len(trajs)))
    while live:
        # One generate call per token budget (tasks of one N share it).
        by_budget: dict[int, list[int]] = {}
        for i in live:
            by_budget.setdefault(cfg.max_new_tokens(trajs[i].n_objectives), []).append(i)
        new_turns: dict[int, Turn] = {}
        for budget, idx in by_budget.items():
            refs = [context_of(trajs[i], opts) for i in idx]
            contexts = [
                [t for r in rs for t in trajs[i].segment_ids(r)]
                for i, rs in zip(idx, refs, strict=True)
            ]
            params = SamplingParams(
                budget, env.stop_ids, temperature, cfg.top_p, stop_strings=env.stop_strings
            )
            t0 = time.perf_counter()
            if getattr(backend, "reads_trajectories", False):  # the scripted teacher
                gens = backend.generate(
                    contexts, params, generator, trajectories=[trajs[i] for i in idx]
                )
            elif turn_kv is not None:
                gens = backend.generate(contexts, params, generator, idx, turn_kv)
            else:
                gens = backend.generate(contexts, params, generator)
            per = (time.perf_counter() - t0) / len(idx)
            for i, rs, ctx, gen in zip(idx, refs, contexts, gens, strict=True):
                new_turns[i] = Turn(
                    rs,
                    gen.ids,
                    gen.logprobs,
                    Action.INVALID,
                    finish=gen.finish,
                    context_tokens=len(ctx),
                    gen_seconds=per,
                )
        _env_step(env, trajs, live, new_turns)
        still = [i for i in live if not trajs[i].done]
        if turn_kv is not None:
            for i in set(live) - set(still):
                turn_kv.drop(i)
        bar.update(len(live) - len(still))
        live = still
    bar.close()
    return trajs


def _env_step(
    env: Environment, trajs: list[Trajectory], live: list[int], new_turns: dict[int, Turn]
) -> None:
    t0 = time.perf_counter()
    for i in live:
        trajs[i].turns.append(new_turns[i])
    env.step([trajs[i] for i in live])
    per = (time.perf_counter() - t0) / max(len(live), 1)
    for i in live:
        new_turns[i].env_seconds = per
        tr = trajs[i]
        tr.wall_seconds += new_turns[i].gen_seconds + per
