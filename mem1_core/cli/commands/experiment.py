"""`mem1 experiment export|report`: an experiment's records, and its headline from any of them.

An experiment takes hours and may span several sittings and machines. `export RUN --out DIR`
writes a finished run's (a part's) records: small, portable, no weights
(mem1_core.experiment.records). `report SOURCE...` takes any mix of run directories and
exported records (local paths or fsspec URLs), merges them (refusing, in one line, what does
not pair: mem1_core.experiment.merge) and writes the headline one run of the whole experiment
writes: headline.{json,md}, curves.png, scaling.png, the claims Holm-corrected over the merged
tests. On one run directory without `--out` it also prints how far each stage has come and
writes into the run's eval/ (nothing is trained or played).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="an experiment's records, and its headline from them")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    r = verbs.add_parser(
        "report",
        help="merge run directories and exported records into one headline and claims table",
    )
    r.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="experiment run directories and exported records (paths or URLs)")  # fmt: skip
    r.add_argument("--out", help="where the headline goes (one run directory: its eval/)")
    r.add_argument("--update-docs", action="store_true",
                   help="rewrite the experiment's generated blocks in README.md and "
                   "docs/results.md, and docs/<experiment>_scaling.png")  # fmt: skip
    r.set_defaults(func=cmd_report)
    e = verbs.add_parser("export", help="write a finished run's records (no weights)")
    e.add_argument("run", help="the experiment's run directory (runs/<run name>)")
    e.add_argument("--out", required=True, help="a directory or fsspec URL (s3://, gs://)")
    e.add_argument("--samples", type=int, default=0,
                   help="trajectories per cell of the run's own world kept as text, for the UI")  # fmt: skip
    e.add_argument("--partial", action="store_true",
                   help="export a run that has not finished (its records say what is pending)")  # fmt: skip
    e.set_defaults(func=cmd_export)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def cmd_export(args: argparse.Namespace) -> int:
    from mem1_core.experiment.records import RecordsError, export_run, write_records

    try:
        rec = export_run(args.run, samples=args.samples)
    except (RecordsError, FileNotFoundError) as e:
        return _fail(str(e))
    if rec.pending and not args.partial:
        return _fail(f"{args.run} has not finished ({'; '.join(rec.pending)}); resume it, or "
                     "give --partial")  # fmt: skip
    ran, now = (rec.parts[0].get(k) or {} for k in ("code", "exported_with"))
    if ran.get("commit") and now.get("commit") and ran["commit"] != now["commit"]:
        print(f"warning: {args.run} ran at commit {ran['commit'][:12]}, this code is "
              f"{now['commit'][:12]}: the arms' training settings are recorded as this code "
              "resolves the experiment (export from a checkout of the run's commit to record "
              "them as it ran)", file=sys.stderr)  # fmt: skip
    manifest = write_records(rec, args.out)
    size = sum(f["bytes"] for f in manifest["files"].values())
    print(f"records of {args.run} ({rec.parts[0]['label']}): {len(rec.tasks)} task rows, "
          f"{len(rec.cells)} cells, {len(rec.arms)} arm runs, {size / 1e3:.0f} kB -> {args.out}")  # fmt: skip
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mem1_core.experiment.merge import merge_records
    from mem1_core.experiment.records import RecordsError, read_records
    from mem1_core.experiment.report import claims_markdown, write_report
    from mem1_core.experiment.results import expand_sources, update_docs

    args.sources = expand_sources(args.sources)
    one_run = len(args.sources) == 1 and (Path(args.sources[0]) / "experiment.json").is_file()
    try:
        rec = merge_records([read_records(s) for s in args.sources])
    except (RecordsError, FileNotFoundError) as e:
        return _fail(str(e))
    if one_run and not args.out:
        _stages(Path(args.sources[0]))
    elif not args.out:
        return _fail("give --out DIR: where the merged headline goes")
    out = Path(args.out) if args.out else Path(args.sources[0]) / "eval"
    title = f"`{Path(args.sources[0]).name}`" if one_run else f"{len(rec.parts)} parts merged"
    made = write_report(rec, out, title)
    h = made["headline"]
    if args.update_docs:
        scaling = next((p for t, p in made["plots"].items() if "against N" in t), None)
        pages = update_docs(h["experiment"], h, scaling)
        print(f"rewrote the {h['experiment']} blocks of {[str(p) for p in pages] or 'no page'}")
    print()
    if h["claims"]:
        print(claims_markdown(h))
    else:
        print("no claim can be judged yet: its agents have not both played its N on a world")
    state = "the headline" if h["complete"] else "the headline so far"
    print(f"{state}: {out / 'headline.md'} (plots beside it)")
    return 0


def _stages(run: Path) -> None:
    from mem1_core.experiment.configs import base_config
    from mem1_core.experiment.plan import spec_of_run, stage_status

    spec = spec_of_run(run)
    print(f"experiment {spec.name}, run {run}")
    for s in stage_status(spec, base_config(spec), run):
        print(f"  {s}")
