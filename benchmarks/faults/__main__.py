"""The fault benchmark's entry point: `python -m benchmarks.faults [--only FAULT ...]` (the
package's docstring says what each fault does and what counts as surviving it)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a path: the checkout

from benchmarks.faults import __doc__ as PACKAGE_DOC  # noqa: E402
from benchmarks.faults.actors import learner_kill, worker_kill  # noqa: E402
from benchmarks.faults.checkpoint import checkpoint_bitflip, checkpoint_truncated  # noqa: E402
from benchmarks.faults.disk_full import disk_full  # noqa: E402
from benchmarks.faults.flow_cancel import flow_cancel  # noqa: E402
from benchmarks.faults.harness import (  # noqa: E402
    STOP_SIGNALS,
    Context,
    Harness,
    interrupt,
    template,
    warm_start,
)
from benchmarks.faults.launcher import launcher_sigterm  # noqa: E402
from benchmarks.faults.retriever import retriever_down, retriever_restart  # noqa: E402
from benchmarks.faults.run import result, say  # noqa: E402

DESCRIPTION = PACKAGE_DOC.splitlines()[0]

FAULTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "worker_kill": worker_kill,
    "learner_kill": learner_kill,
    "retriever_restart": retriever_restart,
    "retriever_down": retriever_down,
    "checkpoint_truncated": checkpoint_truncated,
    "checkpoint_bitflip": checkpoint_bitflip,
    "disk_full": disk_full,
    "flow_cancel": flow_cancel,
    "launcher_sigterm": launcher_sigterm,
}


PREFECT_FAULTS = ("flow_cancel", "launcher_sigterm")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=DESCRIPTION)
    p.add_argument("--only", nargs="+", choices=sorted(FAULTS), help="run these faults only")
    p.add_argument("--work", help="working directory (default: a new temporary one, kept)")
    p.add_argument("--init", help="a warm-start policy (default: trained into --work first)")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="mem1-faults-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"working in {work}")
    names = args.only or list(FAULTS)
    # Explicit handlers, as deployments/launch.py has: `timeout` (SIGTERM), a closed terminal
    # (SIGHUP) and Ctrl-C all end in Harness.close, so no child outlives this script.
    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    harness = Harness(work)
    try:
        # What the selected faults need from the machine comes first, beside the warm start's
        # minutes: the Prefect server starts, and a tmpfs that cannot be mounted says so now.
        if set(names) & set(PREFECT_FAULTS):
            harness.prefect_server()
        if "disk_full" in names:
            harness.tmpfs()
        init = Path(args.init).resolve() if args.init else warm_start(work)
        ctx = Context(work, init, template(work, init), harness)
        return 1 if run_faults(ctx, names) else 0
    except KeyboardInterrupt as e:
        say(f"interrupted ({e}): stopping every process this script started")
        return 130
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        harness.close()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)


def run_faults(ctx: Context, names: list[str]) -> int:
    failed = 0
    for name in names:
        t0 = time.monotonic()
        try:
            line = FAULTS[name](ctx)
        except Exception as e:  # noqa: BLE001 - one fault's harness failure is that fault's row
            line = result(name, False, None, None, f"harness error: {type(e).__name__}: {e}")
        line["note"] += f" [{time.monotonic() - t0:.0f} s]"
        failed += not line["survived"]
        print(json.dumps(line), flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
