"""The `mem1` pipeline flow, its deployments and the launcher.

Fast tests check the pieces on their own: the newest-checkpoint search, the summary that
reports only the stages that ran, the deployment file, and the process-tree stop that the
launcher relies on for leaving nothing behind. The `server` tests run the real thing against
the Prefect server at PREFECT_API_URL (`./dev test` starts one): work pool, `prefect deploy`,
a worker, `prefect deployment run mem1/train-eval` on the smoke profile; and the launcher
interrupted mid-run. They skip, saying why, when no server answers.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import httpx
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from deployments import follow, launch
from deployments.processes import alive, descendants, stop_process_tree
from flows.pipeline import PIPELINE, STAGES, StageResult, headline_rows
from mem1_core.evaluation.run_summary import render_summary
from mem1_core.runs.layout import newest_checkpoint_under as latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# Every stage of the smoke pipeline (two PPO runs on shared Ray actors included): ~2 min on an
# idle 2-core box (measured 119.6 s), several times that on a loaded one.
E2E_TIMEOUT_S = 600
# The WebShop smoke pipeline reads pages (~150 tokens a turn): in process it ran in 1 min 51 s
# beside another training on a 2-core box; the watch allows for a slower, loaded one.
WEBSHOP_E2E_TIMEOUT_S = 900


# ---- fast tests ---------------------------------------------------------------------------


def _touch(path: Path, mtime: float, is_dir: bool = True) -> Path:
    if is_dir:
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    os.utime(path, (mtime, mtime))
    return path


def test_latest_checkpoint_is_the_newest_across_runs(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    (tmp_path / "run-without-checkpoints" / "data").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) is None

    _touch(tmp_path / "a" / "checkpoints" / "step-10", 1_000)
    newest = _touch(tmp_path / "b" / "checkpoints" / "step-5", 3_000)
    _touch(tmp_path / "b" / "checkpoints" / "step-1.safetensors", 2_000, is_dir=False)
    # A checkpoint being written (io.atomic_dir stages it as a dot-directory) is not one yet.
    _touch(tmp_path / "c" / "checkpoints" / ".step-20.abc.tmp", 9_000)
    assert latest_checkpoint(tmp_path) == newest
    assert latest_checkpoint(str(tmp_path)) == newest


def test_nightly_eval_without_a_checkpoint_claims_no_numbers(tmp_path):
    from flows.pipeline import nightly_eval

    assert nightly_eval.fn(runs_root=str(tmp_path)) == {
        "runs_root": str(tmp_path.resolve()),
        "checkpoint": None,
        "evaluated": False,
    }


def test_latest_checkpoint_finds_a_stage_runs_checkpoints(tmp_path):
    _touch(tmp_path / "a" / "checkpoints" / "step-10", 1_000)
    newest = _touch(tmp_path / "r" / "ppo_mem1" / "checkpoints" / "iter_000003", 4_000)
    assert latest_checkpoint(tmp_path) == newest


def _summary(results: dict[str, StageResult], failed: str | None = None) -> dict:
    seconds = {name: 1.0 for name in results} | ({failed: 0.5} if failed else {})
    return {
        "run_name": "r",
        "run_dir": "/abs/runs/r",
        "profile": "smoke",
        "status": "failed" if failed else "completed",
        "pipeline": list(PIPELINE),
        "failed_stage": failed,
        "error": "Traceback: boom" if failed else None,
        "seconds": seconds,
        "headline_rows": headline_rows(results),
    }


def test_summary_reports_only_the_stages_that_ran():
    assert list(STAGES) == list(PIPELINE), "every stage has an adapter, in pipeline order"
    ran = {"compose-tasks": StageResult({"dir": "/x"}, {"test_n2 tasks": 8, "train_n2 tasks": 64})}
    md = render_summary(_summary(ran))
    assert "| compose-tasks | ran | 1.0 |" in md
    assert "| compose-tasks | test_n2 tasks | 8 |" in md
    for name in [n for n in PIPELINE if n != "compose-tasks"]:
        assert f"| {name} | not run | |" in md
        assert f"| {name} | " not in md.split("Every stage's numbers")[1]

    table = follow.headline_table(_summary(ran))
    assert re.search(r"compose-tasks\s+train_n2 tasks\s+64", table)


def test_summary_marks_a_failed_stage_and_what_did_not_run():
    md = render_summary(_summary({}, failed="compose-tasks"))
    assert md.startswith("# mem1 run `r` — failed")
    assert "| compose-tasks | failed | 0.5 |" in md
    assert "No stage produced numbers." in md
    assert "Traceback: boom" in md


def test_deployment_file_names_the_flows_and_a_nightly_cron():
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    flows = {}
    for name, dep in deps.items():
        path, func = dep["entrypoint"].split(":")
        module = __import__(path.removesuffix(".py").replace("/", "."), fromlist=[func])
        flows[name] = getattr(module, func).name
        assert dep["work_pool"]["name"] == launch.POOL
    assert flows["train-eval"] == "mem1"  # so `prefect deployment run mem1/train-eval` works
    assert f"mem1/{deps['train-eval']['name']}" == launch.DEPLOYMENT
    assert flows["nightly"] == "mem1-nightly-eval"
    assert flows["experiment"] == flows["experiment-report"] == "mem1"
    (cron,) = [s["cron"] for s in deps["nightly"]["schedules"]]
    assert len(cron.split()) == 5
    (pull,) = spec["pull"]
    assert pull["prefect.deployments.steps.set_working_directory"]["directory"] == (
        "{{ $MEM1_ROOT }}"
    )


def test_importing_the_flows_loads_no_torch():
    """`prefect deploy` imports every entrypoint's module, and a flow run imports it before
    it is Running: the flows import the library's heavy layers (torch, transformers, pandas)
    where a stage runs, not at the top (they took 20 s of each deploy and flow-run start)."""
    heavy = ("torch", "transformers", "pandas")
    code = (
        "import sys, flows.pipeline, flows.stages, flows.data, flows.index, flows.report\n"
        "import deployments.launch\n"
        f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing the flows loaded {done.stdout.strip()}"


def test_stop_process_tree_reaches_processes_in_other_sessions():
    # Like a worker: a child in its own session, whose own child (a flow run) starts
    # another session, plus an ordinary grandchild.
    script = "setsid sleep 300 & sleep 300 & wait"
    proc = subprocess.Popen(["bash", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = descendants(proc.pid)
    assert len(tree) >= 2
    assert len({os.getpgid(p) for p in tree}) == 2, "one grandchild left the worker's group"
    stop_process_tree(proc, grace=5)
    deadline = time.monotonic() + 5
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in [proc.pid, *tree] if alive(p)]


# ---- against a real Prefect server --------------------------------------------------------


def _server_reason() -> str | None:
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        return "PREFECT_API_URL is not set: run `./dev test`, which starts a local server"
    try:
        httpx.get(f"{api.rstrip('/')}/health", timeout=3).raise_for_status()
    except httpx.HTTPError as e:
        return f"no Prefect server answers at PREFECT_API_URL={api} ({e.__class__.__name__})"
    return None


_NO_SERVER = _server_reason()
needs_server = pytest.mark.skipif(_NO_SERVER is not None, reason=_NO_SERVER or "")


def _processes_of_flow_run(flow_run_id: UUID) -> list[int]:
    """Live processes whose environment names this flow run (its engine and children)."""
    marker = f"PREFECT__FLOW_RUN_ID={flow_run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if alive(p)]


def _worker_processes(name: str) -> list[int]:
    out = subprocess.run(["ps", "-A", "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [
        int(line.split()[0])
        for line in out.splitlines()
        if "worker start" in line and f"--name {name}" in line and alive(int(line.split()[0]))
    ]


def _client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _artifacts(flow_run_ids: list[UUID]) -> dict[str, str]:
    """Key -> data of the artifacts these flow runs published (a key published more than once:
    its newest)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with _client() as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=flow_run_ids))
        )
    return {a.key: a.data for a in sorted(arts, key=lambda a: a.created) if a.key}


