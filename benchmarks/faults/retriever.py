"""retriever_restart and retriever_down: the HTTP retrieval server (`mem1 serve-retriever`)
SIGKILLed during a rollout, started again OUTAGE_S later or left down past
retrieval.outage_seconds."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, free_port, retriever_command, wait_for_retriever, wait_until
from benchmarks.faults.harness import Context
from benchmarks.faults.run import (
    RUN_TIMEOUT_S,
    Recovery,
    Train,
    env,
    find_process,
    metrics_iterations,
    result,
    say,
)

OUTAGE_S = 5.0
"""How long `retriever_restart` keeps the server down (a restart takes about this)."""
SHORT_PATIENCE_S = 5.0
"""`retriever_down`: retrieval.outage_seconds, so the run gives up quickly."""


class RetrievalServer:
    """`mem1 serve-retriever` in a child process, its access log read line by line."""

    def __init__(self, index: Path, port: int, log: Path):
        self.index, self.port, self.log = index, port, log
        self.requests: list[float] = []
        self.proc: subprocess.Popen | None = None

    def start(self) -> RetrievalServer:
        cmd = retriever_command(self.index, self.port, "--access-log", "--log-level", "info")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        wait_for_retriever(self.port, self.proc)
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        with open(self.log, "a") as sink:
            for line in proc.stdout:
                sink.write(line)
                if "POST /retrieve" in line:
                    self.requests.append(time.monotonic())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _retriever_fault(ctx: Context, fault: str, come_back: bool) -> dict[str, Any]:
    out = ctx.run_dir(fault)
    index = next((out / "indexes").iterdir())
    port = free_port()
    server = RetrievalServer(index, port, out.with_name(f"{fault}.server.log")).start()
    extra = [f"retrieval.url=http://127.0.0.1:{port}"]
    if not come_back:
        extra.append(f"retrieval.outage_seconds={SHORT_PATIENCE_S}")
    run = Train(out, ctx.init, extra).start()
    try:
        run.until_first_iteration()
        prefix = "ray::RolloutWorker.rollout"
        wait_until(prefix, lambda: find_process(run.proc.pid, prefix), RUN_TIMEOUT_S, run.proc)
        at, served = len(metrics_iterations(out)), len(server.requests)
        server.kill()
        t_kill = time.monotonic()
        say(f"{fault}: server killed in iteration {at} after {served} requests")
        recovery = Recovery(out, at)
        if come_back:
            time.sleep(OUTAGE_S)
            server.start()
            rc = run.wait()
            after = [t - t_kill for t in server.requests[served:]]
            first = f"{after[0]:.1f} s after the kill" if after else "never"
            return result(fault, rc == 0, out, recovery.seconds(),
                          f"server down {OUTAGE_S:g} s in iteration {at}; the run's first request "
                          f"after the kill reached the restarted server {first} ({len(after)} "
                          f"after it); exit {rc}, no resume", run)  # fmt: skip
        rc = run.wait()
        stop = run.error_line()
        server.start()
        rc2 = run.resume_to_end()
        server.kill()
        return result(fault, rc == 1 and "retrieval server" in stop and rc2 == 0, out,
                      recovery.seconds(),
                      f"server killed in iteration {at}, left down; exit {rc} with "
                      f"`{stop[:200]}`; server restarted, --resume exit {rc2}", run)  # fmt: skip
    finally:
        run.kill()
        server.kill()


def retriever_restart(ctx: Context) -> dict[str, Any]:
    return _retriever_fault(ctx, "retriever_restart", come_back=True)


def retriever_down(ctx: Context) -> dict[str, Any]:
    return _retriever_fault(ctx, "retriever_down", come_back=False)
