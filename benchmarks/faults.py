"""Faults a long run meets (issue 18), each injected into a real short run on this machine;
one JSON line per fault.

    .venv/bin/python benchmarks/faults.py [--only FAULT ...] [--work DIR] [--init POLICY]

Every fault runs `mem1 train ppo --profile smoke` through Ray (ITERATIONS iterations of 4
tasks, a checkpoint after each) in a child process, from a warm start that queries the
retriever (2 minutes of SFT, trained once into --work unless --init names one), and
injects its fault at a moment it watches for (a process title, a file):

  worker_kill          SIGKILL of the rollout worker's process during its rollout
  learner_kill         SIGKILL of the learner's process during its update
  retriever_restart    the HTTP retrieval server (`mem1 serve-retriever`) SIGKILLed during a
                       rollout and started again OUTAGE_S later
  retriever_down       the same server killed and left down past retrieval.outage_seconds
  checkpoint_truncated the newest checkpoint's weights cut short on disk, then --resume
  checkpoint_bitflip   one byte of the newest checkpoint's optimiser state flipped, then --resume
  disk_full            the run directory on a small tmpfs (needs root), filled after its
                       first checkpoint (the run paused meanwhile) to half a checkpoint's
                       room, so that its next checkpoint or Parquet write fails; freed, --resume
  flow_cancel          the `train-ppo` flow, served by a Prefect runner, cancelled through the
                       API during PPO; every process it started must stop; rerun with resume
  launcher_sigterm     SIGTERM to `deployments/launch.py` running the smoke pipeline
                       (mem1/train-eval) during its PPO stage; every process gone; relaunched

A fault the run survives in-process must leave it completing on its own; one it cannot
survive must stop it with exit code 1 and a one-line `error: ...`, after which
`--resume` (or the rerun) completes it. Either way the final run must hold every
iteration exactly once: `lost_iterations` and `duplicated_iterations` count the
iterations missing from, or repeated in, metrics.jsonl and trajectories/.
`seconds_to_recover`: from the fault until the run had again finished the iteration it
was in (through the resume, where there is one). The Prefect faults need a server:
PREFECT_API_URL, or one this script starts on a free port and stops.

Stopped by SIGTERM, SIGINT (Ctrl-C) or SIGHUP, the script stops every process it started
(training runs, servers, runners, the launcher) and unmounts its tmpfs, then exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout

from benchmarks.common import (  # noqa: E402
    ROOT,
    PrefectServer,
    free_port,
    retriever_command,
    wait_for_retriever,
    wait_until,
)
from benchmarks.serve_ppo_stage import DEPLOYMENT_NAME  # noqa: E402
from deployments.processes import (  # noqa: E402
    alive,
    descendants,
    stop_process_tree,
    stop_processes,
)

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
WARM_START = ["sft.warm_start_minutes=2", "sft.warm_start_steps=200"]
"""Long enough that the smoke policy writes well-formed queries (a format error rate of
~0.2 after it, measured; 10 s of SFT leaves 1.0), so rollouts do reach the retriever."""
OUTAGE_S = 5.0
"""How long `retriever_restart` keeps the server down (a restart takes about this)."""
SHORT_PATIENCE_S = 5.0
"""`retriever_down`: retrieval.outage_seconds, so the run gives up quickly."""
RUN_TIMEOUT_S = 1200.0
"""Longest wait for one training process (a loaded 2-core machine is slow to start Ray)."""
STOP_TIMEOUT_S = 60.0
"""Longest wait for the processes of a cancelled run to go."""
RAY_START_FAILED = "The current node timed out during startup"
RAY_START_TRIES = 3
"""A run whose private Ray did not start (its raylet gives the node's agents 30 s to come
up, too short on a loaded 2-core machine) is started again, up to this many times."""


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


# ---- the faults ------------------------------------------------------------------------------


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TMPFS_SIZE = "256m"
"""disk_full's small disk: a few smoke checkpoints."""


def _interrupt(signum: int, _frame: Any) -> None:
    # A second signal must not cut the clean-up short (launch.py does the same).
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