@pytest.mark.server
@needs_server
def test_ensure_pool_creates_a_process_pool_once():
    """A pool the server lacks is created (True) as a process pool; asked again, it is
    there already (False) and left as it is."""
    from uuid import uuid4

    from prefect.exceptions import ObjectNotFound

    name = f"mem1-test-pool-{uuid4().hex[:8]}"
    try:
        assert launch.ensure_pool(name) is True
        with _client() as client:
            created = client.read_work_pool(name)
        assert created.type == "process"
        assert launch.ensure_pool(name) is False
        with _client() as client:
            assert client.read_work_pool(name).id == created.id
    finally:
        with _client() as client:
            try:
                client.delete_work_pool(name)
            except ObjectNotFound:
                pass


@pytest.fixture(scope="module")
def deployed():
    launch.ensure_pool()
    with _client() as client:
        assert client.read_work_pool(launch.POOL).type == "process"
    t0 = time.perf_counter()
    launch.deploy()
    print(f"prefect deploy --all: {time.perf_counter() - t0:.1f} s")


@pytest.mark.server
@pytest.mark.slow
@needs_server
def test_train_eval_deployment_runs_on_a_worker(deployed, tmp_path):
    runs_root = tmp_path / "runs"
    worker = launch.start_worker(tmp_path / "worker.log")
    worker_name = f"mem1-launch-{os.getpid()}"
    flow_run_id = None
    try:
        t0 = time.perf_counter()
        cmd = [launch.prefect_exe(), "deployment", "run", launch.DEPLOYMENT,
               "--param", "profile=smoke", "--param", f"runs_root={runs_root}",
               "--param", "run_name=e2e", "--watch", "--watch-timeout", str(E2E_TIMEOUT_S)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=E2E_TIMEOUT_S + 60)
        print(f"prefect deployment run --watch: {time.perf_counter() - t0:.1f} s")
        out = done.stdout + done.stderr
        match = re.search(r"UUID: ([0-9a-f-]{36})", out)
        assert match, out
        flow_run_id = UUID(match.group(1))
        assert done.returncode == 0, out + (tmp_path / "worker.log").read_text()[-4000:]
        with _client() as client:
            run = client.read_flow_run(flow_run_id)
        assert run.state.is_completed()
        assert run.name == "e2e", "the flow run is named after its run directory"
        engine_pids = _processes_of_flow_run(flow_run_id)
    finally:
        tree = [worker.pid, *descendants(worker.pid)]
        stop_process_tree(worker)
    assert not _worker_processes(worker_name), "a prefect worker is still running"
    assert not [p for p in tree if alive(p)]
    assert not engine_pids or not [p for p in engine_pids if alive(p)]

    run_dir = runs_root / "e2e"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["run_dir"] == str(run_dir.resolve())
    assert summary["stages_run"] == list(PIPELINE)
    # The task counts in the headline are the rows of the Parquet files the run wrote.
    tasks = sorted((run_dir / "tasks").glob("*.parquet"))
    assert tasks
    for path in tasks:
        rows = pq.read_table(path).num_rows
        assert summary["headline"]["compose-tasks"][f"{path.stem} tasks"] == rows
    assert (run_dir / "summary.md").read_text().startswith("# mem1 run `e2e` — completed")
    # every stage left its files: the evaluation table and plots, the ablation plots
    for rel in (
        "eval/metrics.csv",
        "eval/metrics.parquet",
        "eval/peak_tokens.png",
        "eval/em.png",
        "ablation/rl_vs_sft.png",
        "ablation/reward_curve.png",
        "warm_start/policy",
    ):
        assert (run_dir / rel).exists(), rel
    agents = set(pd.read_csv(run_dir / "eval" / "metrics.csv")["agent"])
    assert {"warm-start", "mem1-ppo", "mem1-sft", "full-ppo", "truncate-ppo", "teacher"} <= agents
    # the nightly evaluation finds the newest checkpoint of this run and evaluates it
    from flows.pipeline import nightly_eval

    nightly = nightly_eval.fn(runs_root=str(runs_root), profile="smoke")
    assert nightly["evaluated"] and "/e2e/ppo_" in nightly["checkpoint"]
    assert (Path(nightly["out"]) / "metrics.csv").exists()
    assert {r["N"] for r in nightly["headline"]} == {1, 2, 4}

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with _client() as client:
        subflows = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])
            )
        )
    assert {s.state.name for s in subflows} == {"Completed"}
    # subflow runs are named after their stage and the run, not a random pair of words
    assert all(s.name.endswith(f" · {run_dir.name}") for s in subflows), [s.name for s in subflows]
    assert {"warm-start · " + run_dir.name, "train-ppo-mem1 (full) · " + run_dir.name} <= {
        s.name for s in subflows
    }
    published = _artifacts([flow_run_id])
    assert {"mem1-run-dir", "mem1-summary", "mem1-headline"} <= set(published)
    assert str(run_dir.resolve()) in published["mem1-run-dir"]  # the run directory, in the UI
    assert published["mem1-summary"] == (run_dir / "summary.md").read_text()
    # the pictures are in the artifacts themselves, not file paths
    assert published["mem1-summary"].count("](data:image/png;base64,") == 4
    assert "| mem1-ppo |" in published["mem1-headline"] and " ± " in published["mem1-headline"]
    stage_artifacts = _artifacts([s.id for s in subflows])
    assert {"tasks-smoke", "task-sample-smoke", "index-smoke"} <= set(stage_artifacts)
    assert stage_artifacts["objective-scaling-plots"].count("](data:image/png;base64,") == 2
    assert stage_artifacts["rl-vs-sft-plots"].count("](data:image/png;base64,") == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "mem1-ppo" in summary["headline_text"] and summary["wandb"]
    assert json.loads((run_dir / "progress.json").read_text())["final"]


