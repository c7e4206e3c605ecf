"""`mem1 experiment report RUN`: where an experiment run stands, and its headline so far.

An experiment takes hours and may span several sittings. This reads what the run directory
holds (nothing is trained or played): each stage's progress (the warm start, each arm × seed's
iterations, each world's evaluation cells), then writes the headline the finished run would
write (eval/headline.{json,md}, eval/curves.png, eval/scaling.png) from what is there, marked
unfinished where it is, and prints the claims table. The deployment run itself writes the same
files when it finishes.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="an experiment run's progress and headline so far")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    r = verbs.add_parser(
        "report",
        help="print each stage's progress and the claims; write eval/headline.* from what has run",
    )
    r.add_argument("run", help="the experiment's run directory (runs/<run name>)")
    r.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from mem1_core.experiment.plan import spec_of_run, stage_status
    from mem1_core.experiment.report import claims_markdown, write_experiment_headline
    from mem1_core.experiment.spec import base_config

    run = Path(args.run)
    spec = spec_of_run(run)
    cfg = base_config(spec)
    print(f"experiment {spec.name}, run {run}")
    for s in stage_status(spec, cfg, run):
        print(f"  {s}")
    made = write_experiment_headline(spec, cfg, run)
    h = made["headline"]
    print()
    if h["claims"]:
        print(claims_markdown(h))
    else:
        print("no claim can be judged yet: its agents have not both played its N on a world")
    state = "the headline" if h["complete"] else "the headline so far"
    print(f"{state}: {run / 'eval' / 'headline.md'} (plots beside it)")
    return 0
