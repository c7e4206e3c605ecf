"""benchmarks/ablation.py reads PPO runs' metrics.jsonl (the trainer's schema) and sets them
side by side: cumulative optimiser steps, minutes, the held-out evaluations with their
standard errors, a plot. Checked on a run's rows written as the trainer writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def ablation():
    return load_benchmark("ablation")


def _run(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


ROWS = [
    {"iteration": 0, "reward": 0.4, "kl": 0.0, "elapsed_seconds": 60.0,
     "train/optimizer_steps": 2, "estimator": "gae"},
    {"iteration": 1, "reward": 0.5, "kl": 0.02, "elapsed_seconds": 120.0,
     "train/optimizer_steps": 2, "estimator": "gae", "eval/reward": 0.5, "eval/em_frac_se": 0.1,
     "eval/n8/reward": 0.05, "eval/n8/em_frac_se": 0.03},
    {"iteration": 2, "reward": 0.3, "kl": 0.05, "elapsed_seconds": 200.0,
     "train/optimizer_steps": 1, "estimator": "gae", "eval/reward": 0.25, "eval/em_frac_se": 0.08,
     "eval/n8/reward": 0.0, "eval/n8/em_frac_se": None, "stopped_by": "count"},
]  # fmt: skip


def test_runs_side_by_side(ablation, tmp_path, capsys):
    a = _run(tmp_path, "a", ROWS)
    b = _run(tmp_path, "b", ROWS[:2])
    png = tmp_path / "ablation.png"
    assert ablation.main([f"GAE lr=1e-5={a}", f"short={b}", "--out", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GAE lr=1e-5: 3 iterations") and "\nshort: 2 iterations" in out
    # steps accumulate over iterations (metrics.jsonl counts them per iteration)
    rows = ablation.read_run(a)
    assert [r["steps"] for r in rows] == [2, 4, 5]
    assert [r["minutes"] for r in rows] == pytest.approx([1.0, 2.0, 200 / 60])
    held = ablation.held_out(rows)
    assert list(held) == ["eval/reward", "eval/n8/reward"]  # the training N first
    assert [(r["iteration"], em, se) for r, em, se in held["eval/reward"]] == [
        (1, 0.5, 0.1), (2, 0.25, 0.08)
    ]  # fmt: skip
    text = "\n".join(ablation.summary("GAE", rows))
    assert "3 iterations, 5 optimiser steps, 3.3 min (gae)" in text
    assert "sampled reward 0.400 -> 0.400" in text  # fewer than 4: all of them, both ways
    assert "KL to the start at most 0.050" in text
    assert "it 2: 0.500 ± 0.100, it 3: 0.250 ± 0.080" in text
    assert "N=8: it 2: 0.050 ± 0.030, it 3: 0.000" in text
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


def test_bad_arguments_say_what_is_wrong(ablation, tmp_path):
    with pytest.raises(SystemExit, match="NAME=RUN_DIR"):
        ablation.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        ablation.main([f"x={tmp_path}"])
    run = _run(tmp_path, "r", ROWS)
    with pytest.raises(SystemExit, match="share a name"):
        ablation.main([f"x={run}", f"x={run}"])
