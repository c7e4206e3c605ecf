"""A WebShop run's pieces through the pipeline's own entry points: `env.kind=webshop` selects
the shops, their task files, the tokenizer and the environment; the scripted teacher's
trajectories, the evaluation's rescoring and its summary take them like QA's."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from mem1_core.config import load_config

SMALL = [
    "env.n_products=80",
    "env.n_goals=12",
    "data.max_eval_tasks=6",
    "model.tokenizer_vocab=900",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from mem1_core.domains.inputs import ensure_tokenizer, make_env, prepare

    cfg = load_config("webshop-smoke", None, SMALL)
    paths = prepare(cfg, tmp_path_factory.mktemp("webshop-run"))
    tok = ensure_tokenizer(cfg, paths)
    return cfg, paths, tok, make_env(cfg, paths, tok)


def test_the_run_has_a_training_shop_a_held_out_shop_and_no_index(run) -> None:
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.webshop.generate import generate_shop

    cfg, paths, tok, env = run
    assert env.kind == "webshop" and sorted(env.shops) == ["shop0", "shop1"]
    assert not paths.indexes.exists()  # no retriever: the shop searches itself
    train, test = load_tasks(cfg, paths, "train", 1), load_tasks(cfg, paths, "test", 1)
    assert len(train) == 12 and len(test) == 6
    assert {t.task_id.split("/")[0] for t in train} == {"shop0"}
    assert {t.task_id.split("/")[0] for t in test} == {"shop1"}  # held out: another seed
    held_out = generate_shop(1, 80, 12)
    assert [t.questions[0] for t in test] == [g.instruction for g in held_out.goals[:6]]
    table = pq.read_table(paths.task_file("test", 1))
    assert table["difficulty"].to_pylist() == [g.difficulty for g in held_out.goals[:6]]
    with pytest.raises(ValueError, match="one objective"):
        load_tasks(cfg, paths, "test", 2)


def test_teacher_data_rescoring_and_summary(run) -> None:
    from mem1_core.domains.inputs import load_tasks
    from mem1_core.evaluation.evaluate import rescore
    from mem1_core.evaluation.summary import summarize
    from mem1_core.training.sft import has_teacher, teacher_trajectories

    cfg, paths, tok, env = run
    assert has_teacher(cfg)
    tasks = load_tasks(cfg, paths, "test", 1)
    trajs = teacher_trajectories(tasks, tok, env, cfg.rollout, memory="mem1")
    assert all(t.done and t.format_errors == 0 for t in trajs)
    assert not any(tok.unk_token in x.gen_text for t in trajs for x in t.turns)
    # evaluation's rescoring (a QA scorer) leaves a domain's own reward alone
    assert [t.reward for t in rescore(trajs, "squad")] == [t.reward for t in trajs]
    s = summarize(trajs)
    rewards = [t.score for t in trajs]
    assert s["reward_x100"] == pytest.approx(100 * sum(rewards) / len(rewards))
    assert s["success_rate"] == pytest.approx(sum(r == 1.0 for r in rewards) / len(rewards))
    assert s["em_frac"] == pytest.approx(sum(rewards) / len(rewards))


def test_a_qa_run_has_no_webshop_columns() -> None:
    from mem1_core.evaluation.summary import summarize
    from mem1_core.trajectory.record import Trajectory

    traj = Trajectory("t", "mem1", [1, 2], [["a"]], em=[1.0], f1=[1.0], done=True)
    assert "reward_x100" not in summarize([traj]) and traj.reward == 1.0


def test_reward_and_peak_tokens_by_difficulty(tmp_path) -> None:
    """Grouped by hand: two tasks of difficulty 2 (rewards 1 and 0.5), one of 3 (reward 0)."""
    from mem1_core.trajectory.record import Action, Trajectory, Turn
    from mem1_core.webshop.difficulty import by_difficulty, write_difficulty

    def traj(task_id: str, score: float, context: int) -> Trajectory:
        tr = Trajectory(task_id, "mem1", [1], [["x"]], score=score, done=True)
        tr.turns = [Turn([], [7] * 10, [], Action.CLICK, context_tokens=context)]
        return tr

    trajs = {"a": [traj("s/0", 1.0, 100), traj("s/1", 0.5, 200), traj("s/2", 0.0, 300)]}
    rows = by_difficulty(trajs, {"s/0": 2, "s/1": 2, "s/2": 3})
    assert [(r["difficulty"], r["tasks"]) for r in rows] == [(2, 2), (3, 1)]
    assert rows[0]["reward_x100"] == pytest.approx(75.0)
    assert rows[0]["reward_x100_se"] == pytest.approx(100 * 0.25)  # sd 0.3536 / sqrt(2)
    assert rows[0]["success_rate"] == 0.5 and rows[0]["peak_tokens"] == pytest.approx(160.0)
    assert rows[1]["reward_x100"] == 0.0 and rows[1]["peak_tokens"] == 310.0
    out = write_difficulty(trajs, {"s/0": 2, "s/1": 2, "s/2": 3}, tmp_path)
    assert (tmp_path / "difficulty.png").stat().st_size > 0 and out["table"].endswith(".json")
    with pytest.raises(KeyError, match="no difficulty"):
        by_difficulty(trajs, {"s/0": 2})


def test_every_env_kind_has_an_environment_and_a_bad_kind_says_which() -> None:
    from mem1_core.config.env import ENV_KINDS
    from mem1_core.domains.base import Domain
    from mem1_core.domains.registry import DOMAINS, get_domain

    assert set(ENV_KINDS) == set(DOMAINS)
    for kind in ENV_KINDS:  # each registry line names a Domain of that name
        assert isinstance(get_domain(kind), Domain) and get_domain(kind).name == kind
    with pytest.raises(ValueError, match="env.kind='shop': no such domain"):
        get_domain("shop")
    with pytest.raises(ValueError, match="env.kind='shop': use one of qa, webshop"):
        load_config("smoke", None, ["env.kind=shop"])
    with pytest.raises(ValueError, match="held-out shop"):
        load_config("webshop-smoke", None, ["env.eval_shop_seed=0"])


def test_a_converted_shop_serves_every_split_in_webshops_order(tmp_path) -> None:
    """`env.shop_dir`: one shop for every split, its goals in WebShop's shuffled order; a shop
    of 12 goals, under WebShop's 500 + 1,000, is cut in quarters (tests/test_webshop_fidelity.py
    pins the full sizes)."""
    import random

    from mem1_core.runs.layout import RunPaths
    from mem1_core.webshop.generate import generate_shop
    from mem1_core.webshop.run import run_shops, split_goals

    generate_shop(5, 40, 12).save(tmp_path / "shop")
    cfg = load_config("webshop-smoke", None, [f"env.shop_dir={tmp_path / 'shop'}"])
    order = list(range(12))
    state = random.getstate()
    random.seed(233)
    random.shuffle(order)
    random.setstate(state)
    assert split_goals(cfg, "test") == ("shop", order[:3])
    assert split_goals(cfg, "dev") == ("shop", order[3:6])
    assert split_goals(cfg, "train") == ("shop", order[6:])
    assert list(run_shops(cfg, RunPaths(tmp_path / "run"))) == ["shop"]
    with pytest.raises(ValueError, match="train, dev, test"):
        split_goals(cfg, "validation")
