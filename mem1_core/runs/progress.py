"""Progress of a long stage, for a person watching: what runs, how far it is, when it ends.

A stage makes a `Progress` and calls `update(done, **metrics)` as it goes (every SFT step,
PPO iteration, evaluation cell). Two outlets, each throttled so that neither floods:
- a file, `<run_dir>/progress.json`, rewritten atomically at most every `file_seconds`
  (1 s): the launcher reads it while it follows the run and draws the status line;
- the `mem1.progress` logger at most every `log_seconds` (20 s): Prefect ships it to the
  stage's flow-run logs (PREFECT_LOGGING_EXTRA_LOGGERS=mem1), a line per interval rather
  than per step.
The file goes where `MEM1_PROGRESS_FILE` points (the pipeline sets it to the run
directory's); without it only the logger speaks. A stage ends on its count, so
the estimate of what remains comes from the step fraction; a stage's minutes only cap it, and
when the cap is nearer, the estimate is the time to the cap.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from mem1_core.runs.atomic import write_text

ENV = "MEM1_PROGRESS_FILE"
log = logging.getLogger("mem1.progress")


def fmt_seconds(s: float | None) -> str:
    if s is None or s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class Progress:
    """`with Progress("sft", total=steps, budget_seconds=minutes * 60) as p: p.update(i, loss=…)`.

    `start`: the units a resumed stage finished before this attempt. They count toward the
    fraction done, not toward the pace: what remains is estimated from this attempt's units
    alone (a PPO run resumed at iteration 6 of 12, one iteration in, has 5 of its own pace
    left, not the 5/7 of its elapsed time that counting all 7 would say)."""

    def __init__(
        self,
        stage: str,
        *,
        total: int | None = None,
        start: int = 0,
        unit: str = "step",
        budget_seconds: float | None = None,
        file_seconds: float = 1.0,
        log_seconds: float = 20.0,
        path: str | Path | None = None,
    ):
        self.stage, self.total, self.unit = stage, total, unit
        self.budget = budget_seconds if budget_seconds and budget_seconds < 1e8 else None
        self.path = Path(path) if path else (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
        self.file_seconds, self.log_seconds = file_seconds, log_seconds
        self.t0 = time.perf_counter()
        self._file_at = self._log_at = -1e9
        self.start = self.done = start
        self.metrics: dict = {}
        self._emit(final=False)  # the stage is on screen from its first second

    def fraction(self) -> float | None:
        fr = [self.done / self.total] if self.total else []
        if self.budget:
            fr.append((time.perf_counter() - self.t0) / self.budget)
        return min(max(fr), 1.0) if fr else None

    def state(self, final: bool = False) -> dict:
        elapsed = time.perf_counter() - self.t0
        f = 1.0 if final else self.fraction()
        eta: float | None = 0.0
        if not final:
            own = self.done - self.start
            etas = [elapsed * (self.total - self.done) / own] if self.total and own > 0 else []
            if self.budget:
                etas.append(max(self.budget - elapsed, 0.0))
            # the count decides and no unit of this attempt has finished: the time budget
            # alone would read as an estimate ("~1:51:53 left" for a run of minutes)
            eta = None if self.total and own <= 0 else min(etas, default=None)
        return {
            "stage": self.stage,
            "done": self.done,
            "total": self.total,
            "unit": self.unit,
            "fraction": f,
            "elapsed_s": round(elapsed, 1),
            "eta_s": None if eta is None else round(eta, 1),
            "final": final,
            "metrics": self.metrics,
            "time": time.time(),
        }

    def update(self, done: int | None = None, **metrics) -> None:
        self.done = self.done + 1 if done is None else done
        self.metrics = {k: _short(v) for k, v in metrics.items()} or self.metrics
        self._emit(final=False)

    def _emit(self, final: bool) -> None:
        now = time.perf_counter()
        st = None
        if self.path is not None and (final or now - self._file_at >= self.file_seconds):
            st = self.state(final)
            write_text(json.dumps(st) + "\n", self.path)
            self._file_at = now
        if final or now - self._log_at >= self.log_seconds:
            log.info(line(st or self.state(final)))
            self._log_at = now

    def close(self) -> None:
        self._emit(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _short(v):
    return round(v, 4) if isinstance(v, float) else v


def line(st: dict) -> str:
    """`ppo (mem1): iteration 7 of 18 (39%) reward=0.83 · 1:02 elapsed, ~1:37 left`."""
    count = f"{st['unit']} {st['done']}" + (f" of {st['total']}" if st.get("total") else "")
    frac = f" ({st['fraction']:.0%})" if st.get("fraction") is not None else ""
    metrics = " ".join(f"{k}={v}" for k, v in (st.get("metrics") or {}).items())
    tail = "done" if st.get("final") else f"~{fmt_seconds(st.get('eta_s'))} left"
    return (
        f"{st['stage']}: {count}{frac} {metrics} · {fmt_seconds(st['elapsed_s'])} elapsed, {tail}"
    ).replace("  ", " ")


def read(path: str | Path) -> dict | None:
    """The latest progress state in `path`, or None (missing, or caught mid-replace)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
