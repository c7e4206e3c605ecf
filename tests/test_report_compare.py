"""The headline (computed once, eval/headline.json) and what renders it: the agents × N table,
the paper's comparisons at every N, the inline plots, `mem1 compare` and the nightly trend,
checked against tables whose answers are known by construction."""

from __future__ import annotations

import base64
import math
import statistics

import pandas as pd
import pytest

from mem1_core.evaluation.compare import append_night, compare_runs, plot_trend, previous_night
from mem1_core.evaluation.headline import build_headline, cells_table, read_headline
from mem1_core.evaluation.report import (
    agent_rows,
    comparison_rows,
    decimals,
    headline_markdown,
    headline_text,
    image_markdown,
    pm,
)


def _table(scale: float = 1.0) -> pd.DataFrame:
    rows = []
    for agent, memory, em, peak in (
        ("mem1-ppo", "mem1", 0.8, 300),
        ("full-ppo", "full", 0.5, 1000),
        ("mem1-sft", "mem1", 0.4, 290),
    ):
        for n in (1, 2, 16):
            rows.append(
                {
                    "agent": agent,
                    "policy": memory,
                    "n_objectives": n,
                    "em_frac": em * scale,
                    "em_sum": em * scale * n,
                    "em_frac_se": 0.04,
                    "peak_tokens": peak * (1 if memory == "mem1" else n),
                }
            )
    return pd.DataFrame(rows)


def test_rounding_follows_the_standard_error():
    assert decimals(0.04) == 2 and decimals(0.004) == 3 and decimals(0.3) == 1
    assert pm(0.6251, 0.043) == "0.63 ± 0.04"
    assert pm(0.6251, 0.25) == "0.6 ± 0.2"


def test_the_headline_has_a_cell_per_agent_and_n_on_both_em_scales():
    h = build_headline(_table())
    assert h["objectives"] == [1, 2, 16] and h["agents"] == ["mem1-ppo", "full-ppo", "mem1-sft"]
    cell = {(c["agent"], c["N"]): c for c in h["cells"]}
    # the paper's scale: EM summed over the N objectives, its SE N times the fraction's
    assert cell[("mem1-ppo", 16)]["em_sum"] == pytest.approx(0.8 * 16)
    assert cell[("mem1-ppo", 16)]["em_sum_se"] == pytest.approx(0.04 * 16)
    assert cell[("full-ppo", 16)]["peak_tokens"] == 16000
    rows = agent_rows(h)
    assert len(rows) == 9 and rows[0]["agent"] == "mem1-ppo" and rows[0]["N"] == "1"
    r = next(r for r in rows if r["agent"] == "mem1-ppo" and r["N"] == "2")
    assert r["EM fraction"] == "0.80 ± 0.04" and r["EM sum (0..N)"] == "1.60 ± 0.08"


def test_the_paper_comparisons_at_every_n_with_their_errors():
    table = _table().assign(peak_tokens_se=lambda t: t["peak_tokens"] / 10)
    h = build_headline(table)
    got = {(c["comparison"], c["N"]): c for c in h["comparisons"]}
    assert {n for _, n in got} == {1, 2, 16}  # every N, not only the largest
    se = math.hypot(0.04, 0.04)
    for n in (1, 2, 16):
        d = got[("mem1_minus_full_em", n)]
        assert (d["value"], d["se"]) == (pytest.approx(0.3), pytest.approx(se))
        assert (d["value_sum"], d["se_sum"]) == (pytest.approx(0.3 * n), pytest.approx(se * n))
        assert got[("rl_minus_sft_em", n)]["value"] == pytest.approx(0.4)
        # peak ratio 300 / (1000 n), each peak ±10 %: relative errors add in quadrature
        ratio = got[("mem1_over_full_peak", n)]
        assert ratio["value"] == pytest.approx(300 / (1000 * n))
        assert ratio["se"] == pytest.approx(300 / (1000 * n) * math.hypot(0.1, 0.1))
    rows = comparison_rows(h)
    assert any(r["comparison"].startswith("MEM1 / full") and r["N"] == "16" for r in rows)


def test_comparisons_need_both_agents():
    only = _table()[_table()["agent"] != "full-ppo"]
    names = {c["comparison"] for c in build_headline(only)["comparisons"]}
    assert names == {"rl_minus_sft_em"}
    # `mem1 evaluate --agent` names: the first `mem1*` agent under mem1, the first under full
    renamed = _table().replace({"agent": {"mem1-ppo": "mem1-mine", "full-ppo": "mine-full"}})
    assert build_headline(renamed)["roles"] == {
        "mem1": "mem1-mine",
        "full": "mine-full",
        "sft": "mem1-sft",
    }


def test_an_old_run_without_headline_json_still_renders(tmp_path):
    run = _run(tmp_path, "old", 1.0)  # eval/metrics.csv only, as runs wrote before
    h = read_headline(run / "eval")
    assert h == build_headline(pd.read_csv(run / "eval" / "metrics.csv"))
    assert "mem1-ppo" in headline_text(h) and "MEM1 − full context" in headline_text(h)


