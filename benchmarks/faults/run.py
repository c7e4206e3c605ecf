"""What every fault shares: one `mem1 train ppo` run in a child process (`Train`), the
processes under it, the clock from a fault until the run has recovered (`Recovery`) and a
fault's JSON line (`result`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, wait_until
from deployments.processes import alive, descendants, stop_processes

PY = sys.executable
ITERATIONS = 4
OVERRIDES = [
    f"ppo.iterations={ITERATIONS}",
    "ppo.minutes=60",
    "ppo.checkpoint_every=1",
    "ppo.tasks_per_iteration=4",
    "ppo.minibatch_size=4",
    "ppo.micro_batch_size=4",
    "data.max_eval_tasks=2",
]
RUN_TIMEOUT_S = 1200.0
"""Longest wait for one training process (a loaded 2-core machine is slow to start Ray)."""
RAY_START_FAILED = "The current node timed out during startup"
RAY_START_TRIES = 3
"""A run whose private Ray did not start (its raylet gives the node's agents 30 s to come
up, too short on a loaded 2-core machine) is started again, up to this many times."""
STOP_TIMEOUT_S = 60.0
"""Longest wait for the processes of a cancelled run to go."""


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def say(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def find_process(root_pid: int, prefix: str) -> int | None:
    """A live process under `root_pid` whose title starts with `prefix` (Ray names an
    actor's process `ray::Class` and, inside a call, `ray::Class.method`)."""
    for pid in descendants(root_pid):
        if title(pid).startswith(prefix) and alive(pid):
            return pid
    return None


# ---- one training run ------------------------------------------------------------------------


def metrics_iterations(out: Path) -> list[int]:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(x)["iteration"] for x in lines if x.strip()]


def tally(out: Path) -> tuple[int, int]:
    """(lost, duplicated) iterations of a finished run: each of 0..ITERATIONS-1 must be in
    metrics.jsonl once and have its trajectories file."""
    rows = metrics_iterations(out)
    parts = {
        int(p.stem.removeprefix("iter_")) for p in (out / "trajectories").glob("iter_*.parquet")
    }
    expected = set(range(ITERATIONS))
    lost = len(expected - (set(rows) & parts))
    return lost, len(rows) - len(set(rows))


class Recovery:
    """Watches metrics.jsonl from a fault on: the last moment a version of it written since
    came to hold iteration `target` (the one the run was in at the fault) is the recovery.
    The last, because a run stopped at a checkpoint may have written that iteration's row
    first, and its resume drops the row (it follows the checkpoint) and writes it again."""

    def __init__(self, out: Path, target: int):
        self.out, self.target = out, target
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        path, present = self.out / "metrics.jsonl", False
        while not self._stop.is_set():
            try:
                fresh = path.stat().st_mtime >= self.wall0
            except FileNotFoundError:
                fresh = False
            now = fresh and self.target in metrics_iterations(self.out)
            if now and not present:
                self.at = time.monotonic()
            present = now
            time.sleep(0.1)

    def seconds(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return None if self.at is None else round(self.at - self.t0, 1)


@dataclass
class Train:
    """`mem1 train ppo` in a child process, its stderr in a log file."""

    out: Path
    init: Path
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_dir: Path | None = None
    """Where the logs go (default: beside `out`)."""
    ray_retries: int = 0
    """Starts redone because Ray itself did not come up (`RAY_START_FAILED`)."""
    _logs: int = 0

    def command(self, resume: bool) -> list[str]:
        sets = [a for o in [*OVERRIDES, *self.extra] for a in ("--set", o)]
        return [PY, "-m", "mem1_core.cli.main", "train", "ppo", "--profile", "smoke",
                "--out", str(self.out), "--init", str(self.init), "--no-progress", *sets,
                *(["--resume"] if resume else [])]  # fmt: skip

    def start(self, resume: bool = False) -> Train:
        self._logs += 1
        kind = "resume" if resume else "run"
        self.log = (self.log_dir or self.out.parent) / f"{self.out.name}.{self._logs}.{kind}.log"
        with open(self.log, "ab") as sink:
            self.proc = subprocess.Popen(
                self.command(resume), cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT
            )
        self.resume = resume
        return self

    def all_logs(self) -> str:
        logs = sorted((self.log_dir or self.out.parent).glob(f"{self.out.name}.*.log"))
        return "".join(p.read_text(errors="replace") for p in logs)

    def ray_failed(self) -> bool:
        return RAY_START_FAILED in self.log.read_text(errors="replace")

    def until_first_iteration(self) -> None:
        """Wait until the run has finished an iteration; a start that failed because Ray
        did not come up is redone (up to RAY_START_TRIES times)."""
        while True:
            try:
                wait_until("iteration 0", lambda: metrics_iterations(self.out), RUN_TIMEOUT_S,
                           self.proc)  # fmt: skip
                return
            except RuntimeError:
                if not self.ray_failed() or self.ray_retries + 1 >= RAY_START_TRIES:
                    raise
                self.ray_retries += 1
                say(f"{self.out.name}: Ray did not start; starting the run again")
                self.start(self.resume)

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the run and every process under it, and wait until all are gone (their
        open files may hold a mount busy)."""
        if self.proc is not None and self.proc.poll() is None:
            stop_processes([self.proc.pid, *descendants(self.proc.pid)], grace=0)
            self.proc.wait()

    def error_line(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return next((x for x in reversed(lines) if x.startswith("error:")), "")

    def run_to_end(self) -> int:
        self.start()
        self.until_first_iteration()
        return self.wait()

    def resume_to_end(self) -> int:
        for _ in range(RAY_START_TRIES):
            rc = self.start(resume=True).wait()
            if rc == 0 or not self.ray_failed():
                return rc
            self.ray_retries += 1
            say(f"{self.out.name}: Ray did not start; resuming again")
        return rc


def run_to_exit(cmd: list[str], log: Path, timeout: float) -> int:
    """Run `cmd` in the checkout, its output appended to `log`; -> its exit status. On a
    timeout it and its tree are stopped. Unlike subprocess.run, an interruption leaves the
    tree whole for Harness.close to stop: run's SIGKILL of the child alone orphans its own
    children (the SFT warm start's, the launcher's worker)."""
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_processes([proc.pid, *descendants(proc.pid)])
        raise


def result(
    fault: str,
    survived: bool,
    out: Path | None,
    recovered: float | None,
    note: str,
    run: Train | None = None,
) -> dict[str, Any]:
    lost, dup = tally(out) if out is not None else (None, None)
    if run is not None and run.ray_retries:
        note += f" (Ray failed to start {run.ray_retries}x on the loaded machine; started again)"
    return {
        "fault": fault,
        "survived": bool(survived and lost == 0 and dup == 0),
        "lost_iterations": lost,
        "duplicated_iterations": dup,
        "seconds_to_recover": recovered,
        "note": note,
    }


def stopped_within(
    pids: list[int], since: float | None = None, timeout: float = STOP_TIMEOUT_S
) -> tuple[float | None, list]:
    """(seconds from `since` until none of `pids` is alive, or None; those left after
    `timeout`, with their titles)."""
    t0 = time.monotonic() if since is None else since
    while time.monotonic() - t0 < timeout:
        if not [p for p in pids if alive(p)]:
            return round(time.monotonic() - t0, 1), []
        time.sleep(0.1)
    return None, [(p, title(p)[:60]) for p in pids if alive(p)]