class Harness:
    """What this script holds beyond one fault: the Prefect server the Prefect faults share
    and disk_full's tmpfs, made once, on demand. `close` stops every process still under
    this one (each in its process group: the server and the runners have sessions of their
    own), then the server, then unmounts the tmpfs; main calls it however it ends, SIGTERM,
    SIGINT and SIGHUP included."""

    def __init__(self, work: Path):
        self.work = work
        self.server: PrefectServer | None = None
        self.mount_point = work / "tmpfs"
        self.mounted = False
        self.mount_error = ""

    def prefect_server(self) -> PrefectServer:
        """The server at PREFECT_API_URL, or one started here (before prefect is imported:
        it reads PREFECT_API_URL once)."""
        if self.server is None:
            self.server = PrefectServer(self.work, env()).__enter__()
            say(f"Prefect server at {self.server.api}")
        return self.server

    def tmpfs(self) -> Path | None:
        """A TMPFS_SIZE tmpfs mounted at work/tmpfs (needs root), or None (`mount_error`
        says why). One a killed run left there is unmounted first."""
        if not self.mounted and not self.mount_error:
            self.mount_point.mkdir(exist_ok=True)
            if os.path.ismount(self.mount_point):
                _umount(self.mount_point)
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(self.mount_point)],
                capture_output=True, text=True,
            )  # fmt: skip
            self.mounted = done.returncode == 0
            self.mount_error = "" if self.mounted else (done.stderr.strip() or "mount failed")
            if self.mounted:
                say(f"mounted a {TMPFS_SIZE} tmpfs at {self.mount_point}")
            else:
                say(f"no tmpfs at {self.mount_point}: {self.mount_error}")
        return self.mount_point if self.mounted else None

    def close(self) -> None:
        left = [p for p in descendants(os.getpid()) if alive(p)]
        if left:
            say(f"stopping {len(left)} processes still running under this one")
            stop_processes(left)
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.mounted:
            _umount(self.mount_point)
            self.mounted = False


def _umount(point: Path) -> None:
    """Unmount `point`, waiting out a moment of `target is busy` (a killed process's files
    closing); lazily as a last resort, so the next run never finds it mounted."""
    for _ in range(20):
        if subprocess.run(["umount", str(point)], capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["umount", "-l", str(point)], check=False)


@dataclass
class Context:
    work: Path
    init: Path
    template: Path
    """A run directory with the world, tasks, tokenizer and index built (copied per fault)."""
    harness: Harness

    def run_dir(self, name: str) -> Path:
        out = self.work / name
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(self.template, out)
        return out


def _kill_actor_during(ctx: Context, fault: str, actor: str, method: str) -> dict[str, Any]:
    out = ctx.run_dir(fault)
    run = Train(out, ctx.init).start()
    try:
        run.until_first_iteration()
        prefix = f"ray::{actor}.{method}"
        pid = wait_until(
            prefix, lambda: find_process(run.proc.pid, prefix), RUN_TIMEOUT_S, run.proc
        )
        at = len(metrics_iterations(out))
        os.kill(pid, signal.SIGKILL)
        say(f"{fault}: killed {prefix} (pid {pid}) in iteration {at}")
        recovery = Recovery(out, at)
        rc = run.wait()
        if rc == 0:
            return result(fault, True, out, recovery.seconds(),
                          f"pid {pid} killed in iteration {at}; the run went on in-process "
                          "(the worker was restarted and its share redone)", run)  # fmt: skip
        stop = run.error_line()
        rc2 = run.resume_to_end()
        return result(fault, rc == 1 and bool(stop) and rc2 == 0, out, recovery.seconds(),
                      f"pid {pid} killed in iteration {at}; exit {rc} with `{stop[:160]}`; "
                      f"--resume exit {rc2}", run)  # fmt: skip
    finally:
        run.kill()


def worker_kill(ctx: Context) -> dict[str, Any]:
    return _kill_actor_during(ctx, "worker_kill", "RolloutWorker", "rollout")


def learner_kill(ctx: Context) -> dict[str, Any]:
    return _kill_actor_during(ctx, "learner_kill", "Learner", "update")


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


_finished: dict[str, Path] = {}


def _finished_run(ctx: Context) -> Path:
    """One run trained to the end, copied for each checkpoint fault."""
    if "run" not in _finished:
        out = ctx.run_dir("finished")
        run = Train(out, ctx.init)
        try:
            rc = run.run_to_end()
        finally:
            run.kill()
        if rc != 0:
            raise RuntimeError(f"the reference run failed ({rc}); see {out}.run.log")
        _finished["run"] = out
    return _finished["run"]


