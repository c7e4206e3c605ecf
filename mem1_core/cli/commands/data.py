"""`mem1 world`, `mem1 compose`, `mem1 export-corpus`: the data stages."""

from __future__ import annotations

import argparse
import json
import sys
import time


def add_config_args(p: argparse.ArgumentParser) -> None:
    """--profile / --config / --set, shared by every stage that reads a Config."""
    p.add_argument(
        "--profile", default="tiny", help="tiny (CPU default), smoke, smol (SmolLM2) or paper"
    )
    p.add_argument("--config", default=None, help="YAML file of overrides by section")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one config field (repeatable)",
    )


def config_from_args(args: argparse.Namespace):
    from mem1_core.config import load_config

    return load_config(args.profile, args.config, args.overrides)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("world", help="generate the embedded task world (corpus + questions)")
    p.add_argument("--seed", type=int, default=None, help="world seed (default: the profile's)")
    p.add_argument("--out", required=True, help="output directory")
    add_config_args(p)
    p.set_defaults(func=cmd_world)

    p = sub.add_parser("compose", help="compose questions into N-objective tasks (Parquet)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--world", help="a world directory written by `mem1 world`")
    src.add_argument("--input", help="a local .json/.jsonl/.parquet file, or a hub dataset name")
    p.add_argument("--format", choices=["hotpotqa", "nq"], help="row format of --input")
    p.add_argument("--hub-config", default=None, help="hub config (hotpotqa: distractor|fullwiki)")
    p.add_argument("--hub-split", default="validation", help="hub split to load")
    p.add_argument("--objectives", "-n", type=int, required=True)
    p.add_argument("--mode", choices=["per_source", "mixed"], default="per_source")
    p.add_argument("--split", default=None, help="keep only this split (world: train|test)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true", help="per_source: shuffle within a source")
    p.add_argument("--max-tasks", type=int, default=None)
    p.add_argument("--out", required=True, help="output .parquet file")
    p.set_defaults(func=cmd_compose)

    p = sub.add_parser("export-corpus", help="HotpotQA context paragraphs -> corpus Parquet")
    p.add_argument(
        "--input",
        required=True,
        action="append",
        help="HotpotQA file, snapshot directory or hub dataset name (repeatable: e.g. the "
        "train and dev files, one corpus)",
    )
    p.add_argument("--hub-config", default="distractor")
    p.add_argument("--hub-split", default="validation")
    p.add_argument("--out", required=True, help="output corpus .parquet")
    p.set_defaults(func=cmd_export_corpus)


def cmd_world(args: argparse.Namespace) -> int:
    import dataclasses

    from mem1_core.data.world import generate_world, write_world

    cfg = config_from_args(args)
    wcfg = cfg.world if args.seed is None else dataclasses.replace(cfg.world, seed=args.seed)
    t0 = time.perf_counter()
    world = generate_world(wcfg)
    corpus, questions = write_world(world, args.out)
    print(
        json.dumps(
            {
                "corpus": str(corpus),
                "questions": str(questions),
                "documents": world.corpus.num_rows,
                "questions_n": world.questions.num_rows,
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
    )
    return 0


def cmd_compose(args: argparse.Namespace) -> int:
    from mem1_core.data.compose import compose, write_tasks
    from mem1_core.data.qa_data import load_questions

    if args.world:
        loaded = load_questions("world", args.world)
    else:
        if not args.format:
            raise ValueError("--input needs --format hotpotqa|nq")
        kw = {"split": args.hub_split}
        if args.format == "hotpotqa" and args.hub_config:
            kw["config"] = args.hub_config
        loaded = load_questions(args.format, args.input, **kw)
    table, summary = compose(
        loaded.table,
        args.objectives,
        args.mode,
        args.seed,
        args.split,
        args.shuffle,
        args.max_tasks,
    )
    write_tasks(table, args.out)
    report = {
        "out": args.out,
        **summary.to_dict(),
        "rows_read": loaded.total_rows,
        "skipped": loaded.skipped,
    }
    print(json.dumps(report))
    if any(loaded.skipped.values()):
        print(f"note: skipped rows: {loaded.skipped}", file=sys.stderr)
    return 0


def cmd_export_corpus(args: argparse.Namespace) -> int:
    from mem1_core.data.qa_data import hotpotqa_corpus
    from mem1_core.runs import atomic

    table = hotpotqa_corpus(args.input, args.hub_config, args.hub_split)
    atomic.write_parquet(table, args.out)
    print(json.dumps({"out": args.out, "documents": table.num_rows}))
    return 0
