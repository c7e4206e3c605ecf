"""Training on a real multi-node Ray cluster on localhost: a head and a second node, each a
`ray start --block` process of its own, stopped in teardown.

The head has 3 CPUs and one logical GPU (Ray counts what it is told; nothing computes on
it), the second node 1 CPU. A run whose learner asks for that GPU and whose placement is
`spread` has its learner on the head and its rollout worker on the second node, so a test
knows which node to kill. The tests share one cluster and run in file order: the last one
kills the second node.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from test_train_ray import OVERRIDES as SMOKE_PPO

from mem1_core.config import load_config

ray = pytest.importorskip("ray")

RAY = str(Path(sys.executable).parent / "ray")
OVERRIDES = [*SMOKE_PPO, "ppo.iterations=3"]
ON_TWO_NODES = ["resources.placement=spread", "resources.learner_gpus=1"]
"""The learner on the head (the only node with a GPU), the worker spread to the other."""
COMPARED = ("reward", "kl", "train/pg_loss", "train/vf_loss", "train/policy_grad_norm")
HEALTH_CHECK = '{"health_check_period_ms": 1000, "health_check_failure_threshold": 3}'
"""The head marks a silent node dead after ~3 s instead of Ray's ~15 s: a shorter test."""


def _sessions(sid: int) -> list[int]:
    """PIDs of the processes in session `sid` (a `ray start` we started in a new session,
    and every process it started: gcs, raylet, their workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid:
                pids.append(int(entry.name))
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class LocalCluster:
    """Ray nodes on localhost, each a `ray start --block` in a session of its own."""

    def __init__(self, root: Path):
        self.root = root
        self.env = dict(
            os.environ,
            RAY_TMPDIR=str(root),  # its record (ray_current_cluster) stays in here
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="disabled",
        )
        self.env.pop("RAY_ADDRESS", None)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []

    def start(self, *args: str, wrap: list[str] | None = None) -> subprocess.Popen:
        head = not self.nodes
        where = [
            "--head",
            f"--port={self.port}",
            f"--system-config={HEALTH_CHECK}",
            "--include-dashboard=false",
        ]
        cmd = [RAY, "start", "--block", "--disable-usage-stats"]
        cmd += [*(where if head else [f"--address={self.address}"]), *args]
        if wrap:  # a shell command line that ends with `exec`, then this one
            cmd = [*wrap[:-1], f"{wrap[-1]} {shlex.join(cmd)}"]
        log = open(self.root / f"node{len(self.nodes)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.nodes.append(proc)
        return proc

    def alive(self) -> list[dict]:
        return [n for n in ray.nodes() if n["Alive"]]

    def wait_for(self, count: int, timeout: float = 180.0) -> list[dict]:
        """Connect, wait until `count` nodes are alive, disconnect; -> the live nodes."""
        t0 = time.monotonic()
        for proc in self.nodes:
            if proc.poll() is not None:  # its log says why
                raise RuntimeError(
                    f"`ray start` exited: {self.root}/node{self.nodes.index(proc)}.log"
                )
        while True:
            try:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
                break
            except ConnectionError:
                if time.monotonic() - t0 > timeout:
                    raise
                time.sleep(1)
        try:
            while len(self.alive()) < count:
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError(f"{len(self.alive())} of {count} Ray nodes came up")
                time.sleep(0.5)
            return self.alive()
        finally:
            ray.shutdown()

    def kill_raylet(self, proc: subprocess.Popen) -> int:
        (raylet,) = [p for p in _sessions(proc.pid) if _comm(p) == "raylet"]
        os.kill(raylet, signal.SIGKILL)
        return raylet

    def stop(self, proc: subprocess.Popen) -> None:
        """Stop a node: SIGTERM to its `ray start`, then SIGKILL whatever it left."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for pid in _sessions(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.wait(10)


def _node(cpus: float, gpus: float = 0.0, memory_gb: float = 8.0) -> dict:
    from mem1_core.training.placement import GIB

    resources = {"CPU": cpus, "GPU": gpus, "memory": memory_gb * GIB}
    return {"NodeID": "ab" * 28, "NodeManagerAddress": "10.0.0.2", "Resources": resources}


