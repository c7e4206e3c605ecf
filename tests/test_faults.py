"""Faults a long run meets, the ones that fit CI's budget: a checkpoint that went
bad on disk, a full disk at a write, the retrieval server down for a moment or for good,
bad input files, and a rollout worker killed mid-rollout. benchmarks/faults/ injects all of
them (and the Prefect cancellations) into real Ray runs and measures recovery."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from mem1_core.config import ModelConfig, load_config
from mem1_core.models.model import build_tiny_model
from mem1_core.runs import atomic
from mem1_core.runs.faults import DiskFull
from mem1_core.training.checkpoint import (
    MANIFEST_FILE,
    CorruptCheckpoint,
    TrainState,
    checkpoint_problems,
    latest_intact_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)


def _policy(tokenizer, seed: int = 0):
    torch.manual_seed(seed)
    policy = build_tiny_model(TINY, tokenizer)
    return policy, {"policy": torch.optim.AdamW(policy.parameters(), lr=1e-2)}


def _save(root: Path, k: int, policy, opts) -> Path:
    return save_checkpoint(root, TrainState(k), policy=policy, optimizers=opts, config={"k": k})


def _flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- checkpoint checksums ----------------------------------------------------------------


def test_manifest_covers_every_file_and_names_a_truncated_one(small_tokenizer, tmp_path):
    policy, opts = _policy(small_tokenizer)
    ckpt = _save(tmp_path, 1, policy, opts)
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk - {MANIFEST_FILE}
    assert {"policy/model.safetensors", "optimizer.pt", "rng.pt", "state.json"} <= on_disk
    assert checkpoint_problems(ckpt) == []

    weights = ckpt / "policy" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    (problem,) = checkpoint_problems(ckpt)
    assert problem.startswith("policy/model.safetensors has") and "(truncated)" in problem
    other, other_opts = _policy(small_tokenizer, seed=1)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CorruptCheckpoint, match="policy/model.safetensors"):
        load_checkpoint(ckpt, policy=other, optimizers=other_opts)
    assert all(torch.equal(v, before[k]) for k, v in other.state_dict().items())  # untouched


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_which_file(
    small_tokenizer, tmp_path, caplog
):
    policy, opts = _policy(small_tokenizer)
    for k in (1, 2, 3):
        _save(tmp_path, k, policy, opts)
    _flip_byte(tmp_path / "iter_000003" / "optimizer.pt", at=100)  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.checkpoint"):
        good = latest_intact_checkpoint(tmp_path)
    assert good.name == "iter_000002"
    assert "optimizer.pt does not match its sha256" in caplog.text
    assert "iter_000003.corrupt" in caplog.text
    assert [p.name for p in list_checkpoints(tmp_path)] == ["iter_000001", "iter_000002"]
    assert (tmp_path / "iter_000003.corrupt" / "optimizer.pt").is_file()  # kept, set aside
    # the next save of iteration 3 is a fresh checkpoint, and the corrupt one stays aside
    _save(tmp_path, 3, policy, opts)
    assert latest_intact_checkpoint(tmp_path).name == "iter_000003"


def test_every_checkpoint_corrupt_is_an_error_not_a_fresh_start(small_tokenizer, tmp_path):
    policy, opts = _policy(small_tokenizer)
    ckpt = _save(tmp_path, 1, policy, opts)
    (ckpt / "rng.pt").unlink()
    with pytest.raises(CorruptCheckpoint, match="none of the 1 checkpoints"):
        latest_intact_checkpoint(tmp_path)
    assert latest_intact_checkpoint(tmp_path / "none") is None


def test_a_checkpoint_from_before_checksums_still_loads(small_tokenizer, tmp_path, caplog):
    policy, opts = _policy(small_tokenizer)
    ckpt = _save(tmp_path, 2, policy, opts)
    (ckpt / MANIFEST_FILE).unlink()
    other, other_opts = _policy(small_tokenizer, seed=1)
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.checkpoint"):
        assert latest_intact_checkpoint(tmp_path) == ckpt
        state = load_checkpoint(ckpt, policy=other, optimizers=other_opts)
    assert state.iteration == 2 and "loading it unverified" in caplog.text
    assert all(
        torch.equal(a, b) for a, b in zip(policy.parameters(), other.parameters(), strict=True)
    )


# ---- disk full ---------------------------------------------------------------------------


def test_a_full_disk_at_a_parquet_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = atomic.write_parquet(pa.table({"x": [1, 2]}), tmp_path / "t.parquet")

    def full(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half")  # what a write cut short leaves
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.pq, "write_table", full)
    with pytest.raises(
        DiskFull, match=r"no space left on the device of .* while writing t\.parquet"
    ):
        atomic.write_parquet(pa.table({"x": [3]}), path)
    assert pq.read_table(path)["x"].to_pylist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_a_full_disk_at_a_checkpoint_says_so_and_keeps_the_last_one(
    small_tokenizer, tmp_path, monkeypatch
):
    policy, opts = _policy(small_tokenizer)
    _save(tmp_path, 1, policy, opts)

    def full(*args, **kwargs):
        # torch.save's own report of ENOSPC, with the disk left next to empty
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(RuntimeError, match="unexpected pos"):  # space left: the error as it was
        _save(tmp_path, 2, policy, opts)
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(9, 9, 0))
    with pytest.raises(DiskFull, match="while writing iter_000002.*free some space"):
        _save(tmp_path, 2, policy, opts)
    assert [p.name for p in tmp_path.iterdir()] == ["iter_000001"]
    assert checkpoint_problems(tmp_path / "iter_000001") == []


# ---- the retrieval server down -----------------------------------------------------------


def _restartable_server(retriever, port: int):
    from mem1_core.retrieval.server import background_server, create_app

    return background_server(create_app(retriever), port=port)


def test_client_rides_out_a_short_outage_and_stops_on_a_long_one(small_index):
    from mem1_core.retrieval import HttpRetriever, RetrieverUnavailable

    with _restartable_server(small_index, 0) as url:
        port = int(url.rsplit(":", 1)[1])
        expected = HttpRetriever(url).search(["capital"], 2)
    # down now; back in 1.5 s on the same port
    outage_s = 1.5
    restart, served = threading.Event(), threading.Event()

    def come_back():
        time.sleep(outage_s)
        with _restartable_server(small_index, port):
            restart.set()
            served.wait(timeout=60)

    client = HttpRetriever(url, outage_s=30, backoff_s=0.05, max_backoff_s=0.2, timeout_s=5)
    thread = threading.Thread(target=come_back, daemon=True)
    t0 = time.monotonic()
    thread.start()
    assert client.search(["capital"], 2) == expected
    assert restart.is_set() and time.monotonic() - t0 >= outage_s - 0.1
    served.set()
    thread.join()

    short = HttpRetriever(url, outage_s=0.5, backoff_s=0.05, max_backoff_s=0.1, timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(RetrieverUnavailable, match=r"cannot connect.*gave up after 0\.\d s"):
        short.search(["capital"], 2)
    assert 0.5 <= time.monotonic() - t0 < 5


# ---- bad input: one line, the file, the fix; nothing written -----------------------------


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from mem1_core.cli.main import main

    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


def _train(out: Path, *extra: str) -> list[str]:
    return ["train", "ppo", "--profile", "smoke", "--out", str(out), "--no-ray", "--no-progress",
            *extra]  # fmt: skip


def _written(out: Path) -> list[str]:
    return sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.parts[len(out.parts)] in ("checkpoints", "trajectories", "eval", "metrics.jsonl")
        or p.name.endswith(".tmp")
    )


def test_bad_config_file_names_the_file_and_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo:\n  iteratons: 3\n")
    rc, err = _cli(_train(tmp_path / "run", "--config", str(bad)), capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: config file {bad}: unknown config field(s) ['iteratons'] in ppo")
    assert "did you mean 'iterations'?" in err
    bad.write_text("ppo:\n  iterations: many\n")
    rc, err = _cli(_train(tmp_path / "run", "--config", str(bad)), capsys)
    assert rc == 2 and err == f"error: config file {bad}: ppo.iterations: expected int, got 'many'"
    rc, err = _cli(_train(tmp_path / "run", "--set", "ppo.minutes=soon"), capsys)
    assert rc == 2 and err == "error: --set overrides: ppo.minutes: expected float, got 'soon'"
    assert not (tmp_path / "run").exists()


def test_policy_without_weights_is_refused_before_the_run_starts(tmp_path, capsys):
    policy = tmp_path / "sft" / "policy"
    policy.mkdir(parents=True)
    (policy / "config.json").write_text("{}")  # a save cut short before its weights
    rc, err = _cli(_train(tmp_path / "run", "--init", str(tmp_path / "sft")), capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{policy} holds no weights (no model.safetensors" in err
    assert "a checkpoint's policy/" in err
    assert not (tmp_path / "run").exists()


def test_task_file_missing_a_column_and_a_corrupt_index(tmp_path, capsys):
    from mem1_core.domains.inputs import prepare
    from mem1_core.domains.registry import domain_of
    from mem1_core.runs.layout import RunPaths

    cfg = load_config("smoke")
    out = tmp_path / "run"
    paths = prepare(cfg, out)
    tasks = paths.task_file("train", cfg.data.train_objectives)
    table = pq.read_table(tasks)
    pq.write_table(table.drop(["golden_answers"]), tasks)
    rc, err = _cli(_train(out), capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: {tasks} lacks the task column(s) ['golden_answers']")
    assert "mem1 compose" in err
    assert _written(out) == []
    pq.write_table(table, tasks)

    index = domain_of(cfg).ensure_index(cfg, RunPaths(out))
    data = next(index.glob("bm25s/data.*"))
    os.truncate(data, data.stat().st_size // 2)
    rc, err = _cli(["search", "--index", str(index), "capital"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"{data.relative_to(index)} has" in err and "rebuild it with `mem1 index" in err
    (index / "manifest.json").write_text("{not json")
    rc, err = _cli(["serve-retriever", "--index", str(index)], capsys)
    assert rc == 2 and "manifest.json is corrupt" in err and "mem1 index" in err
    # a training run rebuilds an index it finds corrupt instead of failing in a Ray actor
    assert domain_of(cfg).ensure_index(cfg, RunPaths(out)) == index
    assert json.loads((index / "manifest.json").read_text())["file_bytes"]


# ---- a real run: full disk, then a corrupt checkpoint; resumed to completion -------------

ITERATIONS = 3
OVERRIDES = [
    f"ppo.iterations={ITERATIONS}",
    "ppo.minutes=60",
    "ppo.checkpoint_every=1",
    "ppo.tasks_per_iteration=2",
    "ppo.minibatch_size=2",
    "ppo.micro_batch_size=2",
    "rollout.gen_tokens_base=8",
    "rollout.gen_tokens_per_objective=2",
    "data.max_eval_tasks=1",
    "data.eval_objectives=[2]",
]


def _metrics_iterations(out: Path) -> list[int]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["iteration"] for x in lines]


@pytest.mark.slow
def test_full_disk_then_corrupt_checkpoint_resume_loses_and_repeats_nothing(
    tmp_path, monkeypatch, capsys, caplog
):
    from mem1_core.trajectory import record

    monkeypatch.setenv("WANDB_MODE", "disabled")
    out = tmp_path / "run"
    argv = _train(out, *[a for o in OVERRIDES for a in ("--set", o)])
    real = record.atomic.write_parquet

    def full_at_iteration_2(table, path):
        if Path(path).parent.name == "trajectories" and Path(path).name == "iter_000002.parquet":
            raise DiskFull(errno.ENOSPC, f"no space left on the device of {Path(path).parent}")
        return real(table, path)

    monkeypatch.setattr(record.atomic, "write_parquet", full_at_iteration_2)
    rc, err = _cli(argv, capsys)
    assert rc == 1, err
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert "training stopped: no space left" in line and "--resume" in line
    assert "checkpoint iter_000002" in line
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == [
        "iter_000000.parquet",
        "iter_000001.parquet",
    ]
    assert _metrics_iterations(out) == [0, 1]
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["iter_000001", "iter_000002"]
    assert all(checkpoint_problems(p) == [] for p in list_checkpoints(out / "checkpoints"))
    monkeypatch.setattr(record.atomic, "write_parquet", real)  # space freed

    # meanwhile the newest checkpoint went bad on disk
    weights = out / "checkpoints" / "iter_000002" / "policy" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 10)
    part1 = (out / "trajectories" / "iter_000001.parquet").stat()
    with caplog.at_level(logging.WARNING, logger="mem1_core.training.checkpoint"):
        rc, err = _cli([*argv, "--resume"], capsys)
    assert rc == 0, err
    assert "policy/model.safetensors has" in caplog.text and "(truncated)" in caplog.text
    assert (out / "checkpoints" / "iter_000002.corrupt").is_dir()
    assert _metrics_iterations(out) == list(range(ITERATIONS))
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == [
        f"iter_{i:06d}.parquet" for i in range(ITERATIONS)
    ]
    # iteration 1 came after checkpoint iter_000001: redone, not kept twice (written anew: a
    # later mtime; the inode alone can be the freed one reused)
    assert (out / "trajectories" / "iter_000001.parquet").stat().st_mtime_ns > part1.st_mtime_ns
    assert all(checkpoint_problems(p) == [] for p in list_checkpoints(out / "checkpoints"))
    assert not list(out.rglob("*.tmp"))


# ---- a rollout worker killed mid-rollout (Ray) -------------------------------------------


def _gen_ids(trajs) -> list[list[list[int]]]:
    return [[t.gen_ids for t in x.turns] for x in trajs]


@pytest.mark.slow
def test_a_killed_rollout_worker_is_restarted_and_its_share_redone(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from mem1_core.domains.inputs import load_tasks, prepare
    from mem1_core.training.actor_start import start_runtime

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    cfg = load_config("smoke", overrides=OVERRIDES)
    paths = prepare(cfg, tmp_path / "run")
    tasks = load_tasks(cfg, paths, "train", 2)[:2]
    runtime = start_runtime(cfg, paths, init=None)
    try:
        runtime.sync_weights()
        expected = runtime.rollout(tasks, seed=5)
        pid = ray.get(runtime.workers[0].pid.remote())
        result: dict = {}
        thread = threading.Thread(target=lambda: result.update(t=runtime.rollout(tasks, seed=5)))
        thread.start()
        deadline = time.monotonic() + 60
        while b"RolloutWorker.rollout" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the worker never started the rollout"
            time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        thread.join(timeout=300)
        assert _gen_ids(result["t"]) == _gen_ids(expected)
        new_pid = ray.get(runtime.workers[0].pid.remote())
        assert new_pid != pid
        # killed between calls: the restarted worker is out of date, found and revived
        os.kill(new_pid, signal.SIGKILL)
        time.sleep(0.5)
        assert _gen_ids(runtime.rollout(tasks, seed=5)) == _gen_ids(expected)
    finally:
        runtime.shutdown()


# ---- the fault benchmark itself, stopped ---------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow
def test_the_fault_benchmark_stopped_by_sigterm_leaves_nothing_behind(tmp_path):
    """The fault benchmark (`python -m benchmarks.faults`) stopped by SIGTERM (as `timeout`
    stops it) mid-run, with the SFT warm start training, the Prefect server it started up and
    (as root) disk_full's tmpfs mounted: it exits 130, no process it started is left, and
    nothing stays mounted."""
    import subprocess
    import sys

    from deployments.processes import alive, descendants

    root = Path(__file__).resolve().parents[1]
    work, log = tmp_path / "work", tmp_path / "faults.log"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # its own server
    cmd = [sys.executable, "-m", "benchmarks.faults", "--work", str(work)]
    cmd += ["--only", "disk_full", "flow_cancel"]
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env | {"OMP_NUM_THREADS": "1"}, stdout=sink, stderr=sink
        )
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not any("train sft" in _cmdline(p) for p in descendants(proc.pid)):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no SFT warm start within 300 s"
            time.sleep(0.5)
        time.sleep(2)  # the SFT child under way
        tree = [p for p in descendants(proc.pid) if alive(p)]
        titles = [_cmdline(p) for p in tree]
        assert any("prefect server start" in t for t in titles), titles
        said = log.read_text()
        as_root = "mounted a" in said
        assert as_root or "no tmpfs at" in said, said[-3000:]
        assert os.path.ismount(work / "tmpfs") == as_root

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
        assert "interrupted (signal 15)" in log.read_text()
        assert [(p, _cmdline(p)) for p in tree if alive(p)] == []
        # nothing started later either: no process anywhere still works in the work dir
        stray = [
            (int(d.name), _cmdline(int(d.name)))
            for d in Path("/proc").iterdir()
            if d.name.isdigit() and str(work) in _cmdline(int(d.name)) and alive(int(d.name))
        ]
        assert stray == []
        assert not os.path.ismount(work / "tmpfs")
    finally:
        for p in [proc.pid, *tree]:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        if os.path.ismount(work / "tmpfs"):
            subprocess.run(["umount", "-l", str(work / "tmpfs")], check=False)
