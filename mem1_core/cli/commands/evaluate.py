"""`mem1 evaluate`: objective-scaling evaluation of saved policies (and the teacher)."""

from __future__ import annotations

import argparse
import json

from mem1_core.cli.commands.data import add_config_args, config_from_args
from mem1_core.config import MEMORIES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="evaluate policies on N-objective test tasks")
    p.add_argument("--run", required=True, help="run directory holding world/tasks/index")
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME=POLICY_DIR[:MEMORY]",
        help="a saved policy (save_pretrained dir) and its memory policy "
        f"({'|'.join(MEMORIES)}; default mem1); repeatable",
    )
    p.add_argument("--teacher", action="store_true", help="add the scripted teacher as a row")
    p.add_argument("--objectives", default=None, help="comma-separated N values")
    p.add_argument("--out", required=True, help="output directory for tables and plots")
    add_config_args(p)
    p.set_defaults(func=cmd_evaluate)


def parse_agent(spec: str) -> tuple[str, str, str]:
    if "=" not in spec:
        raise ValueError(f"--agent {spec!r}: write NAME=POLICY_DIR[:MEMORY]")
    name, rest = spec.split("=", 1)
    path, _, memory = rest.partition(":")
    memory = memory or "mem1"
    if memory not in MEMORIES:
        raise ValueError(f"--agent {spec!r}: memory {memory!r} is not one of {', '.join(MEMORIES)}")
    return name, path, memory


def cmd_evaluate(args: argparse.Namespace) -> int:
    from mem1_core.evaluation.stage import run_objective_scaling

    cfg = config_from_args(args)
    agents = [parse_agent(a) for a in args.agent]
    if not agents and not args.teacher:
        raise ValueError("nothing to evaluate: give --agent NAME=DIR and/or --teacher")
    ns = tuple(int(x) for x in args.objectives.split(",")) if args.objectives else None
    result = run_objective_scaling(
        cfg, args.run, args.out, agents, teacher=args.teacher, objectives=ns
    )
    print(json.dumps(result["headline"], indent=1))
    return 0
