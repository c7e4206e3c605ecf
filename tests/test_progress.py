"""Stage progress: throttled, with an honest estimate of what remains, read back by the
launcher; and the stages report through it."""

from __future__ import annotations

import logging
import time

import pytest

from mem1_core.runs.progress import Progress, fmt_seconds, line, read


def test_progress_file_and_estimate(tmp_path):
    path = tmp_path / "progress.json"
    p = Progress("sft", total=100, path=path, file_seconds=0.0, log_seconds=1e9)
    p.t0 -= 30.0  # 30 s in
    p.update(25, loss=0.5)
    st = read(path)
    assert st["stage"] == "sft" and st["done"] == 25 and st["metrics"] == {"loss": 0.5}
    assert st["fraction"] == pytest.approx(0.25)
    assert st["eta_s"] == pytest.approx(90.0, abs=1.0)  # 30 s for a quarter: 90 s to go
    p.close()
    assert read(path)["final"] and read(path)["eta_s"] == 0.0


def test_a_time_budget_ends_the_estimate_when_it_is_the_tighter_bound(tmp_path):
    p = Progress("ppo", total=1000, budget_seconds=60.0, path=tmp_path / "p.json", file_seconds=0)
    p.t0 -= 45.0
    p.update(10)
    assert read(tmp_path / "p.json")["eta_s"] == pytest.approx(15.0, abs=1.0)


def test_no_estimate_before_the_first_unit_when_a_count_decides(tmp_path):
    """Before its first iteration a run with a count and a generous time cap has no estimate
    ('?'), not the cap's remainder; after it, the count's."""
    p = Progress("ppo", total=4, budget_seconds=3 * 3600, path=tmp_path / "p.json", file_seconds=0)
    p.t0 -= 100.0
    p.update(0)
    assert read(tmp_path / "p.json")["eta_s"] is None
    assert line(read(tmp_path / "p.json")).endswith("~? left")
    p.update(1)
    assert read(tmp_path / "p.json")["eta_s"] == pytest.approx(300.0, abs=1.0)


def test_a_resumed_stage_paces_its_estimate_on_its_own_units(tmp_path):
    """A PPO run resumed at iteration 6 of 12 that took 60 s for its first iteration of this
    attempt has 5 x 60 s left; its fraction counts the 6 it found done."""
    p = Progress("ppo", total=12, start=6, path=tmp_path / "p.json", file_seconds=0)
    p.t0 -= 60.0
    p.update(6)  # nothing of this attempt yet: no estimate
    assert read(tmp_path / "p.json")["eta_s"] is None
    p.update(7)
    st = read(tmp_path / "p.json")
    assert st["fraction"] == pytest.approx(7 / 12)
    assert st["eta_s"] == pytest.approx(300.0, abs=1.0)


def test_updates_are_throttled_for_the_file_and_the_log(tmp_path, caplog):
    path = tmp_path / "progress.json"
    with caplog.at_level(logging.INFO, logger="mem1.progress"):
        p = Progress("sft", total=1000, path=path, file_seconds=3600, log_seconds=3600)
        for i in range(1, 500):
            p.update(i, loss=1.0 / i)
    assert read(path)["done"] == 0  # the start wrote; the next 499 updates waited
    assert len([r for r in caplog.records if r.name == "mem1.progress"]) == 1
    with caplog.at_level(logging.INFO, logger="mem1.progress"):
        p.close()  # the end is always reported
    assert read(path)["done"] == 499 and read(path)["final"]


def test_the_line_a_person_reads():
    st = {
        "stage": "ppo (mem1)",
        "done": 7,
        "total": 18,
        "unit": "iteration",
        "fraction": 7 / 18,
        "elapsed_s": 62,
        "eta_s": 97,
        "final": False,
        "metrics": {"reward": 0.83},
    }
    assert line(st) == "ppo (mem1): iteration 7 of 18 (39%) reward=0.83 · 1:02 elapsed, ~1:37 left"
    no_total = st | {"stage": "pretrain", "unit": "step", "done": 300, "total": None}
    no_total |= {"fraction": None, "eta_s": None, "metrics": {}}
    assert line(no_total) == "pretrain: step 300 · 1:02 elapsed, ~? left"
    assert fmt_seconds(3725) == "1:02:05" and fmt_seconds(None) == "?"


def test_sft_reports_its_steps(small_tokenizer, tmp_path, monkeypatch):
    from mem1_core.config import load_config
    from mem1_core.models.model import build_tiny_model
    from mem1_core.training.sft import train_on_trajectories

    monkeypatch.setenv("MEM1_PROGRESS_FILE", str(tmp_path / "progress.json"))
    cfg = load_config("smoke")
    model = build_tiny_model(cfg.model, small_tokenizer)
    trajs = _teacher_trajs(small_tokenizer, tmp_path)
    train_on_trajectories(
        model,
        trajs,
        small_tokenizer.pad_token_id,
        lr=1e-3,
        batch_size=2,
        minutes=1.0,
        max_steps=3,
        progress=False,
        stage="warm start",
    )
    st = read(tmp_path / "progress.json")
    assert st["stage"] == "warm start" and st["done"] == 3 and st["final"]
    assert "loss" in st["metrics"]


def _teacher_trajs(tok, tmp_path):
    from mem1_core.config import load_config
    from mem1_core.domains.inputs import load_tasks, make_env, prepare
    from mem1_core.training.sft import teacher_trajectories

    cfg = load_config("smoke")
    paths = prepare(cfg, tmp_path / "run")
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "train", 1)[:4]
    return teacher_trajectories(tasks, tok, env, cfg.rollout, memory="mem1")


def test_the_follower_shows_no_line_a_stopped_run_left_behind(tmp_path, capsys):
    """A resumed run directory holds the stopped run's last progress.json: the launcher's
    status line waits for the resumed run's own, instead of a clock running on from it."""
    from deployments.follow import StatusLine

    path = tmp_path / "progress.json"
    with Progress("warm start", total=40, path=path) as p:
        p.update(17)
    status = StatusLine(path, since=read(path)["time"] + 1e-3)
    status.poll()
    assert capsys.readouterr().err == ""
    time.sleep(0.01)
    with Progress("warm start", total=40, path=path) as p:
        p.update(2)
    status.poll()
    assert "step 2 of 40" in capsys.readouterr().err