def test_what_a_cluster_lacks_is_named_with_the_setting_that_changes_it():
    from mem1_core.training.placement import fit_error, run_demands

    def demands(*overrides: str, retriever: bool = True):
        resources = load_config("smoke", overrides=list(overrides)).resources
        return run_demands(resources, retriever=retriever)

    assert fit_error(demands(), [_node(2), _node(1)]) is None
    assert fit_error(demands("resources.num_rollout_workers=2"), [_node(2), _node(1)]) == (
        "the Ray cluster cannot fit this run: it asks for 4 CPU (2 rollout workers x 1, "
        "learner 1, retriever 1) and the cluster has 3 over 2 nodes; lower "
        "resources.num_rollout_workers / resources.cpus_per_worker / resources.learner_cpus / "
        "retrieval.url (serve the index elsewhere), or add nodes"
    )
    # Enough GPUs in all, but the single learner wants two in one process.
    two = fit_error(demands("resources.learner_gpus=2"), [_node(4, 1), _node(4, 1)])
    assert two.startswith(
        "the Ray cluster cannot fit this run: learner asks for 1 CPU, 2 GPU in one process and "
        "no node has that much (the largest have 4 CPU, 1 GPU, 8 GiB memory); lower "
        "resources.learner_gpus"
    )
    big = fit_error(demands("resources.worker_memory_gb=10"), [_node(4), _node(4)])
    assert "rollout_worker_0 asks for 1 CPU, 10 GiB memory in one process" in big
    # 6.5 CPUs in all on two nodes of 3.25: no way to split 1.5 + 1.5 + 1.5 + 1 + 1.
    odd = demands("resources.num_rollout_workers=3", "resources.cpus_per_worker=1.5")
    assert "cannot be packed onto them" in fit_error(odd, [_node(3.25), _node(3.25)])
    assert fit_error(odd, [_node(3.5), _node(3.0)]) is None
    # FSDP ranks share the learner's GPUs, one each.
    fsdp = demands("resources.learner_strategy=fsdp", "resources.learner_gpus=2", retriever=False)
    assert [d.name for d in fsdp] == ["rollout_worker_0", "learner_rank_0", "learner_rank_1"]
    assert fit_error(fsdp, [_node(2, 1), _node(1, 1)]) is None


@pytest.fixture(scope="module")
def cluster():
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths
    c = LocalCluster(root)
    try:
        c.start("--num-cpus=3", "--num-gpus=1")
        c.wait_for(1)
        c.start("--num-cpus=1")
        head, second = sorted(c.wait_for(2), key=lambda n: n["Resources"].get("GPU", 0) == 0)
        c.head_id, c.second_id = head["NodeID"], second["NodeID"]
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for proc in reversed(c.nodes):
            c.stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def _rows(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def single_node(tmp_path_factory):
    """The metrics of the run on a private one-node Ray (no GPU asked: it has none)."""
    from mem1_core.training.train_rl import train_rl

    out = tmp_path_factory.mktemp("single") / "run"
    train_rl(load_config("smoke", overrides=OVERRIDES), out, show=False)
    return _rows(out)


def _same_metrics(rows: list[dict], want: list[dict]) -> None:
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in want]
    for got, ref in zip(rows, want, strict=True):
        for k in COMPARED:
            assert got[k] == pytest.approx(ref[k], rel=1e-5, abs=1e-7), (got["iteration"], k)


def _on_cluster(cluster: LocalCluster, *more: str):
    return load_config(
        "smoke", overrides=[*OVERRIDES, f"resources.ray_address={cluster.address}", *more]
    )


