"""An experiment in parts: selecting a part, exporting its records, merging parts.

The merge is checked against the definition of what it must equal: one run of the whole
experiment. A whole run's directory (real trajectories, written by the trajectory writer) is
split into the run directories two parts would have written; the parts' exported records,
merged, must give the whole run's headline figure for figure. Every refusal is one line naming
the source and the field."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from mem1_core.config import Config
from mem1_core.experiment.configs import base_config
from mem1_core.experiment.merge import headline_of, merge_records
from mem1_core.experiment.parse import load_experiment
from mem1_core.experiment.parts import parse_seeds, select_overrides, select_part
from mem1_core.experiment.plan import check_run_dir, world_dirs
from mem1_core.experiment.records import (
    MANIFEST,
    TASKS,
    RecordsError,
    export_run,
    read_records,
    training_settings,
    write_records,
)
from mem1_core.experiment.report import write_experiment_headline
from mem1_core.trajectory.record import Action, Trajectory, Turn, write_trajectories

# ---- selecting a part ------------------------------------------------------------------------


def test_a_seed_selects_its_arms_warm_starts_and_agents_and_keeps_the_whole():
    whole = load_experiment("horizon")
    part = load_experiment("horizon", select_overrides([2]))
    # seed 2: only the paper's arms have it; no lever, so no named warm start, no effect
    assert {a: x.seeds for a, x in part.arms.items()} == {
        "mem1-ppo": (2,), "full-ppo": (2,), "mem1-sft": (2,)}  # fmt: skip
    assert part.agents == ("warm-start", "mem1-ppo", "full-ppo", "mem1-sft")
    assert part.used_warm_starts() == ["plain"] and part.effects == ()
    assert part.whole == whole.to_dict() and part.selection == {"seeds": [2], "part": None}
    lever = load_experiment("horizon", select_overrides([1], "upto4"))
    assert list(lever.arms) == ["mem1-ppo-upto4"] and lever.used_warm_starts() == ["upto4"]
    assert lever.agents == ("warm-start-upto4", "mem1-ppo-upto4")
    # the effect against its own warm start is judged in the part; the one against the
    # paper's arm needs the paper part's records, in the merge
    assert [(e.a, e.b) for e in lever.effects] == [("mem1-ppo-upto4", "warm-start-upto4")]


@pytest.mark.parametrize(
    ("seeds", "part", "message"),
    [
        ([7], None, "no arm trains seed [7]; its seeds are [0, 1, 2]"),
        ([2], "keep", "no arm of part keep trains seed [2]; its seeds are [0, 1]"),
        (None, "levers", "no part 'levers'; its parts are ['paper', 'mem1', 'full', 'mem1-ppo', 'upto4', 'curriculum', 'keep']"),
    ],
)  # fmt: skip
def test_a_part_that_is_not_there_is_refused_in_one_line(seeds, part, message):
    with pytest.raises(ValueError) as e:
        select_part(load_experiment("horizon"), seeds, part)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_seeds_on_the_command_line():
    assert parse_seeds("0,2") == [0, 2]
    with pytest.raises(ValueError, match="K\\[,K...\\]"):
        parse_seeds("0,x")


def test_the_launcher_refuses_a_bad_part_before_deploying(capsys, monkeypatch):
    from deployments import launch

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setattr(launch, "server_answers", lambda api: True)
    rc = launch.main(["--experiment", "horizon", "--part", "paper", "--seeds", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "no arm of part paper trains seed [5]" in err


# ---- a whole run, and the same run as parts ------------------------------------------------


def _trajectories(rng: random.Random, memory: str, n: int, tasks: int, skill: float):
    """Real trajectories: per task a query turn whose `<info>` holds the first gold answer,
    then an answer that gets each objective right with probability `skill`."""
    out = []
    for k in range(tasks):
        golds = [[f"ans{k}x{j}"] for j in range(n)]
        right = [float(rng.random() < skill) for _ in range(n)]
        answer = "; ".join(g[0] if r else "?" for g, r in zip(golds, right, strict=True))
        turns = [
            Turn([], [1] * 5, [-0.1] * 5, Action.QUERY, gen_text="<IS>x</IS><query>q</query>",
                 info_text=f"<info>{golds[0][0]}</info>\nhint", query=f"q{k}",
                 context_tokens=rng.randint(50, 300)),
            Turn([], [1] * 7, [-0.1] * 7, Action.ANSWER,
                 gen_text=f"<IS>{golds[0][0]}</IS><answer>{answer}</answer>",
                 context_tokens=rng.randint(50, 300)),
        ]  # fmt: skip
        out.append(Trajectory(f"w-n{n}-t{k}", memory, [1] * 20, golds, turns, answer=answer,
                              em=right, done=True, max_turns=2 * n + 1))  # fmt: skip
    return out


SKILL = {"warm-start": 0.3, "mem1-ppo": 0.6, "full-ppo": 0.4, "mem1-sft": 0.35}


def _write_run(run: Path, spec, cells: set[tuple[str, int | None]], seed: int = 0) -> None:
    """A finished run of `spec` whose evaluation played the agent × seed `cells`: its record,
    warm start, arms' metrics and every cell's trajectories (seeded per cell, so that the same
    cell is the same trajectories in any run)."""
    run.mkdir(parents=True)
    cfg = base_config(spec)
    check_run_dir(run, spec, cfg)
    (run / "warm_start").mkdir()
    (run / "warm_start" / "result.json").write_text("{}")
    for a in spec.arms.values():
        for s in a.seeds:
            d = run / f"{a.trainer}_{a.memory}" / f"seed{s}"
            d.mkdir(parents=True)
            if a.trainer == "sft":
                (d / "result.json").write_text("{}")
                (d / "policy").mkdir()
            else:
                rows = [{"iteration": i, "reward": 0.1 * i + s, "kl": 0.01, "seconds": 3.0}
                        for i in range(cfg.ppo.iterations)]  # fmt: skip
                rows[-1]["stopped_by"] = "iterations"
                (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for w in (0, 4242):
        traj = world_dirs(run, w)[1] / "trajectories"
        traj.mkdir(parents=True)
        for agent, s in cells:
            name = agent if s is None else f"{agent}-s{s}"
            memory = "full" if agent == "full-ppo" else "mem1"
            for n in spec.objectives:
                rng = random.Random(f"{w}/{name}/{n}")
                skill = SKILL[agent] + (0.05 * s if s else 0.0)
                write_trajectories(_trajectories(rng, memory, n, 16 // n + 3, skill),
                                   traj / f"{name}_n{n}.parquet")  # fmt: skip
    (run / "walls.json").write_text(json.dumps({"warm start": 60.0 + seed}))


def _cells(spec) -> set[tuple[str, int | None]]:
    return {(a, s) for a in spec.agents for s in spec.seeds(a)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    whole = load_experiment("smoke")
    _write_run(root / "whole", whole, _cells(whole))
    parts = {}
    for seed in (0, 1):
        spec = load_experiment("smoke", select_overrides([seed]))
        _write_run(root / f"seed{seed}", spec, _cells(spec), seed)
        parts[seed] = spec
    return root, parts


def _figures(h: dict) -> dict:
    """Everything a headline states as a figure: the claims, the effects, each world's cells
    and behaviour rows, the curves (their wall seconds aside)."""
    curves = {k: [{x: v for x, v in r.items() if x != "seconds"} for r in rows]
              for k, rows in h["curves"].items()}  # fmt: skip
    return {"claims": h["claims"], "effects": h["effects"], "worlds": h["worlds"],
            "bars": h["bars"], "curves": curves}  # fmt: skip


def test_parts_merged_give_the_whole_runs_headline_figure_for_figure(runs, tmp_path):
    root, _ = runs
    whole = write_experiment_headline(root / "whole")["headline"]
    for seed in (0, 1):
        write_records(export_run(root / f"seed{seed}"), str(tmp_path / f"seed{seed}"))
    merged = merge_records([read_records(str(tmp_path / "seed1")),
                            read_records(str(root / "seed0"))])  # fmt: skip
    h = headline_of(merged)
    assert whole["claims"], "the whole run judges claims"
    assert json.dumps(_figures(h), sort_keys=True) == json.dumps(_figures(whole), sort_keys=True)
    # the warm start was evaluated in both parts from the same weights: kept once
    assert {p["label"] for p in h["parts"]} == {"seed 0", "seed 1"}
    assert h["walls"] == {"seed 1 · warm start": 61.0, "seed 0 · warm start": 60.0}
    assert h["complete"] and whole["complete"]
    # one part alone: the arm runs the whole experiment has and no part trained are named
    alone = headline_of(read_records(str(tmp_path / "seed1")))
    arms = sorted({a["arm"] for a in merged.arms})
    assert not alone["complete"]
    assert sorted(alone["pending"]) == [f"{arm} seed 0: no part has run it" for arm in arms]


def test_the_records_are_small_and_an_export_stopped_halfway_is_not_read(runs, tmp_path):
    root, _ = runs
    out = tmp_path / "rec"
    manifest = write_records(export_run(root / "seed0", samples=2), str(out))
    assert sum(f["bytes"] for f in manifest["files"].values()) < 1_000_000
    assert {"records.json", TASKS, "samples.jsonl"} == set(manifest["files"])
    assert read_records(str(out)).tasks == export_run(root / "seed0").tasks
    (out / TASKS).write_text((out / TASKS).read_text()[:-40])  # a write cut short
    with pytest.raises(RecordsError, match=f"tasks.jsonl: does not match {MANIFEST}"):
        read_records(str(out))
    (out / MANIFEST).unlink()  # the manifest comes last: without it, nothing is finished
    with pytest.raises(RecordsError, match="an export stopped halfway has none"):
        read_records(str(out))


def _one_line(recs, *expected: str) -> None:
    with pytest.raises(RecordsError) as e:
        merge_records(recs)
    msg = str(e.value)
    assert "\n" not in msg and all(x in msg for x in expected), msg


def test_a_merge_refuses_what_does_not_pair_in_one_line(runs):
    root, _ = runs
    a, b = export_run(root / "seed0"), export_run(root / "seed1")
    _one_line([a, export_run(root / "seed0")], "seed0: arms (mem1-ppo, seed 0) is also in",
              "duplicate arm × seed")  # fmt: skip
    b.cells[3]["tasks_hash"] = "0" * 16
    c = b.cells[3]
    _one_line([a, b], f"seed1: cells (world {c['world']}, N={c['N']}).tasks_hash differs",
              "different evaluation tasks")  # fmt: skip
    b = export_run(root / "seed1")
    b.arms[0]["settings"] = {**b.arms[0]["settings"], "ppo.actor_lr": 1.0}
    _one_line([a, b], f"arms ({b.arms[0]['arm']}, seed 1).settings.ppo.actor_lr differs")
    b = export_run(root / "seed1")
    b.starts["plain"]["weights_hash"] = "f" * 64
    _one_line([a, b], "seed1: starts.plain.weights_hash differs", "pair_across_starts")
    b.experiment = {**b.experiment, "pair_across_starts": True}  # a part run after the file said so
    assert merge_records([a, b]).starts["plain"]["weights_hash"] is None  # the first part's
    b = export_run(root / "seed1")
    b.experiment = {
        **b.experiment,
        "parts": {"finer": ["mem1-ppo"]},
    }  # another cut, same experiment
    assert len(merge_records([export_run(root / "seed0"), b]).parts) == 2
    b.experiment = {**b.experiment, "se_bar": 3.0}
    _one_line([export_run(root / "seed0"), b], "seed1: experiment.se_bar differs")


def test_parts_run_at_different_commits_merge_while_they_train_the_same(runs):
    """A field added to the code after a part ran (recorded by the later part at its default),
    or removed since (recorded by the earlier part only), is no difference; a value off the
    default is, in an arm's settings and in a warm start's."""
    root, _ = runs
    a, b = export_run(root / "seed0"), export_run(root / "seed1")
    old = dict(a.arms[0]["settings"])
    defaults = training_settings(Config())
    new_field = next(k for k, v in sorted(old.items()) if defaults.get(k) == v)
    a.arms[0]["settings"] = {k: v for k, v in old.items() if k != new_field}
    a.arms[0]["settings"]["ppo.a_field_since_removed"] = 3
    a.starts["plain"]["settings"]["ppo.a_field_since_removed"] = 3
    assert len(merge_records([a, b]).arms) == len(a.arms) + len(b.arms)
    b.arms[0]["settings"] = {**b.arms[0]["settings"], "ppo.actor_lr": 1.0}
    _one_line([a, b], f"arms ({b.arms[0]['arm']}, seed 1).settings.ppo.actor_lr differs")
    b = export_run(root / "seed1")
    b.starts["plain"]["settings"] = {**b.starts["plain"]["settings"], "sft.steps": 1}
    _one_line([a, b], "seed1: starts.plain.settings.sft.steps differs", "other settings")
    del a.starts["plain"]["settings"]  # a record from before starts recorded their settings
    b.starts["plain"]["settings_hash"] = "0" * 16
    _one_line([a, b], "seed1: starts.plain.settings_hash differs")


def test_report_merges_sources_on_the_command_line(runs, tmp_path, capsys):
    from mem1_core.cli.main import main

    root, _ = runs
    assert main(["experiment", "export", str(root / "seed0"), "--out", str(tmp_path / "r0")]) == 0
    printed = capsys.readouterr()
    assert "kB ->" in printed.out and "warning" not in printed.err
    # a run made at another commit: its records say how this code reads the experiment
    other = tmp_path / "seed1-elsewhere"
    shutil.copytree(root / "seed1", other, symlinks=True)
    record = json.loads((other / "experiment.json").read_text())
    record["code"] = {"commit": "0" * 40, "dirty": False}
    (other / "experiment.json").write_text(json.dumps(record))
    assert main(["experiment", "export", str(other), "--out", str(tmp_path / "r1")]) == 0
    assert "ran at commit 000000000000" in capsys.readouterr().err
    out = tmp_path / "merged"
    assert main(["experiment", "report", str(tmp_path / "r0"), str(root / "seed1"),
                 "--out", str(out)]) == 0  # fmt: skip
    md = (out / "headline.md").read_text()
    assert "## Parts" in md and "| seed 0 |" in md and (out / "scaling.png").is_file()
    assert main(["experiment", "report", str(tmp_path / "r0"), str(tmp_path / "r0"),
                 "--out", str(out)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "duplicate arm × seed" in err


@pytest.mark.slow
def test_records_go_to_an_object_store_and_back(runs, tmp_path):
    """--out takes any fsspec URL: an S3 bucket on moto's server, a local stand-in."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import fsspec

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        opts = {"key": "test", "secret": "test",
                "client_kwargs": {"endpoint_url": f"http://{host}:{port}",
                                  "region_name": "us-east-1"}}  # fmt: skip
        import boto3

        boto3.client("s3", aws_access_key_id="test", aws_secret_access_key="test",
                     **opts["client_kwargs"]).create_bucket(Bucket="records")  # fmt: skip
        fs = fsspec.filesystem("s3", **opts)
        root, _ = runs
        rec = export_run(root / "seed0")
        write_records(rec, "s3://records/horizon/seed0", opts)
        assert fs.exists("records/horizon/seed0/manifest.json")
        back = read_records("s3://records/horizon/seed0", opts)
        assert back.tasks == rec.tasks and back.arms == rec.arms
        fs.rm("records/horizon/seed0/manifest.json")
        with pytest.raises(RecordsError, match="no manifest.json"):
            read_records("s3://records/horizon/seed0", opts)
    finally:
        server.stop()