@pytest.mark.server
@pytest.mark.slow
@needs_server
def test_webshop_train_eval_deployment_runs_on_a_worker(deployed, tmp_path):
    """The same deployment on the WebShop domain (`webshop-smoke`): every stage runs on the
    shops, and the evaluation has the domain's columns and its difficulty plot."""
    runs_root = tmp_path / "runs"
    worker = launch.start_worker(tmp_path / "worker.log")
    try:
        cmd = [launch.prefect_exe(), "deployment", "run", launch.DEPLOYMENT,
               "--param", "profile=webshop-smoke", "--param", f"runs_root={runs_root}",
               "--param", "run_name=ws", "--watch", "--watch-timeout", str(WEBSHOP_E2E_TIMEOUT_S)]  # fmt: skip
        t0 = time.perf_counter()
        timeout = WEBSHOP_E2E_TIMEOUT_S + 60
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        print(f"webshop: prefect deployment run --watch: {time.perf_counter() - t0:.1f} s")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out + (tmp_path / "worker.log").read_text()[-4000:]
    finally:
        stop_process_tree(worker)
    run_dir = runs_root / "ws"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["stages_run"] == list(PIPELINE)
    assert not (run_dir / "world").exists() and (run_dir / "shops").is_dir()
    for rel in ("eval/metrics.csv", "eval/difficulty.png", "eval/difficulty.json"):
        assert (run_dir / rel).exists(), rel
    table = pd.read_csv(run_dir / "eval" / "metrics.csv")
    assert {"warm-start", "mem1-ppo", "full-ppo", "teacher"} <= set(table["agent"])
    assert {"reward_x100", "success_rate"} <= set(table.columns)
    assert set(table["n_objectives"]) == {1}
    # the scripted teacher shops well on the held-out shop (measured: ~96 on a large shop)
    assert table.loc[table["agent"] == "teacher", "reward_x100"].iloc[0] >= 70


