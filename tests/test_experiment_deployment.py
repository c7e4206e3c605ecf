"""The experiment deployment (`mem1/experiment`) on a real Prefect server and worker, on the
smoke experiment (2 seeds per PPO arm, the run's world and a held-out one, tiny counts):
killed mid-run, retried the way the UI's Retry does it (the same flow run scheduled again),
resumed without recomputing any finished stage; then its headline, claims and artifacts."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from test_e2e_deployment import (
    _artifacts,
    _client,
    _processes_of_flow_run,
    deployed,  # noqa: F401  (the module fixture: pool and deployments on the server)
    needs_server,
)

from deployments import launch
from deployments.processes import stop_process_tree
from mem1_core.experiment.headline import POOLED

TIMEOUT_S = 1800  # a loaded 2-core machine: ~20 min seen; idle, a few minutes
WHOLE: dict[str, Path] = {}
"""The whole smoke experiment's run directory, once the first test has run it."""


def _wait(what: str, until, timeout: float = TIMEOUT_S, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = until()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"{what}: not within {timeout:.0f} s")


def _state(flow_run_id):
    with _client() as client:
        return client.read_flow_run(flow_run_id).state


def _finished_files(run_dir: Path) -> dict[str, int]:
    """Modification times of what the finished stages wrote: the warm start's result and
    every arm whose metrics say it stopped at its count."""
    out = {}
    warm = run_dir / "warm_start" / "result.json"
    if warm.is_file():
        out["warm_start/result.json"] = warm.stat().st_mtime_ns
    for path in run_dir.glob("ppo_*/seed*/metrics.jsonl"):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if rows and "stopped_by" in rows[-1]:
            out[str(path.relative_to(run_dir))] = path.stat().st_mtime_ns
    return out


@pytest.mark.server
@pytest.mark.slow
@needs_server
def test_experiment_resumes_after_a_crash_and_publishes_its_claims(deployed, tmp_path):  # noqa: F811
    from prefect.deployments import run_deployment
    from prefect.states import AwaitingRetry

    runs_root = tmp_path / "runs"
    worker = launch.start_worker(tmp_path / "worker.log")
    try:
        run = run_deployment(
            launch.EXPERIMENT_DEPLOYMENT,
            parameters={"experiment": "smoke", "runs_root": str(runs_root)},
            timeout=0,
            as_subflow=False,
        )
        # no run name: the run directory is named after the flow run, the same on its retry
        run_dir = runs_root / f"smoke-{str(run.id)[:8]}"
        WHOLE["run"] = run_dir
        # Kill the flow run once the full-context arm has started: the warm start and both
        # MEM1 arms are finished by then, the full-context arm is not.
        _wait("the full-context arm to start", lambda: (run_dir / "ppo_full" / "seed0").exists())
        done_before = _finished_files(run_dir)
        assert "warm_start/result.json" in done_before
        assert {"ppo_mem1/seed0/metrics.jsonl", "ppo_mem1/seed1/metrics.jsonl"} <= set(done_before)
        pids = _processes_of_flow_run(run.id)
        assert pids, "no process runs the flow run"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        crashed = _wait(
            "the worker to report the crash", lambda: _state(run.id).is_final() and _state(run.id)
        )
        assert crashed.is_crashed(), crashed
        # The worker reaps the process after its runner reported the crash, and reports the
        # crash again unless the run is still Crashed then: a retry scheduled before that
        # would be marked crashed by it (a person clicking Retry comes later than that).
        log = tmp_path / "worker.log"
        _wait(
            "the worker to reap the killed run",
            lambda: "prefect.flow_runs.worker - Check whether" in log.read_text(),
        )
        # Prefect's own retry of a crashed flow run (what the UI's Retry button sets): the same
        # flow run, same parameters, scheduled again and picked up by the worker
        with _client() as client:
            client.set_flow_run_state(run.id, AwaitingRetry(), force=True)
        _wait("the retried run to end", lambda: _state(run.id).is_final(), every=2)
        final = _state(run.id)
        assert final.is_completed(), (final, (tmp_path / "worker.log").read_text()[-4000:])
        with _client() as client:
            assert client.read_flow_run(run.id).run_count == 2
    finally:
        stop_process_tree(worker)

    # nothing that had finished before the kill was computed again
    after = _finished_files(run_dir)
    assert {k: after[k] for k in done_before} == done_before
    for arm in ("ppo_mem1", "ppo_full"):
        for seed in (0, 1):
            rows = [
                json.loads(x)
                for x in (run_dir / arm / f"seed{seed}" / "metrics.jsonl").read_text().splitlines()
            ]
            assert [r["iteration"] for r in rows] == [0, 1], (arm, seed)  # none lost or repeated
    # every stage's wall time, the killed attempt's folded in (tests/test_experiment.py)
    walls = json.loads((run_dir / "walls.json").read_text())
    assert {"warm start", "full-ppo · seed 0", "evaluation, world 4242"} <= set(walls), walls
    assert not (run_dir / "walls.open.json").exists()

    h = json.loads((run_dir / "eval" / "headline.json").read_text())
    assert set(h["worlds"]) == {"0", "4242"} and h["worlds"]["0"]["own"]
    for world in h["worlds"].values():
        assert world["seeds"]["mem1-ppo"] == [0, 1] and world["seeds"]["warm-start"] == [None]
        cells = {(c["agent"], c["seed"], c["N"]) for c in world["cells"]}
        for n in (2, 8):
            assert {("mem1-ppo", 0, n), ("mem1-ppo", 1, n), ("mem1-ppo", POOLED, n)} <= cells
            assert ("warm-start", POOLED, n) in cells and ("mem1-sft", 0, n) in cells
    claims = {c["key"]: c for c in h["claims"]}
    # the claims at N=16 are left out: the smoke experiment evaluates N=2 and 8
    assert {"mem1_above_start", "mem1_above_full@8", "rl_above_sft@8"} == set(claims)
    start = claims["mem1_above_start"]["worlds"]["4242"]
    assert set(start["seeds"]) == {"0", "1"} and "se_paired" in start[POOLED]
    assert start["verdict"] in {"holds", "does not hold", "seed 0 only", "seed 1 only"}
    assert (run_dir / "eval" / "curves.png").is_file() and (
        run_dir / "eval" / "scaling.png"
    ).is_file()

    # the UI: the stages as subflow runs named for what they are, the claims and the plots
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
    )

    with _client() as client:
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run.id])
            )
        )
        parent = client.read_flow_run(run.id)
    assert parent.name == f"experiment · {run_dir.name}"
    names = {s.name for s in subflows}
    assert {"mem1-ppo · seed 1", "full-ppo · seed 0", "mem1-sft · seed 0",
            "evaluate · world 4242", f"warm-start · {run_dir.name}"} <= names  # fmt: skip
    published = _artifacts([run.id])
    assert "MEM1 above its start at N=2" in published["mem1-experiment-claims"]
    assert published["mem1-experiment-headline"].count("](data:image/png;base64,") == 2
    assert "| mem1-ppo · seed 1 |" in published["mem1-experiment-headline"]
    assert "Not finished" not in published["mem1-experiment-headline"]
    # while it ran: the headline so far after each stage, and the share of the stages done
    with _client() as client:
        versions = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["mem1-experiment-headline"]))
        )
        progress = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["mem1-experiment-progress"]),
                flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]),
            )
        )
    # the retried flow run made its own progress artifact: the newest is the one that ended
    progress = max(progress, key=lambda a: a.created)
    so_far = [a.data for a in versions if "Not finished" in a.data]
    assert len(so_far) >= 3, len(so_far)  # the start, the warm start, each arm trained, world 0
    assert any("full-ppo · seed 1: 0 of 2 iterations" in d for d in so_far)
    assert progress.data == 100.0 and "evaluation, world 4242: done" in progress.description


