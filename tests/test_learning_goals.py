"""benchmarks/learning.py's check of issue 27's goals, against the goals as the issue states
them: a difference of two agents' EM fractions with the standard error of two independent
means, a bar of k standard errors (3 over the warm start, 2 for "above"), the peak-token
ratio at most 0.3 at N=16, and each figure on another world within 0.1 of world 0's."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from conftest import load_benchmark

from mem1_core.evaluation.headline import build_headline


@pytest.fixture(scope="module")
def learning():
    return load_benchmark("learning")


AGENTS = {"warm-start": "mem1", "mem1-ppo": "mem1", "full-ppo": "full", "mem1-sft": "mem1"}


def headline(em: dict, peak: dict, se: float = 0.02) -> dict:
    """A headline of agents × N from EM fractions and peak tokens (one SE for every cell)."""
    rows = [
        {"agent": a, "memory": AGENTS[a], "n_objectives": n, "tasks": 16, "em_frac": em[a][n],
         "em_frac_se": se, "peak_tokens": peak[a][n], "peak_tokens_se": 5.0}
        for a in AGENTS for n in (2, 4, 8, 16)
    ]  # fmt: skip
    return build_headline(pd.DataFrame(rows))


EM = {
    "warm-start": {2: 0.50, 4: 0.20, 8: 0.05, 16: 0.02},
    "mem1-ppo": {2: 0.62, 4: 0.30, 8: 0.10, 16: 0.03},
    "full-ppo": {2: 0.60, 4: 0.20, 8: 0.02, 16: 0.02},
    "mem1-sft": {2: 0.61, 4: 0.31, 8: 0.02, 16: 0.00},
}
PEAK = {a: {2: 300.0, 4: 330.0, 8: 400.0, 16: 500.0} for a in AGENTS} | {
    "full-ppo": {2: 450.0, 4: 600.0, 8: 900.0, 16: 2000.0}
}


def by_key(rows):
    return {r["key"]: r for r in rows}


def test_each_goal_is_the_issue_s_comparison_and_bar(learning):
    rows = by_key(learning.goal_figures(headline(EM, PEAK), n_train=2))
    se2 = math.hypot(0.02, 0.02)

    start = rows["mem1_minus_start_em@2"]
    assert start["value"] == pytest.approx(0.12) and start["se"] == pytest.approx(se2)
    assert start["value_sum"] == pytest.approx(0.24)  # the paper's units: summed over N=2
    assert start["met"] == (0.12 > 3 * se2)  # 0.12 > 0.085: met

    n8 = rows["mem1_minus_full_em@8"]
    assert n8["value"] == pytest.approx(0.08) and n8["met"] == (0.08 > 2 * se2)
    assert n8["value_sum"] == pytest.approx(0.64)
    n16 = rows["mem1_minus_full_em@16"]
    assert n16["value"] == pytest.approx(0.01) and not n16["met"]

    peak = rows["mem1_over_full_peak@16"]
    assert peak["value"] == pytest.approx(0.25) and peak["met"]

    # RL above SFT at every N >= 4 evaluated, never at the training N
    assert {k for k in rows if k.startswith("rl_minus_sft")} == {
        "rl_minus_sft_em@4", "rl_minus_sft_em@8", "rl_minus_sft_em@16"
    }  # fmt: skip
    assert rows["rl_minus_sft_em@4"]["value"] == pytest.approx(-0.01)
    assert not rows["rl_minus_sft_em@4"]["met"]
    assert rows["rl_minus_sft_em@8"]["met"]


def test_a_goal_is_missed_below_its_bar(learning):
    em = {a: dict(v) for a, v in EM.items()}
    em["mem1-ppo"][2] = 0.55  # +0.05 over the start: under 3 SE (0.085)
    peak = {a: dict(v) for a, v in PEAK.items()}
    peak["mem1-ppo"][16] = 700.0  # 0.35 of the full context's 2000
    rows = by_key(learning.goal_figures(headline(em, peak), n_train=2))
    assert not rows["mem1_minus_start_em@2"]["met"]
    assert not rows["mem1_over_full_peak@16"]["met"]


def test_another_world_within_or_beyond_the_tolerance(learning):
    other = {a: dict(v) for a, v in EM.items()}
    other["mem1-ppo"][2] = 0.55  # start goal moves 0.12 -> 0.05: within 0.1
    other["mem1-ppo"][8] = 0.25  # N=8 goal moves 0.08 -> 0.23: beyond 0.1
    evals = {0: headline(EM, PEAK), 4242: headline(other, PEAK)}
    rows = by_key(learning.goals(evals, own_seed=0, n_train=2))
    start = rows["mem1_minus_start_em@2"]["worlds"]["4242"]
    assert start["value"] == pytest.approx(0.05) and start["within_tolerance"]
    assert not rows["mem1_minus_full_em@8"]["worlds"]["4242"]["within_tolerance"]


def test_agents_not_evaluated_leave_their_goals_out(learning):
    h = headline(EM, PEAK)
    h["cells"] = [c for c in h["cells"] if c["N"] <= 8]
    h["objectives"] = [2, 4, 8]
    keys = set(by_key(learning.goal_figures(h, n_train=2)))
    assert "mem1_minus_full_em@16" not in keys and "mem1_over_full_peak@16" not in keys
    assert "mem1_minus_full_em@8" in keys


def test_the_readme_tables_carry_every_cell_in_both_units(learning):
    """learning.md: per world, each agent's row holds its EM fraction ± SE (peak tokens) and,
    in the paper's units, N × that fraction ± N × its SE; then one line per goal."""
    evals = {0: headline(EM, PEAK), 4242: headline(EM, PEAK)}
    checked = learning.goals(evals, own_seed=0, n_train=2)
    md = learning.markdown(evals, checked, own_seed=0)
    rows = [line for line in md.splitlines() if line.startswith("| mem1-ppo |")]
    assert len(rows) == 4  # two tables per world
    fractions = [c.strip() for c in rows[0].strip("|").split("|")][1:]
    assert fractions == ["0.620 ± 0.020 (300)", "0.300 ± 0.020 (330)", "0.100 ± 0.020 (400)",
                         "0.030 ± 0.020 (500)"]  # fmt: skip
    sums = [c.strip() for c in rows[1].strip("|").split("|")][1:]
    want = [f"{EM['mem1-ppo'][n] * n:.2f} ± {0.02 * n:.2f}" for n in (2, 4, 8, 16)]
    assert sums == want
    goal_lines = [line for line in md.splitlines() if line.startswith("- ")]
    assert len(goal_lines) == len(checked)
    assert all("world 4242" in line for line in goal_lines)
    # a difference counts its standard errors; the peak-token ratio's bar is not in SE
    assert all(" SE, " in line for line in goal_lines if "EM fraction" in line)
    assert not any(" SE, " in line for line in goal_lines if "peak tokens" in line)