@pytest.mark.server
@needs_server
def test_a_worker_dies_with_a_launcher_killed_by_sigkill(tmp_path):
    """A launcher killed by SIGKILL runs no handler; its worker, in a session of its own, must
    still end (`launch._dies_with`), or it keeps polling the pool at the server's address and
    takes the flow runs of whatever server is next started there."""
    log = tmp_path / "worker.log"
    code = (
        "import sys, time; from pathlib import Path; from deployments import launch; "
        f"w = launch.start_worker(Path({str(log)!r})); print(w.pid, flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    worker = int(launcher.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while "started" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline and alive(worker), log.read_text()[-2000:]
            time.sleep(0.2)
        assert alive(worker)  # polling the pool while its launcher lives
        launcher.kill()
        launcher.wait()
        killed, deadline = time.monotonic(), time.monotonic() + 30
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(worker), "the worker outlived its launcher"
        print(f"the worker ended {time.monotonic() - killed:.1f} s after its launcher")
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.server
@pytest.mark.slow
@needs_server
def test_interrupted_launcher_leaves_no_process(deployed, tmp_path):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    run_name = f"interrupt-{os.getpid()}"
    cmd = [sys.executable, "-m", "deployments.launch", "--profile", "smoke", "--no-deploy",
           "--runs-root", str(tmp_path), "--run-name", run_name]  # fmt: skip
    log = tmp_path / "launcher.log"
    with open(log, "w") as sink:  # a file, not a pipe: a full pipe would block the launcher
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    worker_name = f"mem1-launch-{proc.pid}"
    flow_run_id, state, tree = None, None, []
    try:
        deadline = time.monotonic() + E2E_TIMEOUT_S
        with _client() as client:
            while time.monotonic() < deadline and proc.poll() is None:
                runs = client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name]))
                )
                if runs and runs[0].state and runs[0].state.is_running():
                    flow_run_id = runs[0].id
                    break
                time.sleep(0.25)
        assert flow_run_id is not None, "the flow run never started running"
        tree = [p for w in _worker_processes(worker_name) for p in [w, *descendants(w)]]
        assert _processes_of_flow_run(flow_run_id), "no process runs the flow run"
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal does
        proc.wait(timeout=60)
        print(f"launcher stopped {time.perf_counter() - t0:.1f} s after SIGINT")
        with _client() as client:
            state = client.read_flow_run(flow_run_id).state
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 130, out
    assert "interrupted" in out and "worker stopped" in out
    assert state is not None and state.is_final() and not state.is_completed(), state
    assert not _worker_processes(worker_name), "a prefect worker is still running"
    assert not [p for p in tree if alive(p)]
    assert not _processes_of_flow_run(flow_run_id)
