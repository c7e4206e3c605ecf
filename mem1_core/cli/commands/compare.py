"""`mem1 compare RUN_A RUN_B`: two runs' evaluation tables side by side, in their domain's units
(QA: EM fraction ± SE and EM sum; WebShop: reward ×100 ± SE and success rate), the difference
B − A with its standard error, peak tokens."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare two run directories' evaluations side by side")
    p.add_argument("run_a", help="run directory A (holds eval/metrics.csv)")
    p.add_argument("run_b", help="run directory B")
    p.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from mem1_core.evaluation.compare import compare_runs
    from mem1_core.evaluation.report import text_table

    rows = compare_runs(args.run_a, args.run_b)
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"A: {args.run_a}\nB: {args.run_b}\n")
        print(text_table(rows), end="")
    return 0
