"""What following a run costs the Prefect server: its CPU seconds per minute while the
launcher's follower (`deployments.follow.follow`) asks it every `--every` seconds (the run's
state, its subflow runs, their new log lines), against no follower at all, side by side on one
server in one process.

A flow run with 8 subflow runs (two levels, as the experiment's) stays running through the
measurement and logs a line every 20 s (a stage's progress). For each cadence the follower runs
`--seconds`; the server's CPU time (its process group, from /proc) over that window is printed
as CPU seconds per minute, and the follower's own.

    python benchmarks/launcher_poll.py [--seconds 60] [--every 1 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from uuid import uuid4

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import PrefectServer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group `pgid`."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--every", type=float, nargs="+", default=[1.0, 3.0])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work, PrefectServer(Path(work)) as server:
        from prefect import flow, get_run_logger
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        from deployments import follow

        name, stop = f"poll-{uuid4().hex[:8]}", threading.Event()

        @flow(name="poll-stage")
        def stage(k: int) -> None:
            get_run_logger().info(f"stage {k}")

        @flow(name="poll-arm")
        def arm(k: int) -> None:
            stage(k)

        @flow(name="poll-experiment", flow_run_name=name)
        def experiment() -> None:
            for k in range(4):
                arm(k)
            while not stop.wait(20.0):
                get_run_logger().info("iteration 3 of 16 (19%) reward=0.25")

        thread = threading.Thread(target=experiment)
        thread.start()
        try:
            with get_client(sync_client=True) as client:
                runs = []
                while not runs:
                    time.sleep(0.5)
                    runs = client.read_flow_runs(
                        flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name]))
                    )
            run_id = runs[0].id
            time.sleep(5)
            pgid = os.getpgid(server.proc.pid)
            for every in [None, *args.every]:
                s0, f0 = group_cpu_seconds(pgid), time.process_time()
                t0 = time.monotonic()
                if every is None:
                    time.sleep(args.seconds)
                else:
                    try:
                        follow.follow(run_id, timeout=args.seconds, server_every=every)
                    except TimeoutError:
                        pass
                minutes = (time.monotonic() - t0) / 60
                row = {
                    "follower_every_s": every,
                    "server_cpu_s_per_min": round((group_cpu_seconds(pgid) - s0) / minutes, 2),
                    "follower_cpu_s_per_min": round((time.process_time() - f0) / minutes, 2),
                }
                print(json.dumps(row), flush=True)
        finally:
            stop.set()
            thread.join(timeout=60)
            from prefect.logging.handlers import APILogHandler

            APILogHandler.flush()  # the flow's last lines, before the server stops


if __name__ == "__main__":
    main()
