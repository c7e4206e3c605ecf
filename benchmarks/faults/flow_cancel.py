"""flow_cancel: the `train-ppo` flow, served by a Prefect runner, cancelled through the API
during PPO; every process it started must stop, and the deployment run again resumes."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, wait_until
from benchmarks.faults.harness import Context
from benchmarks.faults.run import (
    OVERRIDES,
    PY,
    RAY_START_TRIES,
    RUN_TIMEOUT_S,
    Recovery,
    env,
    find_process,
    metrics_iterations,
    result,
    say,
    stopped_within,
    title,
)
from benchmarks.serve_ppo_stage import DEPLOYMENT_NAME
from deployments.processes import alive, descendants, stop_process_tree

DEPLOYMENT = f"train-ppo-mem1/{DEPLOYMENT_NAME}"


def _flow_run_until(flow_run_id, out: Path, tries: int = RAY_START_TRIES) -> Any:
    """Wait until the flow run has finished a PPO iteration; a run that failed because Ray
    did not start is started again (a new flow run) up to `tries` times. -> the flow run."""
    from prefect.deployments import run_deployment

    fr_id = flow_run_id
    for attempt in range(tries):

        def progress(fr_id=fr_id) -> bool:
            if metrics_iterations(out):
                return True
            state = _final_state(fr_id)
            if state is not None:
                raise RuntimeError(f"flow run ended {state} before an iteration")
            return False

        try:
            wait_until("iteration 0", progress, RUN_TIMEOUT_S)
            return fr_id
        except RuntimeError:
            if attempt + 1 == tries:
                raise
            say("flow_cancel: the flow run failed before an iteration; running it again")
            fr_id = run_deployment(DEPLOYMENT, parameters=_flow_params(out), timeout=0).id
    return fr_id


def _flow_run_processes(runner: int) -> list[int]:
    """Live processes of the flow runs a runner started: its children (it spawns each flow
    run with multiprocessing) and everything under them, but for the runner's own
    multiprocessing resource tracker, which lives as long as the runner."""
    found = []
    for child in _children(runner):
        if "multiprocessing.resource_tracker" not in title(child):
            found += [child, *descendants(child)]
    return sorted(p for p in found if alive(p))


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid
            ):
                kids.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return kids


def _settled_state(flow_run_id, want: str, timeout: float = 60) -> str | None:
    """The flow run's final state once it is `want`, or the last final one after `timeout`
    (the engine may report Crashed a moment before the runner records the cancellation)."""
    deadline, state = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        state = _final_state(flow_run_id)
        if state == want:
            break
        time.sleep(1)
    return state


def _flow_params(out: Path) -> dict[str, Any]:
    return {"profile": "smoke", "config_path": None, "overrides": OVERRIDES,
            "run_dir": str(out.parent)}  # fmt: skip


def flow_cancel(ctx: Context) -> dict[str, Any]:
    ctx.harness.prefect_server()  # before prefect is imported: it reads PREFECT_API_URL once
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    # The stage flow trains <run_dir>/ppo_mem1 from <run_dir>/warm_start, resuming by itself
    # when ppo_mem1/ holds anything (here: the assets, copied in).
    run_dir = ctx.work / "flow_cancel"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    shutil.copytree(ctx.init, run_dir / "warm_start")
    out = run_dir / "ppo_mem1"
    shutil.copytree(ctx.template, out)
    renv = {**env(), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    with open(ctx.work / "flow_cancel.runner.log", "ab") as log:
        runner = subprocess.Popen([PY, "-m", "benchmarks.serve_ppo_stage"], cwd=ROOT, env=renv,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_until("the served deployment", lambda: _deployment(DEPLOYMENT), 300, runner)
        fr = run_deployment(DEPLOYMENT, parameters=_flow_params(out), timeout=0)
        fr_id = _flow_run_until(fr.id, out)
        prefix = "ray::RolloutWorker"
        wait_until("a rollout worker", lambda: find_process(runner.pid, prefix), 60, runner)
        tree = _flow_run_processes(runner.pid)
        at = len(metrics_iterations(out))
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(fr_id, Cancelling(), force=True)
        say(f"flow_cancel: cancelled in iteration {at}; the flow run has {len(tree)} processes")
        recovery = Recovery(out, at)
        stop_s, left = stopped_within(tree)
        state = _settled_state(fr_id, "Cancelled", 120)
        fr2 = run_deployment(DEPLOYMENT, parameters=_flow_params(out), timeout=RUN_TIMEOUT_S)
        state2 = fr2.state.name if fr2.state else None
        note = (
            f"cancelled through the API in iteration {at}: the flow run went {state}; the "
            f"{len(tree)} processes it had started (its engine, Ray's processes and actors) "
            f"were gone {stop_s} s after the cancel request"
            f"{f', left: {left}' if left else ''}; the same deployment run again (it resumes "
            f"a non-empty stage directory): {state2}"
        )
        ok = not left and state == "Cancelled" and state2 == "Completed"
        return result("flow_cancel", ok, out, recovery.seconds(), note)
    finally:
        stop_process_tree(runner, grace=30)  # its flow runs have sessions of their own


def _deployment(name: str) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
            return True
        except ObjectNotFound:
            return False


def _final_state(flow_run_id) -> str | None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state.name if state is not None and state.is_final() else None