def _checkpoint_fault(ctx: Context, fault: str, damage: Callable[[Path], str]) -> dict[str, Any]:
    out = ctx.work / fault
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(_finished_run(ctx), out)
    for log in out.parent.glob(f"{out.name}.*.log"):
        log.unlink()
    newest = max((out / "checkpoints").glob("iter_*"))
    what = damage(newest)
    run = Train(out, ctx.init)
    recovery = Recovery(out, ITERATIONS - 1)
    try:
        rc = run.resume_to_end()
    finally:
        run.kill()
    warned = [x for x in run.all_logs().splitlines() if "is corrupt" in x]
    aside = (newest.parent / f"{newest.name}.corrupt").is_dir()
    return result(fault, rc == 0 and bool(warned) and aside, out, recovery.seconds(),
                  f"{what}; --resume exit {rc}, warned `{(warned or [''])[0][:220]}`; moved aside: "
                  f"{aside}", run)  # fmt: skip


def checkpoint_truncated(ctx: Context) -> dict[str, Any]:
    def cut(ckpt: Path) -> str:
        weights = ckpt / "policy" / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 2)
        return f"{ckpt.name}/policy/model.safetensors cut to half"

    return _checkpoint_fault(ctx, "checkpoint_truncated", cut)


def checkpoint_bitflip(ctx: Context) -> dict[str, Any]:
    def flip(ckpt: Path) -> str:
        path = ckpt / "optimizer.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        return f"one bit of {ckpt.name}/optimizer.pt flipped"

    return _checkpoint_fault(ctx, "checkpoint_bitflip", flip)


def _fill(mount: Path, leave: int) -> int:
    """Reserve all of `mount`'s free space but `leave` bytes in a ballast file (fallocate: no
    write that could race another); -> the free bytes left. The run must be stopped."""
    ballast = mount / "ballast"
    size = max(shutil.disk_usage(mount).free - leave, 0)
    with open(ballast, "wb") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, size)
        except OSError as e:  # what is there is all we can have; still a full disk
            say(f"disk_full: the ballast got {ballast.stat().st_size} of {size} bytes ({e})")
    return shutil.disk_usage(mount).free


def _staged_bytes(checkpoints: Path) -> int:
    """Bytes of a checkpoint being written now (its staging directory `.iter_*.tmp`)."""
    return sum(
        p.stat().st_size
        for d in checkpoints.glob(".iter_*.tmp")
        for p in d.rglob("*")
        if p.is_file()
    )