@pytest.mark.slow
def test_a_private_ray_is_private_beside_a_live_or_stale_cluster(cluster, monkeypatch):
    """Without resources.ray_address a run starts its own Ray, where a plain ray.init() would
    join the cluster `ray start` recorded (live here) or fail on a stale record; `auto`
    joins the recorded cluster on purpose."""
    from mem1_core.training.ray_start import start_ray

    resources = load_config("smoke").resources
    gone = cluster.root / "gone"  # short: Ray's socket paths
    (gone / "ray").mkdir(parents=True)
    (gone / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # a cluster long gone
    for tmpdir, address in ((cluster.root, None), (gone, "127.0.0.1:1")):
        monkeypatch.setenv("RAY_TMPDIR", str(tmpdir))
        if address:
            monkeypatch.setenv("RAY_ADDRESS", address)
        assert start_ray(resources) is True
        try:
            (node,) = cluster.alive()  # its own: one node, not the two of the cluster
            assert node["NodeID"] not in (cluster.head_id, cluster.second_id)
        finally:
            ray.shutdown()
    monkeypatch.setenv("RAY_TMPDIR", str(cluster.root))
    monkeypatch.delenv("RAY_ADDRESS")
    joined = load_config("smoke", overrides=["resources.ray_address=auto"]).resources
    assert start_ray(joined) is True
    try:
        assert {n["NodeID"] for n in cluster.alive()} == {cluster.head_id, cluster.second_id}
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_run_the_cluster_can_never_hold_fails_in_seconds(cluster, tmp_path):
    from mem1_core.training.placement import ClusterTooSmall
    from mem1_core.training.train_rl import train_rl

    cfg = _on_cluster(cluster, "resources.num_rollout_workers=3")  # 3 + learner + retriever
    t0 = time.monotonic()
    with pytest.raises(ClusterTooSmall) as e:
        train_rl(cfg, tmp_path / "run", show=False)
    seconds = time.monotonic() - t0
    message = str(e.value)
    assert "\n" not in message and "asks for 5 CPU" in message and "has 4 over 2 nodes" in message
    assert "resources.num_rollout_workers" in message
    assert seconds < 60, seconds  # data preparation and connecting included
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_busy_cluster_is_waited_for_with_a_line_then_given_up(cluster, monkeypatch, caplog):
    from mem1_core.runs.faults import RunStopped
    from mem1_core.training import placement

    monkeypatch.setattr(placement, "PROGRESS_EVERY_S", 1.0)
    resources = _on_cluster(cluster, "resources.wait_seconds=3").resources
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        other_job = ray.util.placement_group([{"CPU": 3}])  # the head's CPUs, held elsewhere
        assert other_job.wait(60)
        demands = placement.run_demands(resources, retriever=True)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING), pytest.raises(RunStopped) as e:
            placement.reserve(resources, demands)
        assert 3 <= time.monotonic() - t0 < 15
        assert re.match(
            r"the Ray cluster is busy: stopped after \d s for the rollout", str(e.value)
        )
        assert "free now: 1 of 4 CPU" in str(e.value) and "resources.wait_seconds" in str(e.value)
        waiting = r"waiting \d s of 3 for the rollout workers and the learner \(2 CPU\)"
        assert re.search(waiting, caplog.text)
        ray.util.remove_placement_group(other_job)
        free = placement.reserve(resources, demands)  # room again: placed at once
        free.remove()
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_the_run_directory_must_be_shared_by_every_node(cluster, tmp_path):
    """Checked by a file each node writes and the driver reads back; a node whose filesystem
    differs (here: a private mount over the run directory) stops the run in one line."""
    from mem1_core.training.placement import ClusterTooSmall, check_shared_storage

    run = tmp_path / "run"
    run.mkdir()
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    try:
        check_shared_storage([run], [cluster.head_id, cluster.second_id])
        assert list((run / ".shared-check").iterdir()) == []
    finally:
        ray.shutdown()
    private = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
    if shutil.which("unshare") is None or subprocess.run([*private, "true"]).returncode:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    node = cluster.start("--num-cpus=1", wrap=[*private, f"mount -t tmpfs tmpfs {run} && exec"])
    try:
        known = (cluster.head_id, cluster.second_id)
        (alone,) = [n["NodeID"] for n in cluster.wait_for(3) if n["NodeID"] not in known]
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        with pytest.raises(ClusterTooSmall, match=f"^the run directory {run} is not shared"):
            check_shared_storage([run], [alone])
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop(node)
        cluster.nodes.remove(node)


@pytest.mark.slow
def test_smoke_ppo_on_two_nodes_trains_as_on_one(cluster, single_node, tmp_path):
    from mem1_core.training.train_rl import train_rl

    out = tmp_path / "run"
    train_rl(_on_cluster(cluster, *ON_TWO_NODES), out, show=False)
    rows = _rows(out)
    nodes = rows[0]["actor_nodes"]
    assert nodes["learner"].endswith(cluster.head_id[:8])
    assert nodes["rollout_worker_0"].endswith(cluster.second_id[:8])
    _same_metrics(rows, single_node)


@pytest.mark.slow
def test_a_lost_node_loses_no_iteration(cluster, single_node, tmp_path):
    """The second node's raylet killed after the first iteration: its rollout worker
    restarts on the head (which has room), the iteration's share is redone with the same
    seed and weights, and the run ends with every iteration once and the metrics of an
    unbroken run. (Runs last: the cluster keeps one node.)"""
    from mem1_core.training.train_rl import train_rl

    out = tmp_path / "run"
    killed: dict[str, float] = {}

    def kill_after_first_iteration() -> None:
        while not (out / "metrics.jsonl").is_file() and "stop" not in killed:
            time.sleep(0.1)
        if "stop" not in killed:
            cluster.kill_raylet(cluster.nodes[1])
            killed["at"] = time.monotonic()

    watcher = threading.Thread(target=kill_after_first_iteration, daemon=True)
    watcher.start()
    try:
        result = train_rl(_on_cluster(cluster, *ON_TWO_NODES), out, show=False)
    finally:
        killed.setdefault("stop", 0.0)
        watcher.join(10)
    assert "at" in killed and result["iterations"] == 3
    rows = _rows(out)
    assert rows[0]["actor_nodes"]["rollout_worker_0"].endswith(cluster.second_id[:8])
    assert rows[-1]["actor_nodes"]["rollout_worker_0"].endswith(cluster.head_id[:8])
    _same_metrics(rows, single_node)
