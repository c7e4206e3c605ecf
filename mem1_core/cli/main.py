"""The `mem1` command line: one entry point for every stage.

Each stage module exposes `register(subparsers)`, which adds its subcommand(s) and sets
`func` on the parser; `main` dispatches. Stage modules import heavy libraries lazily, so
`mem1 --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from mem1_core.runs.faults import DiskFull, RunStopped

# Modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES = [
    "mem1_core.cli.commands.data",
    "mem1_core.cli.commands.retrieval",
    "mem1_core.cli.commands.rollout",
    "mem1_core.cli.commands.train",
    "mem1_core.cli.commands.evaluate",
    "mem1_core.cli.commands.compare",
    "mem1_core.cli.commands.experiment",
    "mem1_core.cli.commands.show",
    "mem1_core.cli.commands.bench",
    "mem1_core.cli.commands.config",
]


class UserError(Exception):
    """Bad input from the user: printed as `error: …` with exit code 2, no traceback."""


STOPPED_EXIT_CODE = 1
"""A run stopped by a fault (`RunStopped`, a full disk): `error: …`, no traceback, exit 1."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mem1", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _show_compute_choice() -> None:
    """The compute dtype each process picks for this machine (mem1_core.models.compute) is
    logged once at INFO; a command's stderr shows it, as a flow run's log does."""
    import logging

    logger = logging.getLogger("mem1_core.models.compute")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _show_compute_choice()
    try:
        rc = args.func(args)
    except (UserError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RunStopped, DiskFull) as e:
        print(f"error: {e}", file=sys.stderr)
        return STOPPED_EXIT_CODE
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
