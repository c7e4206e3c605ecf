"""What the fault benchmark holds beyond one fault: the Prefect server and disk_full's tmpfs
(`Harness`), the warm start and the template run directory every fault starts from
(`Context`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import PrefectServer
from benchmarks.faults.run import OVERRIDES, PY, RUN_TIMEOUT_S, env, run_to_exit, say
from deployments.processes import alive, descendants, stop_processes

WARM_START = ["sft.warm_start_minutes=2", "sft.warm_start_steps=200"]
"""Long enough that the smoke policy writes well-formed queries (a format error rate of
~0.2 after it, measured; 10 s of SFT leaves 1.0), so rollouts do reach the retriever."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
TMPFS_SIZE = "256m"
"""disk_full's small disk: a few smoke checkpoints."""


def interrupt(signum: int, _frame: Any) -> None:
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
        from mem1_core.domains.inputs import prepare

        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for name in ("world", "tokenizer"):
            if (init / name).is_dir():
                shutil.copytree(init / name, out / name)
        prepare(load_config("smoke", overrides=OVERRIDES), out)
    return out