@pytest.mark.server
@pytest.mark.slow
@needs_server
def test_parts_on_their_own_runs_merge_into_the_whole_runs_figures(deployed, tmp_path):  # noqa: F811
    """The smoke experiment as two parts (`seeds=[0]`, `seeds=[1]`), each a deployment run in
    its own run directory that trains its own warm start: their records, exported and merged,
    state every figure of the whole run's headline (the test above), to the last digit."""
    from prefect.deployments import run_deployment

    from mem1_core.experiment.merge import headline_of, merge_records
    from mem1_core.experiment.records import export_run, read_records, write_records

    if "run" not in WHOLE:
        pytest.skip("the whole run (the test above) did not run")
    worker = launch.start_worker(tmp_path / "worker.log")
    try:
        for seed in (0, 1):
            run = run_deployment(
                launch.EXPERIMENT_DEPLOYMENT,
                parameters={"experiment": "smoke", "runs_root": str(tmp_path / "runs"),
                            "run_name": f"seed{seed}", "seeds": [seed]},
                timeout=TIMEOUT_S, as_subflow=False,
            )  # fmt: skip
            assert run.state.is_completed(), (tmp_path / "worker.log").read_text()[-4000:]
    finally:
        stop_process_tree(worker)
    for seed in (0, 1):
        write_records(export_run(tmp_path / "runs" / f"seed{seed}"), str(tmp_path / f"r{seed}"))
    merged = headline_of(merge_records([read_records(str(tmp_path / f"r{s}")) for s in (1, 0)]))
    whole = json.loads((WHOLE["run"] / "eval" / "headline.json").read_text())

    def figures(h):
        curves = {k: [{x: v for x, v in r.items() if x != "seconds"} for r in rows]
                  for k, rows in h["curves"].items()}  # fmt: skip
        return json.dumps({k: h[k] for k in ("claims", "effects", "worlds", "bars")}
                          | {"curves": curves}, sort_keys=True)  # fmt: skip

    assert figures(merged) == figures(whole)
    assert {p["label"] for p in merged["parts"]} == {"seed 0", "seed 1"}
