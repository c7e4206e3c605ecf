"""A WebShop evaluation as its users read it: the headline in WebShop's units (reward ×100 and
success rate, over held-out goals) and samples that say what was bought, checked against
definitions computed here from the trajectories of real WebShop episodes (the embedded shops,
the real environment and rollout, the scripted teacher); and QA's headline, whose text the
units leave as it was."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest

from mem1_core.config import load_config
from mem1_core.webshop.pages import BUY_NOW, PageKind
from mem1_core.webshop.teacher import WebShopTeacher

SMALL = [
    "env.n_products=80",
    "env.n_goals=12",
    "data.max_eval_tasks=8",
    "model.tokenizer_vocab=900",
]


class HastyTeacher(WebShopTeacher):
    """The scripted teacher, except that on every other goal it buys the first item it opens
    without choosing its options: a player whose goals end in both successes and misses."""

    def decide(self, traj):
        state, action = super().decide(traj)
        hasty = int(traj.task_id.rpartition("/")[2]) % 2 == 1
        if hasty and self.env.page(traj).kind is PageKind.ITEM:
            return state, f"click[{BUY_NOW}]"
        return state, action


@pytest.fixture(scope="module")
def evaluation(tmp_path_factory):
    """The held-out goals played by the hasty teacher under MEM1's memory (named as the
    pipeline's MEM1 arm) and the teacher under the full context (its full-context arm),
    through the evaluation's own cell writer and metrics table."""
    from mem1_core.domains.inputs import ensure_tokenizer, load_tasks, make_env, prepare
    from mem1_core.evaluation.scaling import Agent, evaluate_scaling

    cfg = load_config("webshop-smoke", None, SMALL)
    root = tmp_path_factory.mktemp("webshop-eval")
    paths = prepare(cfg, root)
    tok = ensure_tokenizer(cfg, paths)
    env = make_env(cfg, paths, tok)
    tasks = load_tasks(cfg, paths, "test", 1)
    agents = [
        Agent("mem1-ppo", "mem1", None, HastyTeacher(tok, env)),
        Agent("full-ppo", "full", None, WebShopTeacher(tok, env)),
    ]
    out = root / "eval"
    table = evaluate_scaling(agents, tok, env, {1: tasks}, cfg.rollout, out, progress=False)
    return cfg, env, tasks, out, table


def _trajs(out, agent: str):
    from mem1_core.trajectory.record import read_trajectories

    return read_trajectories(out / "trajectories" / f"{agent}_n1.parquet")


def _se(xs: list[float]) -> float:
    return statistics.stdev(xs) / len(xs) ** 0.5


def test_the_headline_reports_reward_x100_and_success_rate(evaluation) -> None:
    from mem1_core.evaluation.headline import write_headline
    from mem1_core.evaluation.report import agent_rows, headline_text, pm
    from mem1_core.evaluation.stage import evaluation_headline

    cfg, _env, tasks, out, table = evaluation
    h = evaluation_headline(cfg, out, table)
    write_headline(h, out)
    saved = json.loads((out / "headline.json").read_text())
    cells = {c["agent"]: c for c in saved["cells"]}
    rows = {r["agent"]: r for r in agent_rows(saved)}
    for agent in ("mem1-ppo", "full-ppo"):
        scores = [t.score for t in _trajs(out, agent)]
        assert len(scores) == len(tasks) and None not in scores
        reward_x100, reward_se = 100 * statistics.mean(scores), 100 * _se(scores)
        wins = [float(s == 1.0) for s in scores]  # WebShop's success: reward 1
        success, success_se = statistics.mean(wins), _se(wins)
        c = cells[agent]
        assert c["score"] == pytest.approx(reward_x100)
        assert c["score_se"] == pytest.approx(reward_se)
        assert c["success_rate"] == pytest.approx(success)
        assert c["success_rate_se"] == pytest.approx(success_se)
        assert rows[agent]["reward ×100"] == pm(reward_x100, reward_se)
        assert rows[agent]["success rate"] == pm(success, success_se)
    hasty = [t.score for t in _trajs(out, "mem1-ppo")]
    assert 0 < sum(s == 1.0 for s in hasty) < len(hasty)  # both successes and misses
    text = headline_text(saved)
    for qa in ("EM fraction", "EM sum", "EM > 0", "objectives"):
        assert qa not in text
    assert "reward ×100" in text and "success rate" in text


def test_the_comparisons_are_in_reward_x100(evaluation) -> None:
    from mem1_core.evaluation.report import comparison_rows
    from mem1_core.evaluation.stage import evaluation_headline

    cfg, _env, _tasks, out, table = evaluation
    h = evaluation_headline(cfg, out, table)
    mem1 = {t.task_id: t.score for t in _trajs(out, "mem1-ppo")}
    full = {t.task_id: t.score for t in _trajs(out, "full-ppo")}
    [c] = [c for c in h["comparisons"] if c["comparison"] == "mem1_minus_full_em"]
    assert c["label"] == "MEM1 − full context, reward ×100"
    assert c["value"] == pytest.approx(
        100 * (statistics.mean(mem1.values()) - statistics.mean(full.values()))
    )
    assert c["se_paired"] == pytest.approx(100 * _se([mem1[t] - full[t] for t in mem1]))
    assert "value_sum" not in c  # one goal a task: no sum over objectives
    assert all("EM" not in k for r in comparison_rows(h) for k in r)


