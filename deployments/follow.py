"""Following a flow run from the launcher (deployments/launch.py): its state, its subflows' new
log lines and the current stage's progress on one status line, until it ends; cancelling it;
the headline table printed when it does."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from deployments.processes import descendants

POLL_SECONDS = 1.0
"""The status line's redraw (a local file read)."""
SERVER_POLL_SECONDS = 3.0
"""The run's state, its subflow runs and their new log lines, from the server. Asked every
second they cost the server 1.8 CPU seconds a minute and the follower 0.5 (2 % of a 2-core
machine through a four-hour experiment); every 3 s, 0.3 and 0.1 (benchmarks/launcher_poll.py)."""
CANCEL_GRACE_SECONDS = 8.0


def say(msg: str) -> None:
    print(f"[mem1] {msg}", file=sys.stderr, flush=True)


def _subflow_ids(client: Any, root: UUID) -> list[UUID]:
    """`root` and all its subflow runs (stages are subflows, so their logs are theirs)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    ids, frontier = [root], [root]
    while frontier:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)
            )
        )
        frontier = [r.id for r in runs if r.id not in ids]
        ids += frontier
    return ids


class StatusLine:
    """The current stage's progress (`<run_dir>/progress.json`, mem1_core.runs.progress) on
    one line: redrawn in place every poll on a terminal, else printed every
    `every` seconds (and whenever the stage changes), so a log file does not flood. A file
    written before `since` (a stopped run's last line, in a run directory being resumed) is
    not shown: its clock would run on from a stage nobody is doing."""

    def __init__(self, path: Path | None, every: float = 5.0, since: float | None = None):
        self.path, self.every = path, every
        self.since = time.time() if since is None else since
        self.tty = sys.stderr.isatty()
        self.last_text, self.last_at, self.last_stage = "", 0.0, None
        self.drawn = False

    def poll(self) -> None:
        from mem1_core.runs.progress import line, read

        st = read(self.path) if self.path else None
        if not st or st.get("time", 0.0) < self.since:
            return
        if not st.get("final"):  # the clock runs between the stage's updates
            since = max(0.0, time.time() - st.get("time", time.time()))
            st["elapsed_s"] += since
            if st.get("eta_s") is not None:
                st["eta_s"] = max(0.0, st["eta_s"] - since)
        text = f"[mem1] {line(st)}"
        now = time.monotonic()
        if self.tty:
            if text != self.last_text:
                print(f"\r\033[2K{text}", end="", file=sys.stderr, flush=True)
                self.drawn = True
        elif st["stage"] != self.last_stage or now - self.last_at >= self.every:
            if text != self.last_text:
                print(text, file=sys.stderr, flush=True)
                self.last_at = now
        self.last_text, self.last_stage = text, st["stage"]

    def clear(self) -> None:
        """Before an ordinary line: end the redrawn one."""
        if self.tty and self.drawn:
            print("\r\033[2K", end="", file=sys.stderr, flush=True)
            self.drawn = False
            self.last_text = ""


def follow(
    flow_run_id: UUID,
    timeout: float | None,
    progress: Path | None = None,
    server_every: float = SERVER_POLL_SECONDS,
) -> Any:
    """Print state changes and new log lines of the run and its subflows (asked of the server
    every `server_every` seconds) and the current stage's progress line (every second), until
    the run is final (returns the flow run) or `timeout` seconds pass (raises TimeoutError)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    seen: set[UUID] = set()
    status = StatusLine(progress)
    since = datetime.now(UTC)
    last_state = None
    deadline = None if not timeout else time.monotonic() + timeout
    asked_at = -1e9
    with get_client(sync_client=True) as client:
        while True:
            if time.monotonic() - asked_at >= server_every:
                asked_at = time.monotonic()
                run = client.read_flow_run(flow_run_id)
                logs = client.read_logs(
                    LogFilter(
                        flow_run_id=LogFilterFlowRunId(any_=_subflow_ids(client, flow_run_id)),
                        timestamp=LogFilterTimestamp(after_=since),
                    ),
                    sort=LogSort.TIMESTAMP_ASC,
                    limit=200,
                )
                for log in logs:
                    if log.id not in seen:
                        seen.add(log.id)
                        since = max(since, log.timestamp)
                        if log.message.startswith("Finished in state Completed"):
                            continue  # one per task run: noise on a terminal
                        status.clear()
                        say(f"{log.timestamp:%H:%M:%S} {log.name.split('.')[-1]}: {log.message}")
                state = run.state.name if run.state else None
                if state != last_state:
                    status.clear()
                    say(f"flow run {run.name}: {state}")
                    last_state = state
                if run.state is not None and run.state.is_final():
                    status.clear()
                    return run
            status.poll()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run.name} not finished after {timeout:.0f} s")
            time.sleep(POLL_SECONDS)


def cancel(
    flow_run_id: UUID, worker: subprocess.Popen | None, wait: float = CANCEL_GRACE_SECONDS
) -> bool:
    """Ask the worker to cancel the run (or cancel it at once if no process runs it yet);
    True if it reached a final state within `wait` seconds. Stops waiting early once the
    worker runs no process any more: then nobody is left to report a final state."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled, Cancelling

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)
        if run.state is None or run.state.is_final():
            return True
        started = run.state.is_running() or run.state.is_pending()
        client.set_flow_run_state(flow_run_id, Cancelling() if started else Cancelled(), force=True)
        deadline = time.monotonic() + wait
        idle_since: float | None = None
        while time.monotonic() < deadline:
            state = client.read_flow_run(flow_run_id).state
            if state is not None and state.is_final():
                return True
            if worker is not None and worker.poll() is None and not descendants(worker.pid):
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    return False
            time.sleep(0.25)
    return False


def force_cancelled(flow_run_id: UUID) -> None:
    """Mark a run whose processes were stopped as Cancelled, so the UI shows no ghost run."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
        if state is None or not state.is_final():
            msg = "stopped by the launcher"
            client.set_flow_run_state(flow_run_id, Cancelled(message=msg), force=True)


def headline_table(summary: dict[str, Any]) -> str:
    """The run's headline for the terminal: its evaluation's headline rendered (agents × N,
    the paper's comparisons at every N) when the evaluation ran; else the stages' numbers."""
    from mem1_core.evaluation.report import headline_text

    if summary.get("eval_headline") or summary.get("headline_text"):
        lines = [f"mem1 run {summary['run_name']} ({summary['profile']}): {summary['status']}", ""]
        # a summary.json older than eval_headline carries its text already rendered
        head = summary.get("eval_headline")
        lines.append(headline_text(head) if head else summary["headline_text"])
        lines.append(f"(every stage's numbers: {summary['run_dir']}/summary.md)")
        if summary.get("failed_stage"):
            lines += ["", f"failed in stage {summary['failed_stage']}"]
        return "\n".join(lines)
    rows = [(r["stage"], r["metric"], str(r["value"])) for r in summary["headline_rows"]]
    head = ("stage", "metric", "value")
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [f"mem1 run {summary['run_name']} ({summary['profile']}): {summary['status']}", ""]
    lines += [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    if summary.get("failed_stage"):
        lines += ["", f"failed in stage {summary['failed_stage']}"]
    return "\n".join(lines)
