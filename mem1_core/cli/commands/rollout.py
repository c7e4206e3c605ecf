"""`mem1 rollout`: run a policy (saved, or the untrained tiny model) on N-objective tasks and
write its trajectories to Parquet."""

from __future__ import annotations

import argparse
import dataclasses
import json

from mem1_core.cli.commands.data import add_config_args, config_from_args
from mem1_core.config import MEMORIES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="roll a policy out on tasks; trajectories to Parquet")
    p.add_argument(
        "--run", required=True, help="run directory (world/tasks/index built if missing)"
    )
    p.add_argument(
        "--policy-dir",
        default=None,
        help="a saved policy; default: the untrained model of the profile",
    )
    p.add_argument(
        "--memory",
        default=None,
        choices=list(MEMORIES),
        help="memory policy (default: rollout.memory)",
    )
    p.add_argument("-n", "--objectives", type=int, default=2)
    p.add_argument("--split", default="test", choices=["train", "test"])
    p.add_argument("--tasks", type=int, default=8, help="how many tasks")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (default: sample)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output trajectories .parquet")
    add_config_args(p)
    p.set_defaults(func=cmd_rollout)


def cmd_rollout(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.summary import summarize
    from mem1_core.models.model import load_model
    from mem1_core.models.policy import adopt_init_tokenizer, initial_policy
    from mem1_core.rollout.generation import HFBackend
    from mem1_core.rollout.loop import rollout
    from mem1_core.runs.layout import RunPaths
    from mem1_core.trajectory.record import write_trajectories

    cfg = config_from_args(args)
    if args.split == "test":  # compose as many test tasks as asked for
        cfg = dataclasses.replace(
            cfg,
            data=dataclasses.replace(
                cfg.data, max_eval_tasks=args.tasks, eval_objectives_per_n=None
            ),
        )
    if args.policy_dir:  # a policy reads with its own tokenizer, on any world
        adopt_init_tokenizer(cfg, RunPaths(Path(args.run).resolve()), Path(args.policy_dir))
    paths = prepare(cfg, args.run)
    tok = ensure_tokenizer(cfg, paths)
    model = (
        load_model(args.policy_dir, cfg.model, tok) if args.policy_dir else initial_policy(cfg, tok)
    )
    tasks = load_tasks(cfg, paths, args.split, args.objectives)[: args.tasks]
    if len(tasks) < args.tasks:
        raise ValueError(
            f"--tasks {args.tasks}: the {args.split} split has only {len(tasks)} tasks at "
            f"N={args.objectives} in {paths.task_file(args.split, args.objectives)}"
            + ("" if args.split == "test" else " (data.max_train_tasks caps it)")
        )
    backend = HFBackend(
        model, tok.pad_token_id, tok.eos_token_id, cfg.rollout.batch_size, tokenizer=tok
    )
    import time

    t0 = time.perf_counter()
    trajs = rollout(
        tasks,
        backend,
        make_env(cfg, paths, tok),
        cfg.rollout,
        memory=args.memory,
        greedy=args.greedy,
        generator=torch.Generator().manual_seed(args.seed),
        progress=True,
    )
    write_trajectories(trajs, args.out)
    print(json.dumps({"out": args.out, **summarize(trajs, time.perf_counter() - t0)}))
    return 0