def test_the_smol_experiment_s_settings_apply_and_a_set_wins(learning):
    """`learning.py --profile smol` runs issue 27's settings over the profile's own; a --set
    on the command line overrides them, and the held-out curve spreads over the iterations."""
    import argparse

    def cfg(*sets):
        args = argparse.Namespace(profile="smol", overrides=list(sets), curve_points=4, curve_n=[8])
        return learning.experiment_config(args)

    c = cfg()
    assert (c.ppo.iterations, c.ppo.actor_lr, c.ppo.critic_lr) == (16, 1e-5, 5e-5)
    assert (c.ppo.minibatch_size, c.sft.steps) == (8, 64)
    assert c.ppo.eval_every == 4 and list(c.ppo.eval_objectives) == [8]
    c = cfg("ppo.iterations=8", "ppo.actor_lr=3e-5")
    assert (c.ppo.iterations, c.ppo.actor_lr, c.ppo.eval_every) == (8, 3e-5, 2)
    tiny = learning.experiment_config(
        argparse.Namespace(profile="tiny", overrides=[], curve_points=4, curve_n=[8])
    )
    from mem1_core.config import load_config

    own = load_config("tiny", None, [])  # no preset for tiny: the profile's own settings
    assert (tiny.ppo.iterations, tiny.ppo.actor_lr, tiny.sft.steps) == (
        own.ppo.iterations, own.ppo.actor_lr, own.sft.steps
    )  # fmt: skip


def test_the_bar_counts_the_paired_error_where_the_tasks_are_known(learning):
    """With both agents' per-task scores the 3-SE bar is counted in the paired error (the
    same tasks), and the figure says so; without them, in the independent one."""
    h = headline(EM, PEAK, se=0.05)  # 0.12 over the start: 1.7 independent SE, not met
    assert not by_key(learning.goal_figures(h, n_train=2))["mem1_minus_start_em@2"]["met"]
    # per-task scores whose mean gain is the cells' 0.12, the same on every task but two
    start = {f"t{k}": 0.5 for k in range(16)}
    ppo = {t: 0.62 for t in start} | {"t0": 0.66, "t1": 0.58}
    h["task_em"] = {"warm-start": {"2": start}, "mem1-ppo": {"2": ppo}}
    row = by_key(learning.goal_figures(h, n_train=2))["mem1_minus_start_em@2"]
    d = [ppo[t] - start[t] for t in start]
    mean = sum(d) / 16
    want = math.sqrt(sum((x - mean) ** 2 for x in d) / 15 / 16)
    assert row["se_paired"] == pytest.approx(want)
    assert row["se"] == pytest.approx(math.hypot(0.05, 0.05))
    assert row["met"]  # 0.12 over a paired SE of 0.004
    assert "paired SE" in learning._goal_figure(row, row["bar"])


