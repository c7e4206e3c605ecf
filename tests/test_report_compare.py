"""The headline table, the inline plots, `mem1 compare` and the nightly trend, checked
against tables whose answers are known by construction."""

from __future__ import annotations

import base64
import math
import statistics

import pandas as pd
import pytest

from mem1_core.evaluation.compare import append_night, compare_runs, plot_trend, previous_night
from mem1_core.evaluation.report import (
    decimals,
    headline_markdown,
    headline_rows,
    image_markdown,
    paper_ratios,
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


def test_the_headline_has_one_row_per_agent_and_a_cell_per_n():
    rows = headline_rows(_table())
    assert [r["agent"] for r in rows] == ["mem1-ppo", "full-ppo", "mem1-sft"]
    assert rows[0]["N=16 EM"] == "0.80 ± 0.04" and rows[1]["N=16 peak"] == "16000"


def test_the_paper_ratios_are_computed_from_the_table():
    got = {r["ratio"]: r["value"] for r in paper_ratios(_table())}
    assert got["MEM1 / full-context peak tokens at N=16"] == f"{300 / 16000:.2f}"
    assert got["MEM1 peak tokens, N=16 / N=1"] == "1.00"
    se = math.hypot(0.04, 0.04)
    assert got["RL − SFT EM fraction at N=16"] == pm(0.4, se)


def test_plots_are_inline_images(tmp_path):
    from mem1_core.evaluation.scaling import scaling_plots

    plots = scaling_plots(_table(), tmp_path)
    md = headline_markdown(_table(), plots)
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
    append_night(trend_csv, "2026-11-29", "ckpt-a", _table(0.5))
    append_night(trend_csv, "2026-11-30", "ckpt-b", _table(1.0))
    trend = append_night(trend_csv, "2026-11-30", "ckpt-b", _table(1.0))  # a rerun: no double
    assert sorted(trend["night"].unique()) == ["2026-11-29", "2026-11-30"]
    assert len(trend) == 2 * 9
    rows = previous_night(trend, "2026-11-30")
    r = next(r for r in rows if r["agent"] == "full-ppo" and r["N"] == 1)
    assert r["previous"] == "0.25 ± 0.04" and r["change"] == pm(0.25, math.hypot(0.04, 0.04))
    assert plot_trend(trend, tmp_path / "trend.png").read_bytes()[:4] == b"\x89PNG"


def test_summaries_carry_the_standard_error_of_the_em_fraction():
    from types import SimpleNamespace

    from mem1_core.evaluation.evaluate import summarize

    rewards = [1.0, 0.0, 0.5, 1.0]
    trajs = [
        SimpleNamespace(
            em_sum=r,
            reward=r,
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