def test_the_summary_speaks_webshop(evaluation, tmp_path) -> None:
    """summary.md's headline, as the pipeline renders it from the run directory."""
    import shutil

    from mem1_core.evaluation.headline import write_headline
    from mem1_core.evaluation.run_summary import render_headline, run_headline
    from mem1_core.evaluation.stage import evaluation_headline

    cfg, _env, _tasks, out, table = evaluation
    shutil.copytree(out, tmp_path / "eval")
    table.to_csv(tmp_path / "eval" / "metrics.csv", index=False)
    write_headline(evaluation_headline(cfg, out, table), tmp_path / "eval")
    md = render_headline(run_headline(tmp_path, {}), images=False)
    assert md.startswith("reward ×100 and success rate over held-out goals")
    assert "Scored with WebShop's reward" in md and "`squad`" not in md
    assert "entities no training task mentions" not in md and "EM fraction" not in md


def test_samples_say_what_was_bought_and_its_reward(evaluation) -> None:
    from mem1_core.domains.registry import domain_of
    from mem1_core.evaluation.samples import SAMPLE_TASKS, write_samples

    cfg, env, tasks, out, _table = evaluation
    questions = {t.task_id: t.questions for t in tasks}
    paths = write_samples(out, {"mem1-ppo": "mem1"}, [1], questions, domain_of(cfg).sample_outcome)
    md = paths["mem1-ppo"].read_text()
    assert "objectives right" not in md and "gold" not in md
    for t in _trajs(out, "mem1-ppo")[:SAMPLE_TASKS]:
        # what was bought, from where the episode ended: the item page and its selections
        page = env.page(t)
        _, shop = env.shop_of(t.task_id)
        title = shop.product(page.asin).title
        chosen = ", ".join(f"{g}: {v}" for g, v in page.selected) or "none chosen"
        assert f"reward {t.score:.2f}, bought {page.asin}" in md
        assert f"- bought: {title} ({page.asin}), options: {chosen}" in md
        assert f"- instruction: {env.goal(t.task_id).instruction}" in md
        assert (f"- reward: {t.score:.2f}, a success" in md) == (t.score == 1.0)


def test_the_evaluation_stage_writes_webshop_units(tmp_path) -> None:
    """The stage itself (the teacher's reference rows): headline.json records the domain and
    its units, and the samples and the summary's headline read as WebShop."""
    from mem1_core.evaluation.stage import run_objective_scaling

    cfg = load_config("webshop-smoke", None, SMALL)
    result = run_objective_scaling(cfg, tmp_path, tmp_path / "eval", [], progress=False)
    h = json.loads((tmp_path / "eval" / "headline.json").read_text())
    assert h["domain"] == "webshop" and h["units"]["score"] == "reward"
    assert h["units"]["scale"] == 100 and h["units"]["success"] == 1.0
    assert {"score", "score_se", "success_rate", "success_rate_se"} <= set(h["cells"][0])
    assert result["units"] == h["units"]
    md = (tmp_path / "eval" / "samples" / "teacher.md").read_text()
    assert "- bought: " in md and "objectives right" not in md


def test_mem1_show_tells_a_webshop_outcome(evaluation, tmp_path, capsys) -> None:
    import shutil

    from mem1_core.cli.main import main
    from mem1_core.evaluation.headline import write_headline
    from mem1_core.evaluation.stage import evaluation_headline

    cfg, _env, _tasks, out, table = evaluation
    shutil.copytree(out, tmp_path / "eval")
    write_headline(evaluation_headline(cfg, out, table), tmp_path / "eval")
    assert main(["show", str(tmp_path), "--agent", "mem1-ppo", "-n", "1", "--task", "1"]) == 0
    shown = capsys.readouterr().out
    t = _trajs(out, "mem1-ppo")[1]
    assert f"reward {t.score:.2f}, bought" in shown and "  bought: " in shown


# ---- QA: the same headline as before units -------------------------------------------------


def _qa_table() -> pd.DataFrame:
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
                    "memory": memory,
                    "n_objectives": n,
                    "em_frac": em,
                    "em_sum": em * n,
                    "em_frac_se": 0.04,
                    "peak_tokens": peak * (1 if memory == "mem1" else n),
                    "peak_tokens_credited": peak * 1.1,
                }
            )
    return pd.DataFrame(rows)


def test_a_qa_headline_reads_as_one_written_before_units(tmp_path) -> None:
    """A QA run's headline, built in its domain's units, renders exactly as a headline.json
    written before headlines recorded units (no `units`, no `score` in its cells: QA's then),
    read back from disk."""
    from mem1_core.domains.registry import domain_of
    from mem1_core.evaluation.headline import HEADLINE_FILE, build_headline, read_headline
    from mem1_core.evaluation.report import (
        agent_rows,
        comparison_rows,
        headline_markdown,
        headline_text,
    )
    from mem1_core.evaluation.run_summary import render_headline

    qa = domain_of(load_config("smoke", None, []))
    now = build_headline(_qa_table(), "squad", units=qa.units, domain=qa.name)
    old = {k: v for k, v in now.items() if k not in ("units", "domain")}
    old["cells"] = [
        {k: v for k, v in c.items() if k not in ("score", "score_se")} for c in now["cells"]
    ]
    (tmp_path / HEADLINE_FILE).write_text(json.dumps(old))
    before = read_headline(tmp_path)
    for render in (headline_text, headline_markdown, agent_rows, comparison_rows):
        assert render(now) == render(before)
    summary = lambda h: render_headline({"eval_headline": h, "plots": {}})  # noqa: E731
    assert summary(now) == summary(before)
    assert summary(now).startswith(
        "EM over held-out tasks (entities no training task mentions), greedy."
    )
    assert "Scored with `squad` (eval.scorer)" in summary(now)
    assert [c["em_frac"] for c in now["cells"]] == [c["score"] for c in now["cells"]]
