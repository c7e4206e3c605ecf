"""`mem1 evaluate`: objective-scaling evaluation of saved policies (and the teacher);
`mem1 web-transfer`: the same, on the local index and through the web-search backend."""

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

    p = sub.add_parser(
        "web-transfer",
        help="evaluate policies zero-shot on the local index and through the web-search "
        "backend on a local stand-in of a Serper-style API",
    )
    p.add_argument("--run", required=True, help="run directory holding world/tasks/index")
    p.add_argument("--agent", action="append", default=[], metavar="NAME=POLICY_DIR[:MEMORY]",
                   help="a saved policy and its memory policy; repeatable")  # fmt: skip
    p.add_argument("--objectives", default="1,2,3,4,5,6,7,8", help="comma-separated N values")
    p.add_argument("--out", required=True, help="directory of the record (transfer.json/.md)")
    p.add_argument("--port", type=int, default=8765, help="the stand-in's port (fixed: cached)")
    p.add_argument("--snippet-chars", type=int, default=0, help="cut snippets (0: whole)")
    add_config_args(p)
    p.set_defaults(func=cmd_web_transfer)


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


def cmd_web_transfer(args: argparse.Namespace) -> int:
    import shlex
    import sys

    from mem1_core.websearch.transfer import run_web_transfer

    cfg = config_from_args(args)
    agents = [parse_agent(a) for a in args.agent]
    if not agents:
        raise ValueError("nothing to evaluate: give --agent NAME=DIR[:MEMORY]")
    record = run_web_transfer(
        cfg,
        args.run,
        args.out,
        agents,
        tuple(int(x) for x in args.objectives.split(",")),
        port=args.port,
        snippet_chars=args.snippet_chars or None,
        command=shlex.join(["mem1", *sys.argv[1:]]),
    )
    print(json.dumps(record["rows"], indent=1))
    return 0