def disk_full(ctx: Context) -> dict[str, Any]:
    """The disk fills between two checkpoints. Deterministic: the run's whole process tree is
    stopped (SIGSTOP) while the ballast takes all free space but half a checkpoint, less what
    a checkpoint in progress already staged, so the run's next checkpoint (or an earlier
    Parquet write) is what fails, never the harness's own write."""
    from mem1_core.runs.checkpoint import checkpoint_problems, list_checkpoints

    mount = ctx.harness.tmpfs()
    if mount is None:
        return result("disk_full", False, None, None,
                      f"not run: a tmpfs needs root ({ctx.harness.mount_error[:120]}); the CI "
                      "test injects ENOSPC instead")  # fmt: skip
    out, run = mount / "run", None
    try:
        shutil.rmtree(out, ignore_errors=True)
        (mount / "ballast").unlink(missing_ok=True)
        shutil.copytree(ctx.template, out)
        run = Train(out, ctx.init, log_dir=ctx.work).start()  # logs off the full disk
        run.until_first_iteration()
        wait_until("checkpoint 1", lambda: list_checkpoints(out / "checkpoints"), RUN_TIMEOUT_S,
                   run.proc)  # fmt: skip
        ckpt_bytes = sum(
            p.stat().st_size
            for p in list_checkpoints(out / "checkpoints")[0].rglob("*")
            if p.is_file()
        )
        tree = [run.proc.pid, *descendants(run.proc.pid)]
        _signal_all(tree, signal.SIGSTOP)
        try:
            at = len(metrics_iterations(out))
            staged = _staged_bytes(out / "checkpoints")
            free = _fill(mount, max(ckpt_bytes // 2 - staged, 0))
        finally:
            _signal_all(tree, signal.SIGCONT)
        say(f"disk_full: {free} bytes left in iteration {at}, a checkpoint is {ckpt_bytes} "
            f"({staged} of the next staged)")  # fmt: skip
        recovery = Recovery(out, at)
        rc = run.wait()
        stop = run.error_line()
        ckpts = list_checkpoints(out / "checkpoints")
        intact = all(checkpoint_problems(p) == [] for p in ckpts)
        leftovers = [p.name for p in out.rglob("*.tmp")]
        rows = metrics_iterations(out)
        (mount / "ballast").unlink()
        rc2 = run.resume_to_end()
        ok = rc == 1 and "no space left" in stop and intact and rc2 == 0
        return result("disk_full", ok, out, recovery.seconds(),
                      f"tmpfs filled in iteration {at} ({free} bytes left, half a checkpoint); "
                      f"exit {rc} with `{stop[:200]}`; the {len(ckpts)} checkpoints verified "
                      f"intact: {intact}, metrics rows {rows}, temporaries left: {leftovers}; "
                      f"space freed, --resume exit {rc2}", run)  # fmt: skip
    finally:
        if run is not None:
            run.kill()
        # a copy of the run, for the record (the mount goes with the harness)
        if out.exists():
            shutil.copytree(out, ctx.work / "disk_full", dirs_exist_ok=True)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# ---- Prefect: a flow run cancelled, the launcher stopped -------------------------------------


def _stopped_within(
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
        stop_s, left = _stopped_within(tree)
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
        stop_s, left = _stopped_within(tree, since=t_signal)
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


FAULTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "worker_kill": worker_kill,
    "learner_kill": learner_kill,
    "retriever_restart": retriever_restart,
    "retriever_down": retriever_down,
    "checkpoint_truncated": checkpoint_truncated,
    "checkpoint_bitflip": checkpoint_bitflip,
    "disk_full": disk_full,
    "flow_cancel": flow_cancel,
    "launcher_sigterm": launcher_sigterm,
}


# ---- setup and main --------------------------------------------------------------------------


def warm_start(work: Path) -> Path:
    out = work / "warm_start"
    if (out / "policy" / "model.safetensors").is_file():
        return out
    say("training the warm start (2 minutes of SFT)")
    sets = [a for o in WARM_START for a in ("--set", o)]
    cmd = [PY, "-m", "mem1_core.cli.main", "train", "sft", "--warm-start", "--profile", "smoke",
           "--out", str(out), *sets]  # fmt: skip
    rc = run_to_exit(cmd, work / "warm_start.log", RUN_TIMEOUT_S)
    if rc != 0:
        raise RuntimeError(f"the warm start failed ({rc}); see {work / 'warm_start.log'}")
    return out


def template(work: Path, init: Path) -> Path:
    """The assets every fault's run starts from: the warm start's world and tokenizer, and
    the PPO run's tasks and index (`prepare`), built once."""
    out = work / "template"
    if not (out / "indexes").is_dir():
        from mem1_core.config import load_config
        from mem1_core.rollout.inputs import prepare

        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name in ("world", "tokenizer"):
            if (init / name).is_dir():
                shutil.copytree(init / name, out / name)
        prepare(load_config("smoke", overrides=OVERRIDES), out)
    return out


PREFECT_FAULTS = ("flow_cancel", "launcher_sigterm")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=sorted(FAULTS), help="run these faults only")
    p.add_argument("--work", help="working directory (default: a new temporary one, kept)")
    p.add_argument("--init", help="a warm-start policy (default: trained into --work first)")
    args = p.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="mem1-faults-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say(f"working in {work}")
    names = args.only or list(FAULTS)
    # Explicit handlers, as deployments/launch.py has: `timeout` (SIGTERM), a closed terminal
    # (SIGHUP) and Ctrl-C all end in Harness.close, so no child outlives this script.
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)
    harness = Harness(work)
    try:
        # What the selected faults need from the machine comes first, beside the warm start's
        # minutes: the Prefect server starts, and a tmpfs that cannot be mounted says so now.
        if set(names) & set(PREFECT_FAULTS):
            harness.prefect_server()
        if "disk_full" in names:
            harness.tmpfs()
        init = Path(args.init).resolve() if args.init else warm_start(work)
        ctx = Context(work, init, template(work, init), harness)
        return 1 if run_faults(ctx, names) else 0
    except KeyboardInterrupt as e:
        say(f"interrupted ({e}): stopping every process this script started")
        return 130
    finally:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        harness.close()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)


def run_faults(ctx: Context, names: list[str]) -> int:
    failed = 0
    for name in names:
        t0 = time.monotonic()
        try:
            line = FAULTS[name](ctx)
        except Exception as e:  # noqa: BLE001 - one fault's harness failure is that fault's row
            line = result(name, False, None, None, f"harness error: {type(e).__name__}: {e}")
        line["note"] += f" [{time.monotonic() - t0:.0f} s]"
        failed += not line["survived"]
        print(json.dumps(line), flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