def test_the_goals_panel_counts_each_difference_in_its_own_se(learning, tmp_path):
    """The plot's goals panel: every EM-difference goal (not the peak-token ratio), its bar in
    SE as the issue states it, and on each world the difference over that world's SE; a world
    whose SE is 0 (both agents score nothing) has no bar to count in, so it is left out."""
    other = {a: dict(v) for a, v in EM.items()}
    other["mem1-ppo"][2] = 0.55
    evals = {0: headline(EM, PEAK), 4242: headline(other, PEAK, se=0.0)}
    checked = learning.goals(evals, own_seed=0, n_train=2)
    bars = learning.goal_bars(checked, own_seed=0)
    se2 = math.hypot(0.02, 0.02)
    assert [(label.replace("\n", " "), bar) for label, bar, _ in bars] == [
        ("MEM1 − start N=2", 3.0), ("MEM1 − full N=8", 2.0), ("MEM1 − full N=16", 2.0),
        ("RL − SFT N=4", 2.0), ("RL − SFT N=8", 2.0), ("RL − SFT N=16", 2.0),
    ]  # fmt: skip
    start = bars[0][2]
    assert start["0"] == pytest.approx(0.12 / se2)
    assert "4242" not in start  # SE 0 on that world
    png = learning.plot({}, evals, 2, tmp_path / "p.png", checked)
    assert png.stat().st_size > 0


def _metrics(run_dir, rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_reuse_links_only_arms_that_finished_their_count(learning, tmp_path):
    """--reuse evaluates another run's arms again: one that ran all its iterations (PPO) or
    steps (SFT, with its result.json written) is linked; one stopped short is refused, never
    evaluated as if trained."""
    import argparse

    cfg = learning.experiment_config(
        argparse.Namespace(profile="smol", overrides=["ppo.iterations=4", "sft.steps=8"],
                           curve_points=4, curve_n=[8])
    )  # fmt: skip
    src, out = tmp_path / "src", tmp_path / "out"
    ppo = [{"iteration": i, "reward": 0.5} for i in range(4)]
    ppo[-1]["stopped_by"] = "count"
    _metrics(src / "ppo_mem1", ppo)
    _metrics(src / "ppo_full", [*ppo[:2], {"iteration": 2, "stopped_by": "minutes"}])
    _metrics(src / "sft_mem1", [{"step": 4}, {"step": 8, "stopped_by": "count"}])

    learning.link_finished(cfg, src, out, ["mem1-ppo"])
    assert (out / "ppo_mem1").resolve() == (src / "ppo_mem1").resolve()
    with pytest.raises(SystemExit, match="ppo_full has not finished its 4 iterations"):
        learning.link_finished(cfg, src, out, ["full-ppo"])
    with pytest.raises(SystemExit, match="sft_mem1 has not finished"):  # no result.json yet
        learning.link_finished(cfg, src, out, ["mem1-sft"])
    (src / "sft_mem1" / "result.json").write_text("{}")
    learning.link_finished(cfg, src, out, ["mem1-sft"])
    assert (out / "sft_mem1").is_symlink() and not (out / "ppo_full").exists()


def test_eval_agents_beyond_the_arms_fail_before_any_training(learning, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        learning.main(["--out", str(tmp_path / "r"), "--arms", "mem1-ppo",
                       "--eval-agents", "truncate-ppo"])  # fmt: skip
    assert e.value.code == 2 and "truncate-ppo" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
    assert learning.agent_names(["full-ppo"]) == {"warm-start", "full-ppo", "truncate-ppo"}


def test_an_evaluation_never_writes_into_a_linked_run(learning, tmp_path):
    """The run's own world is evaluated in its warm start's directory, unless that directory
    is another run's (linked by --init or --reuse): then in one of its own, like any world."""
    own, linked, other = tmp_path / "own", tmp_path / "linked", tmp_path / "other"
    (own / "warm_start").mkdir(parents=True)
    (other / "warm_start").mkdir(parents=True)
    linked.mkdir()
    (linked / "warm_start").symlink_to(other / "warm_start")
    assert learning.eval_dirs(own, 0, 0) == (own / "warm_start", own / "eval")
    assert learning.eval_dirs(linked, 0, 0) == (linked / "world0", linked / "eval")
    assert learning.eval_dirs(own, 4242, 0) == (own / "world4242", own / "world4242" / "eval")
