"""`mem1 config show`, `mem1 config reference`: the resolved configuration, each field with
its doc and where its value came from, and the Markdown reference (docs/configuration.md)."""

from __future__ import annotations

import argparse
import json
import sys

from mem1_core.cli.commands.data import add_config_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="print a resolved config, or the configuration reference")
    verbs = p.add_subparsers(dest="config_command", required=True, metavar="VERB")

    s = verbs.add_parser(
        "show",
        help="the resolved config: each field's value, doc and source "
        "(default, profile NAME, file PATH, --set)",
    )
    add_config_args(s)
    s.add_argument("--json", action="store_true", help="JSON Lines: key, value, source, doc")
    s.add_argument("--changed", action="store_true", help="only fields not at their default")
    s.set_defaults(func=cmd_show)

    r = verbs.add_parser(
        "reference", help="the Markdown reference of every field (docs/configuration.md)"
    )
    r.set_defaults(func=cmd_reference)


def cmd_show(args: argparse.Namespace) -> int:
    from mem1_core.config.reference import DEFAULT, render_show, resolve

    rows = resolve(args.profile, args.config, args.overrides)
    if args.changed:
        rows = [r for r in rows if r.source != DEFAULT]
    if args.json:
        for r in rows:
            print(json.dumps(r.to_dict()))
    else:
        sys.stdout.write(render_show(rows))
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from mem1_core.config.reference import render_reference

    sys.stdout.write(render_reference())
    return 0