def test_the_headline_markdown_holds_no_raw_python():
    md = headline_markdown(build_headline(_table()))
    assert "{'" not in md and "Ratios:" not in md
    assert "EM sum (0..N)" in md and "tasks with EM > 0" in md and "`squad`" in md


def test_plots_are_inline_images(tmp_path):
    from mem1_core.evaluation.scaling import scaling_plots

    plots = scaling_plots(_table(), tmp_path)
    md = headline_markdown(build_headline(_table()), plots)
    uri = image_markdown(plots["em"], "em")
    assert uri in md and uri.startswith("![em](data:image/png;base64,")
    png = base64.b64decode(uri.split(",", 1)[1].rstrip(")"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == plots["em"].read_bytes()


def _run(tmp_path, name, scale):
    d = tmp_path / name / "eval"
    d.mkdir(parents=True)
    _table(scale).to_csv(d / "metrics.csv", index=False)
    return tmp_path / name


def test_compare_two_runs_side_by_side(tmp_path):
    rows = compare_runs(_run(tmp_path, "a", 1.0), _run(tmp_path, "b", 0.5))
    r = next(r for r in rows if r["agent"] == "mem1-ppo" and r["N"] == 2)
    assert r["EM A"] == "0.80 ± 0.04" and r["EM B"] == "0.40 ± 0.04"
    assert r["B − A"] == pm(-0.4, math.hypot(0.04, 0.04))
    assert r["EM sum A"] == "1.60 ± 0.08" and r["EM sum B"] == "0.80 ± 0.08"
    assert len(rows) == 9


def test_compare_says_which_run_has_no_evaluation(tmp_path):
    with pytest.raises(FileNotFoundError, match="no evaluation table"):
        compare_runs(_run(tmp_path, "a", 1.0), tmp_path / "missing")


def test_compare_cli(tmp_path, capsys):
    from mem1_core.cli.main import main

    assert main(["compare", str(_run(tmp_path, "a", 1.0)), str(_run(tmp_path, "b", 1.0))]) == 0
    out = capsys.readouterr().out
    assert "mem1-ppo" in out and "B − A" in out


def test_the_nightly_trend_accumulates_and_compares_with_the_night_before(tmp_path):
    trend_csv = tmp_path / "nightly" / "trend.csv"
    append_night(trend_csv, "2026-11-29", "ckpt-a", _table(0.5))  # a metrics table (old nights)
    tonight = cells_table(build_headline(_table(1.0)))  # the headline's cells, as nights now do
    append_night(trend_csv, "2026-11-30", "ckpt-b", tonight)
    trend = append_night(trend_csv, "2026-11-30", "ckpt-b", tonight)  # a rerun: no double
    assert sorted(trend["night"].unique()) == ["2026-11-29", "2026-11-30"]
    assert len(trend) == 2 * 9
    rows = previous_night(trend, "2026-11-30")
    r = next(r for r in rows if r["agent"] == "full-ppo" and r["N"] == 1)
    assert r["previous"] == "0.25 ± 0.04" and r["change"] == pm(0.25, math.hypot(0.04, 0.04))
    assert r["tonight EM sum"] == "0.50 ± 0.04"
    assert plot_trend(trend, tmp_path / "trend.png").read_bytes()[:4] == b"\x89PNG"


def test_summaries_carry_the_standard_error_of_the_em_fraction():
    from types import SimpleNamespace

    from mem1_core.evaluation.evaluate import summarize

    rewards = [1.0, 0.0, 0.5, 1.0]
    trajs = [
        SimpleNamespace(
            em_sum=r,
            reward=r,
            score=None,  # QA: no domain reward of its own
            f1=[r],
            peak_tokens=10,
            dependency=1,
            turns=[],
            format_errors=0,
            answer="x",
        )
        for r in rewards
    ]
    got = summarize(trajs, 1.0)["em_frac_se"]
    assert got == pytest.approx(statistics.stdev(rewards) / 2)


def _write_tasks(traj_dir, agent: str, n: int, em: list[list[float]]) -> list:
    """Trajectories of `agent` at N=`n`, task k scoring em[k] per objective, written as the
    evaluation writes them (mem1_core.evaluation.scaling)."""
    from mem1_core.trajectory.record import Trajectory, write_trajectories

    trajs = [
        Trajectory(f"task{k}", "mem1", [1, 2], [["x"]] * n, em=list(e), f1=list(e))
        for k, e in enumerate(em)
    ]
    write_trajectories(trajs, traj_dir / f"{agent}_n{n}.parquet")
    return trajs


def test_a_difference_on_the_same_tasks_gets_its_paired_error(tmp_path):
    """se_paired is the standard error of the mean per-task difference (numpy's sample
    standard deviation over sqrt(tasks)), read from the trajectories the evaluation wrote;
    task difficulty that both agents share cancels in it, and not in the independent se."""
    import numpy as np

    from mem1_core.evaluation.headline import task_scores
    from mem1_core.evaluation.summary import summarize

    rng = np.random.default_rng(0)
    hard = rng.random(40) < 0.5  # tasks both agents fail more often
    ems = {
        "mem1-ppo": [[float(rng.random() < (0.3 if h else 0.9)) for _ in range(2)] for h in hard],
        "full-ppo": [[float(rng.random() < (0.2 if h else 0.8)) for _ in range(2)] for h in hard],
    }
    rows = []
    for agent, em in ems.items():
        trajs = _write_tasks(tmp_path, agent, 2, em)
        rows.append({"agent": agent, "memory": "mem1" if agent == "mem1-ppo" else "full",
                     "n_objectives": 2, **summarize(trajs)})  # fmt: skip
    table = pd.DataFrame(rows)
    h = build_headline(table, task_em=task_scores(tmp_path, table))
    c = next(c for c in h["comparisons"] if c["comparison"] == "mem1_minus_full_em")

    d = np.array([np.mean(a) - np.mean(b) for a, b in zip(*ems.values(), strict=True)])
    assert c["value"] == pytest.approx(d.mean())
    assert c["se_paired"] == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    assert c["se_sum_paired"] == pytest.approx(2 * c["se_paired"])
    assert c["se_paired"] < c["se"]  # the shared difficulty cancels
    # the paired error is what the rendered comparison shows beside the independent one
    row = next(r for r in comparison_rows(h) if r["comparison"] == c["label"])
    assert row["paired SE"] == f"{c['se_paired']:.3f}"
    # and a headline read back from a directory without headline.json recomputes it
    (tmp_path / "trajectories").mkdir()
    for p in tmp_path.glob("*.parquet"):
        p.rename(tmp_path / "trajectories" / p.name)
    table.to_csv(tmp_path / "metrics.csv", index=False)
    again = read_headline(tmp_path)
    assert next(x for x in again["comparisons"] if x["comparison"] == c["comparison"])[
        "se_paired"
    ] == pytest.approx(c["se_paired"])


def test_no_paired_error_unless_both_played_the_same_tasks(tmp_path):
    from mem1_core.evaluation.headline import paired_se, task_scores

    a = _write_tasks(tmp_path, "mem1-ppo", 2, [[1, 0], [1, 1], [0, 0]])
    b = _write_tasks(tmp_path, "full-ppo", 2, [[1, 1], [0, 0]])  # one task fewer
    assert paired_se({"t": 1.0}, {"t": 0.0}) is None  # one task: no spread
    assert paired_se({"t": 1.0, "u": 0.0}, {"t": 1.0, "v": 0.0}) is None
    assert paired_se({"t": 1.0, "u": 0.0}, {"t": 1.0, "u": 0.0}) == 0.0  # identical play
    from mem1_core.evaluation.summary import summarize

    table = pd.DataFrame(
        [{"agent": "mem1-ppo", "memory": "mem1", "n_objectives": 2, **summarize(a)},
         {"agent": "full-ppo", "memory": "full", "n_objectives": 2, **summarize(b)}]
    )  # fmt: skip
    h = build_headline(table, task_em=task_scores(tmp_path, table))
    c = next(c for c in h["comparisons"] if c["comparison"] == "mem1_minus_full_em")
    assert "se_paired" not in c and c["se"] is not None


def test_a_headline_written_before_the_paired_error_gains_it_from_its_trajectories(tmp_path):
    from mem1_core.evaluation.headline import task_scores, write_headline
    from mem1_core.evaluation.summary import summarize

    (tmp_path / "trajectories").mkdir()
    rows = []
    for agent, memory, em in (("mem1-ppo", "mem1", [[1, 1], [1, 0], [0, 0]]),
                              ("full-ppo", "full", [[1, 0], [0, 0], [0, 0]])):  # fmt: skip
        trajs = _write_tasks(tmp_path / "trajectories", agent, 2, em)
        rows.append({"agent": agent, "memory": memory, "n_objectives": 2, **summarize(trajs)})
    table = pd.DataFrame(rows)
    table.to_csv(tmp_path / "metrics.csv", index=False)
    old = build_headline(table, "paper", roles={"mem1": "mem1-ppo", "full": "full-ppo"})
    write_headline(old, tmp_path)
    got = read_headline(tmp_path)
    assert got["scorer"] == "paper" and got["roles"] == old["roles"]
    assert got["task_em"] == task_scores(tmp_path / "trajectories", table)
    c = next(c for c in got["comparisons"] if c["comparison"] == "mem1_minus_full_em")
    assert c["value"] == pytest.approx(0.5 - 1 / 6)
    assert c["se_paired"] == pytest.approx(statistics.stdev([0.5, 0.5, 0.0]) / math.sqrt(3))
