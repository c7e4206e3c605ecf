"""Each stage's wall time in an experiment run (`walls.json`), across the attempts it took.

An experiment outlives its processes: a session ends, a laptop sleeps, a worker is killed,
and the next attempt resumes the stage (a PPO arm at its newest checkpoint, an evaluation at
its first unplayed cell). The iterations and cells the stopped attempt finished are not done
again, so its time belongs to the stage as much as the resumed attempt's. While a stage runs,
a heartbeat thread stamps `walls.open.json` (the stage, when the attempt started, when it was
last alive); the next attempt of any stage finds the stamp a killed process left and adds
that attempt's time, to its last heartbeat, to the stage. The stopped attempt's unfinished
unit (at most one iteration or cell, played again) is counted twice: the figure is the wall a
person waited, within one unit of what an uninterrupted run would take.

    walls = StageWalls(run_dir)
    with walls.stage("ppo-mem1 · seed 0"):
        train(...)
    walls.read()   # {"warm start": 512.3, "ppo-mem1 · seed 0": 1710.0, ...}
    walls.cpus()   # {"warm start": ["AMD EPYC (x86_64, 2 cores; avx2 avx512f avx512_bf16)"], ...}

A stage an experiment links from a finished run (`--reuse`, mem1_core.experiment.plan.link_reused)
keeps the wall it took there: `adopt` copies it, with its CPUs, and `reused()` says which run
it came from, so a run's table is what the whole experiment cost.

A figure is only a figure with its machine: the same stage ran 1.8-2.3x faster on one day's
CPU than another's, and bf16 compute is 2.5x float32 on one CPU and 1/200 on another. So
walls.json keeps, under the reserved key `cpus`, each stage's CPUs (one per machine its
attempts ran on, mem1_core.models.compute.cpu_info).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mem1_core.models.compute import cpu_info
from mem1_core.runs.atomic import write_json

WALLS_FILE = "walls.json"
OPEN_FILE = "walls.open.json"
CPUS_KEY = "cpus"
"""walls.json's reserved key: stage -> the CPUs its attempts ran on."""
REUSED_KEY = "reused"
"""walls.json's reserved key: stage -> the run directory it was trained in (a linked stage)."""
RESERVED = (CPUS_KEY, REUSED_KEY)
HEARTBEAT_SECONDS = 15.0


class StageWalls:
    """`walls.json` under `run_dir`: stage -> seconds, summed over the attempts that ran it."""

    def __init__(self, run_dir: str | Path, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.dir = Path(run_dir)
        self.path, self.open_path = self.dir / WALLS_FILE, self.dir / OPEN_FILE
        self.heartbeat = heartbeat_seconds

    def _raw(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def read(self) -> dict[str, float]:
        """Stage -> seconds."""
        return {k: v for k, v in self._raw().items() if k not in RESERVED}

    def cpus(self) -> dict[str, list[str]]:
        """Stage -> the CPUs its attempts ran on (each once)."""
        return self._raw().get(CPUS_KEY, {})

    def reused(self) -> dict[str, str]:
        """Stage -> the run directory it was trained in, for each stage linked from another."""
        return self._raw().get(REUSED_KEY, {})

    def adopt(self, source: str | Path, stages: list[str]) -> list[str]:
        """Copy `stages`' walls and CPUs from the run `source` (stages this run links from it,
        not trained here) -> those it had a wall for. A stage this run has timed keeps its own."""
        theirs = StageWalls(source)
        walls, cpus = theirs.read(), theirs.cpus()
        mine = self._raw()
        got = [st for st in stages if st in walls and st not in mine]
        for st in got:
            mine[st] = walls[st]
            mine.setdefault(CPUS_KEY, {})[st] = list(cpus.get(st, []))
            mine.setdefault(REUSED_KEY, {})[st] = str(Path(source))
        if got:
            self._write(mine)
        return got

    def _write(self, walls: dict) -> None:
        for key in RESERVED:  # last, after the stages
            if key in walls:
                walls[key] = walls.pop(key)
        write_json(walls, self.path)

    def _add(self, stage: str, seconds: float, cpu: str | None = None) -> None:
        walls = self._raw()
        walls[stage] = round(walls.get(stage, 0.0) + max(0.0, seconds), 1)
        cpus = walls.setdefault(CPUS_KEY, {}).setdefault(stage, [])
        if cpu and cpu not in cpus:
            cpus.append(cpu)
        self._write(walls)

    def settle(self) -> str | None:
        """Fold a stopped attempt's time (the stamp a killed process left) into its stage.
        -> that stage, or None when no attempt was left open."""
        if not self.open_path.is_file():
            return None
        try:
            stamp = json.loads(self.open_path.read_text())
            stage, seconds = stamp["stage"], float(stamp["alive"]) - float(stamp["started"])
        except (ValueError, KeyError, TypeError):  # a stamp cut short: its time is lost
            self.open_path.unlink(missing_ok=True)
            return None
        self._add(stage, seconds, stamp.get("cpu"))
        self.open_path.unlink(missing_ok=True)
        return stage

    def _stamp(self, stage: str, started: float) -> None:
        write_json(
            {"stage": stage, "started": started, "alive": time.time(), "cpu": _cpu()},
            self.open_path,
        )

    @contextmanager
    def stage(self, stage: str, *, count: bool = True) -> Iterator[None]:
        """Time the block as `stage`; `count=False` (a stage found finished) adds nothing.
        An exception ends the attempt as a kill would: its time so far is added."""
        self.settle()
        if not count:
            yield
            return
        started = time.time()
        self._stamp(stage, started)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                self._stamp(stage, started)

        thread = threading.Thread(target=beat, name=f"walls: {stage}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self._add(stage, time.time() - started, _cpu())
            self.open_path.unlink(missing_ok=True)


def _cpu() -> str:
    return cpu_info().describe()
