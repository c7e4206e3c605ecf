"""launcher_sigterm: SIGTERM to `deployments/launch.py` running the smoke pipeline
(mem1/train-eval) during its PPO stage; every process gone, then relaunched."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from typing import Any

from benchmarks.common import ROOT, wait_until
from benchmarks.faults.harness import Context
from benchmarks.faults.run import (
    ITERATIONS,
    PY,
    RUN_TIMEOUT_S,
    Recovery,
    env,
    metrics_iterations,
    result,
    run_to_exit,
    say,
    stopped_within,
)
from deployments.processes import alive, descendants, stop_processes


def launcher_sigterm(ctx: Context) -> dict[str, Any]:
    ctx.harness.prefect_server()  # the launcher talks to the server at PREFECT_API_URL
    runs_root = ctx.work / "launcher"
    shutil.rmtree(runs_root, ignore_errors=True)
    runs_root.mkdir()
    name = "pipeline"
    ppo = runs_root / name / "ppo_mem1"
    sets = [a for o in [f"ppo.iterations={ITERATIONS}", "ppo.minutes=60"] for a in ("--set", o)]
    cmd = [PY, "-m", "deployments.launch", "--profile", "smoke", "--runs-root", str(runs_root),
           "--run-name", name, *sets]  # fmt: skip
    log = ctx.work / "launcher.log"
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        wait_until("PPO iteration 0", lambda: metrics_iterations(ppo), 2 * RUN_TIMEOUT_S, proc)
        tree = [p for p in descendants(proc.pid) if alive(p)]
        at = len(metrics_iterations(ppo))
        proc.send_signal(signal.SIGTERM)
        t_signal = time.monotonic()
        say(f"launcher_sigterm: SIGTERM in PPO iteration {at}; {len(tree)} processes under it")
        recovery = Recovery(ppo, at)
        rc = proc.wait(timeout=120)
        stop_s, left = stopped_within(tree, since=t_signal)
        rc2 = run_to_exit([*cmd, "--no-deploy"], log, 3 * RUN_TIMEOUT_S)
        summary = json.loads((runs_root / name / "summary.json").read_text())
        note = (
            f"SIGTERM in PPO iteration {at}: launcher exit {rc}; the {len(tree)} processes "
            f"under it (worker, flow run, Ray) were gone {stop_s} s after the signal"
            f"{f', left: {left}' if left else ''}; relaunched with the same run name (the "
            f"pipeline resumes its stages): exit {rc2}, summary {summary['status']}"
        )
        ok = rc == 130 and not left and rc2 == 0 and summary["status"] == "completed"
        return result("launcher_sigterm", ok, ppo, recovery.seconds(), note)
    finally:
        if proc.poll() is None:  # SIGTERM first: the launcher then stops its worker and flow run
            tree = [proc.pid, *descendants(proc.pid)]
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
            stop_processes([p for p in tree if alive(p)])
