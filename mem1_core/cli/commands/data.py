"""`mem1 world`, `mem1 compose`, `mem1 export-corpus`: the data stages; `mem1 data paper`: the
`paper` profile's corpus index, tasks and config file from downloaded files; `mem1 data shop`:
the embedded shop of a seed; `mem1 data webshop`: WebShop's released product and instruction
files as a shop directory."""

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
    add_set_arg(p, "override one config field (repeatable)")


def add_set_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help=help,
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

    register_data(sub)


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


def register_data(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="prepare downloaded datasets for a profile")
    verbs = p.add_subparsers(dest="data_command", required=True, metavar="VERB")
    p = verbs.add_parser(
        "paper",
        help="wiki-18 + HotpotQA + NQ files -> the paper profile's index, tasks and config file",
        description="Index Search-R1's wiki-18 corpus, compose the HotpotQA + NQ tasks as a "
        "run of the profile does, and write OUT/paper-data.yaml naming them "
        "(docs/paper-profile.md, 'Getting the data'). Steps already done are skipped.",
    )
    p.add_argument("--wiki", required=True, help="Search-R1's wiki-18.jsonl (or a corpus Parquet)")
    p.add_argument("--hotpotqa-train", required=True, help="hotpot_train_v1.1.json")
    p.add_argument("--hotpotqa-test", required=True, help="hotpot_dev_distractor_v1.json")
    p.add_argument("--nq-train", required=True, help="FlashRAG's nq/train.jsonl")
    p.add_argument("--nq-test", required=True, help="FlashRAG's nq/test.jsonl")
    p.add_argument("--out", required=True, help="folder for the index, tasks and config file")
    p.add_argument("--kind", choices=["dense", "bm25"], default="dense", help="index kind")
    p.add_argument(
        "--encoder",
        default=None,
        help="dense: hub name or local directory of the encoder (default: retrieval.encoder, "
        "intfloat/e5-base-v2)",
    )
    p.add_argument("--device", default=None, help="dense: torch device of the encoder (cuda)")
    p.add_argument("--batch-size", type=int, default=None, help="dense: passages per forward")
    p.add_argument("--index-type", choices=["flat", "hnsw"], default=None, help="dense: FAISS")
    p.add_argument("--rebuild-index", action="store_true", help="build the index even if present")
    p.add_argument("--profile", default="paper", help="the profile the data is for")
    add_set_arg(p, "a config field for the tasks and the config file (data.max_train_tasks=1000)")
    p.set_defaults(func=cmd_data_paper)

    p = verbs.add_parser(
        "shop",
        help="generate the embedded shop (products + goals) for the webshop domain",
        description="Write the embedded shop of a seed: products over five categories and "
        "goals built as WebShop's synthetic goals (docs/data.md, 'The shop'). A held-out shop "
        "is another seed.",
    )
    p.add_argument("--seed", type=int, default=0, help="shop seed")
    p.add_argument("--products", type=int, default=5000, help="number of products")
    p.add_argument("--goals", type=int, default=1000, help="number of goals")
    p.add_argument("--out", required=True, help="output shop directory")
    p.set_defaults(func=cmd_data_shop)

    p = verbs.add_parser(
        "webshop",
        help="WebShop's items and instruction files -> a shop directory (products + goals)",
        description="Convert WebShop's released files into the shop format the webshop "
        "environment reads (products.jsonl, goals.jsonl, manifest.json; docs/data.md, 'The "
        "shop'). Goals are human goals where --human-instructions is given, else synthetic "
        "goals from --instructions, as WebShop builds them.",
    )
    p.add_argument("--items", required=True, help="items_shuffle.json (or items_shuffle_1000.json)")
    p.add_argument(
        "--instructions",
        default=None,
        help="items_ins_v2.json: the products' attributes and the synthetic instructions",
    )
    p.add_argument(
        "--human-instructions", default=None, help="items_human_ins.json: the human instructions"
    )
    p.add_argument(
        "--goals",
        choices=["human", "synthetic"],
        default=None,
        help="which goals (default: human with --human-instructions, else synthetic)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the price and bound draws")
    p.add_argument(
        "--max-products", type=int, default=None, help="keep the first N items (WebShop's subsets)"
    )
    p.add_argument(
        "--max-malformed",
        type=float,
        default=0.01,
        help="share of items, or of instructions, that may be skipped as malformed (a field "
        "missing or of the wrong type) before the conversion fails (default 0.01: 1%%)",
    )
    p.add_argument("--out", required=True, help="output shop directory")
    p.set_defaults(func=cmd_data_webshop)


def cmd_data_paper(args: argparse.Namespace) -> int:
    from mem1_core.config import load_config
    from mem1_core.qa.paper_data import PaperFiles, prepare_paper_data

    options = {}
    if args.kind == "dense":
        options["model"] = args.encoder or load_config(args.profile).retrieval.encoder
        for name in ("device", "batch_size", "index_type"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
    elif any(
        getattr(args, n) is not None for n in ("encoder", "device", "batch_size", "index_type")
    ):
        raise ValueError("--encoder, --device, --batch-size and --index-type are for --kind dense")
    files = PaperFiles(
        args.wiki, args.hotpotqa_train, args.hotpotqa_test, args.nq_train, args.nq_test
    )
    summary = prepare_paper_data(
        files,
        args.out,
        kind=args.kind,
        index_options=options,
        profile=args.profile,
        overrides=args.overrides,
        rebuild_index=args.rebuild_index,
    )
    print(json.dumps(summary))
    return 0


def cmd_data_shop(args: argparse.Namespace) -> int:
    from mem1_core.webshop.generate import generate_shop

    t0 = time.perf_counter()
    shop = generate_shop(args.seed, args.products, args.goals)
    shop.save(args.out)
    summary = {
        "out": args.out,
        "seed": args.seed,
        "products": len(shop.products),
        "goals": len(shop.goals),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    print(json.dumps(summary))
    return 0


def cmd_data_webshop(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from mem1_core.webshop.convert import Conversion, write_webshop

    conversion = Conversion(  # flags that contradict each other fail here, before any reading
        args.items,
        args.instructions,
        args.human_instructions,
        goals=args.goals,
        seed=args.seed,
        max_products=args.max_products,
        max_malformed=args.max_malformed,
    )
    t0 = time.perf_counter()
    # a bar on a terminal only (tqdm's disable=None): a log gets the summary line
    with tqdm(
        total=conversion.items.stat().st_size if conversion.items.is_file() else None,
        desc="convert items",
        unit="B",
        unit_scale=True,
        disable=None,
    ) as bar:

        def progress(report, bytes_read: int) -> None:
            bar.update(bytes_read - bar.n)
            read = report.items.read
            bar.set_postfix(
                items=read,
                kept=report.products,
                skipped=read - report.products,
                rate=f"{read / max(time.perf_counter() - t0, 1e-9):.0f} items/s",
                refresh=False,
            )

        report = write_webshop(args.out, conversion, progress)
    summary = {
        "out": args.out,
        "items": report.items.read,
        "products": report.products,
        "goals": report.goals,
        "goal_kind": report.goal_kind,
        "skipped": report.skipped,
        "malformed": report.malformed(),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    print(json.dumps(summary))
    if report.goals == 0:
        print(
            "note: no goals: give --human-instructions or --instructions for goals",
            file=sys.stderr,
        )
    return 0
