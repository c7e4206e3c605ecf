"""The experiment's settings, its stages' bookkeeping and its headline across seeds and worlds.

The headline is checked against the estimators computed here by hand, the slow obvious way:
per seed the mean and standard error over tasks; pooled, each task's score averaged over seeds
first; a difference's paired error over the per-task differences; a claim held only where every
seed and the pooled figure clear the bar."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from statistics import NormalDist

import pytest

from mem1_core.config import PPOConfig, config_json
from mem1_core.experiment.configs import (
    agent_play_overrides,
    arm_config,
    base_config,
    eval_config,
    warm_start_config,
)
from mem1_core.experiment.headline import (
    POOLED,
    claims_for,
    experiment_headline,
    holm,
    one_sided_p,
)
from mem1_core.experiment.parse import load_experiment
from mem1_core.experiment.plan import (
    ArmRun,
    arm_runs,
    check_run_dir,
    eval_agents,
    finished,
    link_reused,
    split_agent,
)
from mem1_core.experiment.report import (
    claims_markdown,
    headline_markdown,
    plot_scaling,
    walls_markdown,
)
from mem1_core.experiment.spec import ExperimentSpec, PaperClaims
from mem1_core.experiment.walls import StageWalls

# ---- settings -----------------------------------------------------------------------------


def test_the_smol_experiment_reads_its_settings_and_a_set_wins():
    spec = load_experiment("smol")
    assert {a: (x.trainer, x.memory, x.seeds) for a, x in spec.arms.items()} == {
        "mem1-ppo": ("ppo", "mem1", (0, 1)), "full-ppo": ("ppo", "full", (0, 1)),
        "mem1-sft": ("sft", "mem1", (0,)),
    }  # fmt: skip
    assert spec.worlds == (4242,) and spec.objectives == (1, 2, 4, 8, 16)
    c = base_config(spec)
    assert (c.ppo.iterations, c.ppo.actor_lr, c.ppo.critic_lr, c.sft.steps) == (12, 1e-5, 5e-5, 48)
    # 2 held-out points over the 12 iterations, at N=8 beside the training N
    assert c.ppo.eval_every == 6 and list(c.ppo.eval_objectives) == [8]
    c = base_config(load_experiment("smol", ["ppo.iterations=8", "ppo.actor_lr=3e-5"]))
    assert (c.ppo.iterations, c.ppo.actor_lr, c.ppo.eval_every) == (8, 3e-5, 4)
    # the experiment's own keys from the command line: another N, more tasks, a third seed
    more = load_experiment(
        "smol",
        ["experiment.eval.objectives=[2]", "experiment.eval.objectives_per_n=512",
         "experiment.arms.mem1-ppo.seeds=[0, 1, 2]", "ppo.iterations=8"],
    )  # fmt: skip
    assert more.objectives == (2,) and more.objectives_per_n == 512
    assert more.arms["mem1-ppo"].seeds == (0, 1, 2) and "ppo.iterations=8" in more.overrides
    assert not any(o.startswith("experiment.") for o in more.overrides)
    smoke = load_experiment("smoke")  # evaluation-only settings reach the evaluation alone
    assert eval_config(smoke, 0).rollout.turns_per_objective == 1
    assert base_config(smoke).rollout.turns_per_objective == 2
    ev = eval_config(spec, 4242)
    assert ev.world.seed == 4242 and ev.data.eval_tasks(16) == 8 and ev.data.eval_tasks(1) == 128


ARM = "{trainer: ppo, memory: mem1, seeds: [0]}"


@pytest.mark.parametrize(
    "text, message",
    [
        (f"profile: smoke\narms: {{a: {ARM}}}\nevals: {{}}\n", "unknown keys"),
        ("profile: smoke\narms: {mem1-ppo: [0]}\n", r"arm mem1-ppo: write it as \{trainer"),
        (f"profile: smoke\narms: {{a: {ARM}}}\neval: {{agents: [full-ppo]}}\n", "add the arm"),
        (f"arms: {{a: {ARM}}}\n", "profile"),
        ("profile: smoke\narms: {a: {trainer: dpo, memory: mem1, seeds: [0]}}\n", "trainer 'dpo'"),
        ("profile: smoke\narms: {a: {trainer: ppo, memory: flat, seeds: [0]}}\n", "memory 'flat'"),
        (
            "profile: smoke\narms: {a: {trainer: ppo, memory: mem1, seeds: [0], lr: 1}}\n",
            r"arm a: unknown keys \['lr'\]",
        ),
        (f"profile: smoke\narms: {{a: {ARM}, b: {ARM}}}\n", "arms a and b train the same"),
        (
            "profile: smoke\narms: {a: {trainer: ppo, memory: mem1, seeds: [0], warm_start: w}}\n",
            "warm start 'w', which `warm_starts:` does not declare",
        ),
        (
            f"profile: smoke\narms: {{a: {ARM}}}\neval: {{plays: {{t: {{arm: b, memory: full}}}}, agents: [t]}}\n",
            "plays arm 'b', which the experiment does not train",
        ),
        (
            f"profile: smoke\narms: {{a: {ARM}}}\nclaims: {{full_test: equal}}\n",
            r"claims.full_test 'equal'; use one of \['above', 'not_below'\]",
        ),
        (
            f"profile: smoke\narms: {{a: {ARM}}}\nclaims: {{above: [{{a: a, b: c, objectives: [4]}}]}}\n",
            r"missing \['c'\]",
        ),
    ],
)
def test_a_bad_experiment_file_says_what_to_fix(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_experiment(str(path))
    with pytest.raises(ValueError, match="the experiments are"):
        load_experiment("no-such-experiment")


# ---- stages -------------------------------------------------------------------------------


def _metrics(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_arm_is_finished_only_at_its_count(tmp_path):
    spec = load_experiment("smoke")
    cfg = base_config(spec)  # 2 PPO iterations
    run = ArmRun("mem1-ppo", 1, tmp_path / "ppo_mem1" / "seed1", "ppo")
    assert not finished(run, cfg)
    _metrics(run.dir, [{"iteration": 0}])
    assert not finished(run, cfg)
    _metrics(run.dir, [{"iteration": 0}, {"iteration": 1}])  # no stopped_by: killed after it
    assert not finished(run, cfg)
    _metrics(run.dir, [{"iteration": 0}, {"iteration": 1, "stopped_by": "iterations"}])
    assert finished(run, cfg)
    sft = ArmRun("mem1-sft", 0, tmp_path / "sft_mem1" / "seed0", "sft")
    _metrics(sft.dir, [{"step": 3, "stopped_by": "steps"}])
    assert not finished(sft, cfg)  # no policy nor result.json yet
    (sft.dir / "policy").mkdir()
    (sft.dir / "result.json").write_text("{}")
    assert finished(sft, cfg)


def test_reuse_links_finished_arms_and_refuses_one_short_of_its_count(tmp_path):
    spec = load_experiment("smoke")
    cfg = base_config(spec)
    src = tmp_path / "src"
    (src / "warm_start" / "policy").mkdir(parents=True)
    check_run_dir(src, spec, cfg)  # its record: the same training settings
    with pytest.raises(ValueError, match="its warm start has not finished"):
        link_reused(spec, cfg, src, tmp_path / "early")
    (src / "warm_start" / "result.json").write_text("{}")
    _metrics(src / "ppo_mem1" / "seed0", [{"iteration": 1, "stopped_by": "iterations"}])
    out = tmp_path / "new"
    linked = link_reused(spec, cfg, src, out)
    assert sorted(linked) == ["ppo_mem1/seed0", "warm_start"]
    assert (out / "ppo_mem1" / "seed0").resolve() == (src / "ppo_mem1" / "seed0").resolve()
    assert not (out / "ppo_full").exists()  # never ran there: trained here
    _metrics(src / "ppo_full" / "seed1", [{"iteration": 0}])
    with pytest.raises(ValueError, match=r"full-ppo · seed 1 has not finished its 2 iterations"):
        link_reused(spec, cfg, src, tmp_path / "other")
    # a run trained under other settings is not this experiment's, whatever it has finished
    other = load_experiment("smoke", ["ppo.actor_lr=3e-5"])
    with pytest.raises(ValueError, match=r"other settings \(ppo.actor_lr\)"):
        link_reused(other, base_config(other), src, tmp_path / "third")


@pytest.mark.parametrize(
    ("name", "reused"),
    [
        ("modes", ["ppo_mem1/seed0", "ppo_mem1/seed1", "warm_start"]),
        ("horizon", ["ppo_full/seed0", "ppo_full/seed1", "ppo_mem1/seed0", "ppo_mem1/seed1",
                     "sft_mem1/seed0", "warm_start"]),
    ],
)  # fmt: skip
def test_an_experiment_reuses_a_finished_smol_runs_stages(name, reused, tmp_path):
    # the modes experiment's tree arm and the horizon experiment's paper arms (two of their
    # seeds) are the smol experiment's, under one config: a finished smol run's stages are
    # linked, and only the rest trains
    smol, spec = load_experiment("smol"), load_experiment(name)
    src = tmp_path / "smol"
    for ws in ("warm_start", "sft_mem1/seed0"):
        (src / ws / "policy").mkdir(parents=True)
        (src / ws / "result.json").write_text("{}")
    check_run_dir(src, smol, base_config(smol))
    for arm in ("ppo_mem1", "ppo_full"):
        for seed in (0, 1):
            _metrics(src / arm / f"seed{seed}", [{"iteration": 11, "stopped_by": "iterations"}])
    walls = StageWalls(src)
    for stage, seconds in (("warm start", 600.0), ("mem1-ppo · seed 0", 3000.0)):
        with walls.stage(stage):
            pass
        walls._add(stage, seconds)
    assert sorted(link_reused(spec, base_config(spec), src, tmp_path / name)) == reused
    # the linked stages keep the walls they took where they trained, marked as reused
    mine = StageWalls(tmp_path / name)
    assert mine.read() == pytest.approx(walls.read())
    assert mine.reused() == {s: str(src.resolve()) for s in walls.read()}
    assert mine.cpus() == walls.cpus()
    table = walls_markdown(
        {"walls": mine.read(), "cpus": mine.cpus(), "walls_reused": mine.reused()}
    )
    assert "| mem1-ppo · seed 0 (trained in smol, linked) | 50.0 |" in table
    assert "| total | 60.0 | |" in table and "| of which trained in this run | 0.0 | |" in table
    if name == "modes":
        assert arm_config(spec, "mem1-ppo", 0).trajectory.mode == "tree"
        assert {arm_config(spec, a, 0).trajectory.mode for a in spec.arms} == {
            "tree",
            "turns",
            "concat",
        }


def test_a_run_directory_refuses_a_config_that_trains_differently(tmp_path):
    spec = load_experiment("smoke")
    check_run_dir(tmp_path, spec, base_config(spec))
    check_run_dir(tmp_path, spec, base_config(spec))  # the same again: resumed
    # another seed, world or N is new work on the same arms: allowed
    more = load_experiment(
        "smoke", ["experiment.arms.mem1-ppo.seeds=[0, 1, 2]", "eval.scorer=squad"]
    )
    check_run_dir(tmp_path, more, base_config(more))
    # where and how often it checkpoints is not what it trains: resumed elsewhere, allowed
    moved = load_experiment(
        "smoke", ["ppo.checkpoint_every=4", "resources.ray_address=10.0.0.1:6379"]
    )
    check_run_dir(tmp_path, moved, base_config(moved))
    lr = load_experiment("smoke", ["ppo.actor_lr=3e-5", "ppo.checkpoint_every=4"])
    with pytest.raises(ValueError, match=r"other settings \(ppo.actor_lr\); give another run name"):
        check_run_dir(tmp_path, lr, base_config(lr))


def test_a_field_added_after_a_run_began_changes_it_only_off_its_default(tmp_path):
    """A run recorded before a config field existed resumes under code that has it, where the
    field keeps its default (the behaviour the run trained with); set otherwise, it is a change."""
    spec = load_experiment("smoke")
    check_run_dir(tmp_path, spec, base_config(spec))
    record = json.loads((tmp_path / "experiment.json").read_text())
    # as if ppo.iterations (the smoke profile sets 2, the default is not 2) were new
    assert base_config(spec).ppo.iterations != PPOConfig().iterations
    del record["config"]["ppo"]["iterations"]
    del record["config"]["teacher"]  # as if the whole section were new (smoke: all defaults)
    (tmp_path / "experiment.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"other settings \(ppo.iterations\)"):
        check_run_dir(tmp_path, spec, base_config(spec))
    record["config"]["ppo"]["iterations"] = base_config(spec).ppo.iterations
    (tmp_path / "experiment.json").write_text(json.dumps(record))
    check_run_dir(tmp_path, spec, base_config(spec))  # teacher.* all at their defaults
    changed = load_experiment("smoke", ["teacher.error_rate=0.5"])
    with pytest.raises(ValueError, match=r"teacher.error_rate"):
        check_run_dir(tmp_path, changed, base_config(changed))


def test_each_arm_and_seed_is_a_stage_and_each_agent_seed_is_evaluated(tmp_path):
    spec = load_experiment("smoke")
    runs = arm_runs(spec, tmp_path)
    assert [r.label for r in runs] == [
        "mem1-ppo · seed 0", "mem1-ppo · seed 1", "full-ppo · seed 0", "full-ppo · seed 1",
        "mem1-sft · seed 0",
    ]  # fmt: skip
    for d in [tmp_path / "warm_start", *(r.dir for r in runs)]:
        (d / "policy").mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):  # a saved policy, as far as found
            (d / "policy" / name).write_text("{}")
    agents = eval_agents(spec, tmp_path)
    assert [(a, m) for a, _, m in agents] == [
        ("warm-start", "mem1"), ("mem1-ppo-s0", "mem1"), ("mem1-ppo-s1", "mem1"),
        ("full-ppo-s0", "full"), ("full-ppo-s1", "full"), ("mem1-sft-s0", "mem1"),
    ]  # fmt: skip
    assert [split_agent(a) for a, _, _ in agents][:2] == [("warm-start", None), ("mem1-ppo", 0)]
    assert split_agent("mem1-ppo-s1") == ("mem1-ppo", 1)
    assert split_agent("warm-start") == ("warm-start", None)


# ---- the headline, against the estimators computed by hand ---------------------------------


def _scores(rng: random.Random, tasks: int, p: dict[str, float], peak: dict[str, float]):
    """agent -> {N: {task: (EM, peak)}} with EM ~ Bernoulli(p[agent]) per task."""
    out = {}
    for agent, prob in p.items():
        for n in (2, 8, 16):
            out.setdefault(agent, {})[n] = {
                f"t{n}-{k}": (float(rng.random() < prob), peak[split_agent(agent)[0]] * n + k)
                for k in range(tasks)
            }
    return out


P = {"warm-start": 0.3, "mem1-ppo-s0": 0.6, "mem1-ppo-s1": 0.35, "full-ppo-s0": 0.3,
     "full-ppo-s1": 0.3, "mem1-sft-s0": 0.1}  # fmt: skip
PEAK = {"warm-start": 30.0, "mem1-ppo": 30.0, "full-ppo": 200.0, "mem1-sft": 30.0}


def _se(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


@pytest.fixture(scope="module")
def headline():
    rng = random.Random(7)
    evals = {0: _scores(rng, 64, P, PEAK), 4242: _scores(rng, 64, P, PEAK)}
    return experiment_headline(evals, 0, 2, se_bar=2.0, ratio_bar=0.3), evals


def test_cells_per_seed_and_pooled_are_the_estimators_by_hand(headline):
    h, evals = headline
    s = evals[0]
    cells = {(c["agent"], c["seed"], c["N"]): c for c in h["worlds"]["0"]["cells"]}
    for seed in (0, 1):
        em = [v[0] for v in s[f"mem1-ppo-s{seed}"][8].values()]
        c = cells[("mem1-ppo", seed, 8)]
        assert c["em_frac"] == pytest.approx(sum(em) / 64)
        assert c["em_frac_se"] == pytest.approx(_se(em))
        assert c["em_sum"] == pytest.approx(8 * sum(em) / 64)
        assert c["em_sum_se"] == pytest.approx(8 * _se(em))
    tasks = s["mem1-ppo-s0"][8]
    avg = [(s["mem1-ppo-s0"][8][t][0] + s["mem1-ppo-s1"][8][t][0]) / 2 for t in tasks]
    pooled = cells[("mem1-ppo", POOLED, 8)]
    assert pooled["em_frac"] == pytest.approx(sum(avg) / 64)
    assert pooled["em_frac_se"] == pytest.approx(_se(avg))
    # the warm start trains once: a pooled row, no per-seed rows
    assert ("warm-start", POOLED, 2) in cells and ("warm-start", 0, 2) not in cells


def test_comparisons_pair_by_task_per_seed_and_pooled(headline):
    h, evals = headline
    s = evals[4242]
    claim = {c["key"]: c for c in h["claims"]}["mem1_above_start"]["worlds"]["4242"]
    tasks = s["warm-start"][2]
    for seed in (0, 1):
        d = [s[f"mem1-ppo-s{seed}"][2][t][0] - s["warm-start"][2][t][0] for t in tasks]
        got = claim["seeds"][str(seed)]
        assert got["value"] == pytest.approx(sum(d) / len(d))
        assert got["se_paired"] == pytest.approx(_se(d))
        assert got["value_sum"] == pytest.approx(2 * sum(d) / len(d))
        assert got["holds"] == (sum(d) / len(d) > 2 * _se(d))
    d = [
        (s["mem1-ppo-s0"][2][t][0] + s["mem1-ppo-s1"][2][t][0]) / 2 - s["warm-start"][2][t][0]
        for t in tasks
    ]
    assert claim[POOLED]["value"] == pytest.approx(sum(d) / len(d))
    assert claim[POOLED]["se_paired"] == pytest.approx(_se(d))
    # RL above SFT: each PPO seed against the SFT arm's one seed
    rl = {c["key"]: c for c in h["claims"]}["rl_above_sft@8"]["worlds"]["4242"]
    d1 = [s["mem1-ppo-s1"][8][t][0] - s["mem1-sft-s0"][8][t][0] for t in s["mem1-sft-s0"][8]]
    assert rl["seeds"]["1"]["value"] == pytest.approx(sum(d1) / len(d1))


def test_a_claim_holds_only_where_every_seed_and_the_pool_clear_the_bar(headline):
    h, _ = headline
    claims = {c["key"]: c for c in h["claims"]}
    assert set(claims) == {
        "mem1_above_start", "mem1_above_full@8", "mem1_above_full@16",
        "mem1_peak_over_full@16", "rl_above_sft@8", "rl_above_sft@16",
    }  # fmt: skip
    for key, c in claims.items():
        for w in c["worlds"].values():
            seeds_ok = all(g["holds"] for g in w["seeds"].values())
            if w["verdict"] == "holds":
                assert seeds_ok and w[POOLED]["holds"], key
            elif w["verdict"].startswith("seed"):
                held = w["verdict"].removeprefix("seed ").removesuffix(" only").split(", ")
                assert held == [s for s, g in w["seeds"].items() if g["holds"]]
                assert not seeds_ok or not w[POOLED]["holds"]
    # seed 0 (p 0.6) clears the start's bar at N=2 on 64 tasks, seed 1 (p 0.35) does not
    start = claims["mem1_above_start"]["worlds"]["0"]
    assert start["seeds"]["0"]["holds"] and not start["seeds"]["1"]["holds"]
    assert start["verdict"] == "seed 0 only"
    # peak tokens: 30 N + k against 200 N + k, a ratio under 0.3 for both seeds
    peak = claims["mem1_peak_over_full@16"]["worlds"]["0"]
    want = sum(30 * 16 + k for k in range(64)) / sum(200 * 16 + k for k in range(64))
    assert peak[POOLED]["value"] == pytest.approx(want) and peak["verdict"] == "holds"


def test_webshops_claims_hold_mem1_not_below_the_full_context_at_its_one_n():
    # WebShop (the paper: 70.87 against 70.80): MEM1 matches the full context at N=1, at a
    # fraction of its peak tokens. Losing d on k of n goals is a paired z of
    # -sqrt(p (n - 1) / (1 - p)), p = k / n: 3 of 40 -1.78 (within 2 SE), 6 of 40 -2.62.
    tasks = [f"g{k}" for k in range(40)]
    full = {t: (0.8 if k % 2 else 0.6, 1000.0 + k) for k, t in enumerate(tasks)}

    def world(lost: dict[int, int]):  # MEM1 seed -> the goals it loses 0.2 on
        mem1 = {f"mem1-ppo-s{s}": {1: {t: (full[t][0] - 0.2 * (k < n), 300.0 + k)
                                       for k, t in enumerate(tasks)}}
                for s, n in lost.items()}  # fmt: skip
        start = {t: (0.5, 300.0) for t in tasks}
        return {"warm-start": {1: start}, "full-ppo-s0": {1: full}, "full-ppo-s1": {1: full},
                **mem1}  # fmt: skip

    paper = PaperClaims(full_at=(1,), full_test="not_below", peak_at=1)
    h = experiment_headline({0: world({0: 3, 1: 3}), 7: world({0: 3, 1: 6})}, 0, 1, 2.0, 0.5,
                            paper=paper)  # fmt: skip
    claims = {c["key"]: c for c in h["claims"]}
    assert set(claims) == {"mem1_above_start", "mem1_not_below_full@1", "mem1_peak_over_full@1"}
    got = claims["mem1_not_below_full@1"]
    assert got["bar"] == "> −2 SE" and got["test"] == "not_below"
    d = [-0.2] * 3 + [0.0] * 37
    seed0 = got["worlds"]["0"]["seeds"]["0"]
    assert seed0["value"] == pytest.approx(-0.015) and seed0["se_paired"] == pytest.approx(_se(d))
    assert seed0["z"] == pytest.approx(-math.sqrt(3 / 40 * 39 / (37 / 40)))
    assert got["worlds"]["0"]["verdict"] == "holds"
    assert got["worlds"]["7"]["seeds"]["1"]["z"] == pytest.approx(-math.sqrt(6 / 40 * 39 / 0.85))
    assert got["worlds"]["7"]["verdict"] == "seed 0 only"
    # it tests no gain: outside the Holm family, which holds the start claim on each world
    assert "p_holm" not in got["worlds"]["0"] and h["bars"]["tests"] == 2
    peak = claims["mem1_peak_over_full@1"]["worlds"]["0"][POOLED]["value"]
    assert peak == pytest.approx(sum(300 + k for k in range(40)) / sum(1000 + k for k in range(40)))
    # the QA paper's claims by default: MEM1 above the full context at N=8 and 16 only
    assert "mem1_above_full@8" in {c.key for c in claims_for(2, [2, 8, 16])}


def test_holm_against_a_hand_worked_example():
    # alpha 0.05, m = 4: sorted d .005 <= .05/4, a .01 <= .05/3, c .03 > .05/2: stop there
    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005}, 0.05)
    assert {k: v["rejected"] for k, v in got.items()} == {"a": True, "b": False, "c": False,
                                                          "d": True}  # fmt: skip
    # adjusted: d 4 x .005, a max(.02, 3 x .01), c max(.03, 2 x .03), b max(.06, .04)
    assert {k: v["p_holm"] for k, v in got.items()} == pytest.approx(
        {"a": 0.03, "b": 0.06, "c": 0.06, "d": 0.02}
    )
    assert one_sided_p(2.0) == pytest.approx(1 - NormalDist().cdf(2.0))
    assert one_sided_p(None) == 1.0


def test_each_claim_is_one_test_of_the_holm_family(headline):
    h, _ = headline
    alpha = 1 - NormalDist().cdf(2.0)
    tests = [w for c in h["claims"] if c["metric"] == "em_frac" for w in c["worlds"].values()]
    assert h["bars"]["tests"] == len(tests) and h["bars"]["alpha"] == pytest.approx(alpha)
    p = []
    for w in tests:
        parts = [*w["seeds"].values(), w[POOLED]]
        # the intersection-union test's p-value: its weakest part's
        p.append(max(1.0 if g["z"] is None else 1 - NormalDist().cdf(g["z"]) for g in parts))
        assert w["p"] == pytest.approx(p[-1])
    ranked = sorted(p)
    for k, w in enumerate(tests):
        if w["verdict"] == "holds":
            assert w["p_holm"] <= alpha
            j = ranked.index(p[k])
            assert all(ranked[i] <= alpha / (len(ranked) - i) for i in range(j + 1))
        if w["verdict"] == "not after correction":
            assert all(g["holds"] for g in w["seeds"].values()) and w[POOLED]["holds"]
            assert w["p_holm"] > alpha


def test_a_claim_that_clears_the_bar_on_two_worlds_may_not_survive_the_correction():
    # 4 of 20 tasks gained: +0.2 ± 0.092 paired, 2.18 SE > 2 on each world, p = 0.0146 each;
    # two tests: Holm's first step asks p <= 0.0228 / 2 = 0.0114, so neither is kept
    world = {"warm-start": {2: {f"t{k}": (0.0, 10.0) for k in range(20)}},
             "mem1-ppo-s0": {2: {f"t{k}": (float(k < 4), 10.0) for k in range(20)}}}  # fmt: skip
    h = experiment_headline({0: world, 4242: world}, 0, 2, se_bar=2.0, ratio_bar=0.3)
    (claim,) = h["claims"]
    for got in claim["worlds"].values():
        assert got[POOLED]["z"] == pytest.approx(0.2 / _se([float(k < 4) for k in range(20)]))
        assert got[POOLED]["holds"] and got["seeds"]["0"]["holds"]
        assert got["verdict"] == "not after correction"
        assert got["p_holm"] == pytest.approx(2 * (1 - NormalDist().cdf(got[POOLED]["z"])))
    one = experiment_headline({0: world}, 0, 2, se_bar=2.0, ratio_bar=0.3)
    assert one["claims"][0]["worlds"]["0"]["verdict"] == "holds"  # one test: no correction


def test_claims_are_named_by_what_they_claim():
    labels = [c.label for c in claims_for(2, [1, 2, 4, 8, 16])]
    assert labels == [
        "MEM1 above its start at N=2", "MEM1 above full context at N=8",
        "MEM1 above full context at N=16", "MEM1's peak tokens at N=16 / full context's",
        "RL above SFT at N=4", "RL above SFT at N=8", "RL above SFT at N=16",
    ]  # fmt: skip


def test_the_claims_table_and_the_world_tables_render_every_figure(headline, tmp_path):
    h, _ = headline
    table = claims_markdown(h)
    rows = [r for r in table.splitlines()[2:]]
    assert len(rows) == sum(len(c["worlds"]) for c in h["claims"])  # a row per claim and world
    head = table.splitlines()[0].split(" | ")
    assert head[2:9] == ["verdict", "bar", POOLED, "seed 0", "seed 1", "p (Holm)",
                         "what drives it |"]  # fmt: skip
    assert "seed 0 only" in table and "(own)" in table
    md = headline_markdown(h)
    assert "| mem1-ppo · seed 1 |" in md and "EM summed over objectives" in md
    assert "Estimators" in md
    assert plot_scaling(h, tmp_path / "s.png").stat().st_size > 0


def test_scores_are_read_back_from_the_trajectories(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "trajectories"
    d.mkdir()
    pq.write_table(
        pa.table({"task_id": ["a", "b"], "reward": [1.0, 0.5], "peak_tokens": [10, 20]}),
        d / "mem1-ppo-s1_n4.parquet",
    )
    from mem1_core.experiment.records import _cell_rows, cell_files

    [(agent, n, path)] = cell_files(tmp_path, None, None)
    rows, behaviour = _cell_rows(path)
    assert (agent, n, behaviour) == ("mem1-ppo-s1", 4, None)  # no turns: no behaviour to read
    assert [(r["task_id"], r["reward"], r["peak_tokens"]) for r in rows] == [
        ("a", 1.0, 10), ("b", 0.5, 20)]  # fmt: skip
    # a cell the experiment no longer asks for (another agent, another N) stays out
    assert list(cell_files(tmp_path, {"mem1-ppo-s0"}, {4})) == []
    assert list(cell_files(tmp_path, {"mem1-ppo-s1"}, {2})) == []


KILLED_STAGE = """
import os, signal, sys, time
from mem1_core.experiment.walls import StageWalls
with StageWalls(sys.argv[1], heartbeat_seconds=0.05).stage("mem1-ppo · seed 0"):
    print("started", flush=True)
    time.sleep(0.8)
    os.kill(os.getpid(), signal.SIGKILL)  # a kill: no finally, no exit handler runs
"""


def test_a_killed_stage_keeps_its_time_and_the_next_attempt_adds_it(tmp_path):
    """walls.json holds what a person waited: a stage killed mid-way counts its attempt's time
    (to its last heartbeat) beside the attempt that finished it."""
    import subprocess
    import sys
    import time

    from mem1_core.experiment.walls import OPEN_FILE, StageWalls

    t0 = time.time()
    child = subprocess.Popen([sys.executable, "-c", KILLED_STAGE, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout.readline().strip() == "started"
    assert child.wait(timeout=60) == -9
    killed_for = time.time() - t0
    assert (tmp_path / OPEN_FILE).is_file()
    assert not (tmp_path / "walls.json").exists()  # the killed attempt finished nothing

    walls = StageWalls(tmp_path)
    with walls.stage("mem1-ppo · seed 0"):
        time.sleep(0.2)
    with walls.stage("warm start", count=False):  # found finished: adds nothing
        time.sleep(0.1)
    got = walls.read()
    assert set(got) == {"mem1-ppo · seed 0"}
    # the killed attempt ran 0.8 s of its stage (heartbeats every 0.05 s), the resumed 0.2 s
    assert 0.8 + 0.2 - 0.1 <= got["mem1-ppo · seed 0"] <= killed_for + 0.2 + 0.2
    assert not (tmp_path / OPEN_FILE).exists()
    # both attempts ran on this CPU: it is named once, beside the stage
    from mem1_core.models.compute import cpu_info

    assert walls.cpus() == {"mem1-ppo · seed 0": [cpu_info().describe()]}


def test_a_failed_stage_counts_its_time_once(tmp_path):
    import time

    from mem1_core.experiment.walls import StageWalls

    walls = StageWalls(tmp_path)
    with pytest.raises(RuntimeError), walls.stage("evaluation, world 0"):
        time.sleep(0.1)
        raise RuntimeError("cell failed")
    assert walls.settle() is None  # nothing left open to add twice
    with walls.stage("evaluation, world 0"):
        pass
    assert 0.1 <= walls.read()["evaluation, world 0"] < 0.5


def test_report_on_a_run_still_going_gives_each_stage_and_the_claims_so_far(
    tmp_path, capsys, monkeypatch
):
    """`mem1 experiment report RUN` on a run mid-way: each stage's progress from what the run
    wrote, and the headline from the cells played (a claim only where both agents played)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import mem1_core.experiment.report as report
    from mem1_core.cli.main import main
    from mem1_core.experiment.plan import SPEC_FILE, check_run_dir, spec_of_run

    drawn = {}
    real_plot = report.plot_curves

    def plot_curves(curves, train_n, path, start=None):
        drawn["start"] = start
        return real_plot(curves, train_n, path, start=start)

    monkeypatch.setattr(report, "plot_curves", plot_curves)
    spec = load_experiment("smoke")
    run = tmp_path / "smoke-1"
    run.mkdir()
    check_run_dir(run, spec, base_config(spec))
    assert spec_of_run(run) == spec  # the record reads back as the spec it was written from
    (run / "warm_start").mkdir()
    (run / "warm_start" / "result.json").write_text("{}")
    arm = run / "ppo_mem1" / "seed0"
    arm.mkdir(parents=True)
    (arm / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "reward": 0.5}) + "\n")
    # world 0: the warm start and both MEM1 seeds have played N=2 on the same 8 tasks
    em = {"warm-start": [1, 0, 0, 1, 0, 0, 1, 0], "mem1-ppo-s0": [1, 1, 1, 1, 0, 1, 1, 0],
          "mem1-ppo-s1": [1, 1, 0, 1, 1, 1, 1, 1]}  # fmt: skip
    traj = run / "eval" / "world0" / "trajectories"
    traj.mkdir(parents=True)
    for agent, scores in em.items():
        pq.write_table(pa.table({"task_id": [f"t{k}" for k in range(8)], "reward": scores,
                                 "peak_tokens": [100] * 8}), traj / f"{agent}_n2.parquet")  # fmt: skip

    assert main(["experiment", "report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "warm start: done" in out
    assert (
        "mem1-ppo · seed 0: 1 of 2 iterations" in out and "mem1-sft · seed 0: 0 of 4 steps" in out
    )
    assert "evaluation, world 0: 3 of 12 cells" in out  # 6 agent × seed rows × N in {2, 8}
    h = json.loads((run / "eval" / "headline.json").read_text())
    assert h["complete"] is False and "evaluation, world 4242: 0 of 12 cells" in h["pending"]
    [claim] = h["claims"]  # the others need cells not played yet
    assert claim["key"] == "mem1_above_start" and set(claim["worlds"]) == {"0"}
    got = claim["worlds"]["0"]
    # by hand: seed 0 − start per task, seed 1 − start, and the seed average − start
    start = em["warm-start"]
    for seed in ("0", "1"):
        d = [a - b for a, b in zip(em[f"mem1-ppo-s{seed}"], start, strict=True)]
        assert got["seeds"][seed]["value"] == pytest.approx(sum(d) / 8)
        assert got["seeds"][seed]["se_paired"] == pytest.approx(_se(d))
    pooled = [
        (a + b) / 2 - c for a, b, c in zip(em["mem1-ppo-s0"], em["mem1-ppo-s1"], start, strict=True)
    ]
    assert got["pooled"]["value"] == pytest.approx(sum(pooled) / 8)
    from mem1_core.experiment.report import _warm_start_cells

    # where the curves begin: the warm start's own-world cell, drawn under the arms' curves
    assert _warm_start_cells(h)[2]["em_frac"] == pytest.approx(sum(start) / 8)
    assert drawn["start"][2]["em_frac"] == pytest.approx(sum(start) / 8)
    md = (run / "eval" / "headline.md").read_text()
    assert md.count("Not finished") == 1 and "No evaluation cell played yet" in md
    assert (run / "eval" / "curves.png").is_file() and (run / "eval" / "scaling.png").is_file()
    assert (run / SPEC_FILE).is_file()


def test_report_refuses_a_directory_that_is_not_an_experiment_run(tmp_path, capsys):
    from mem1_core.cli.main import main

    assert main(["experiment", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no manifest.json" in err and "nor an experiment run directory" in err
    assert len(err.strip().splitlines()) == 1


# ---- arms are data --------------------------------------------------------------------------

VARIANTS = """
profile: smoke
set: {ppo.iterations: 2, sft.steps: 4}
warm_starts:
  upto4: {set: {sft.warm_start_objectives: [1, 2, 3, 4]}}
  full: {set: {rollout.memory: full}}
arms:
  mem1-ppo: {trainer: ppo, memory: mem1, seeds: [0, 1]}
  full-ppo: {trainer: ppo, memory: full, seeds: [0]}
  mem1-grpo: {trainer: grpo, memory: mem1, seeds: [0]}
  mem1-ppo-long: {trainer: ppo, memory: mem1, set: {ppo.iterations: 5}, seeds: [3]}
  mem1-ppo-upto4: {trainer: ppo, memory: mem1, warm_start: upto4, seeds: [0]}
  mem1-ppo-keep: {trainer: ppo, memory: mem1, set: {rollout.keep_answers_prompt: true}, seeds: [0]}
  mem1-sft: {trainer: sft, memory: mem1, seeds: [0]}
eval:
  agents: [warm-start, warm-start-upto4, warm-start-full, mem1-ppo, mem1-ppo-long, mem1-ppo-upto4,
           truncate-ppo]
  plays: {truncate-ppo: {arm: full-ppo, memory: truncate}}
curve: {objectives: [4], points: 2}
claims:
  mem1: mem1-ppo-long
  full_at: [4]
  full_test: not_below
  peak_at: 8
  above: [{a: mem1-ppo-upto4, b: mem1-ppo, objectives: [4, 8]}]
"""


def test_an_arm_is_its_trainer_memory_settings_warm_start_and_seeds(tmp_path):
    path = tmp_path / "variants.yaml"
    path.write_text(VARIANTS)
    spec = load_experiment(str(path))
    # the settings in order: the experiment's, the warm start's, the trainer's, the arm's
    long = arm_config(spec, "mem1-ppo-long", 3)
    assert (long.ppo.iterations, long.model.seed, long.rollout.memory) == (5, 3, "mem1")
    assert long.ppo.eval_every == 2  # the curve's 2 points over its own 5 iterations
    assert arm_config(spec, "mem1-ppo", 0).ppo.iterations == 2
    grpo = arm_config(spec, "mem1-grpo", 0)
    assert (grpo.ppo.adv_estimator, grpo.ppo.samples_per_task) == ("grpo", 4)
    up = arm_config(spec, "mem1-ppo-upto4", 0)
    assert tuple(up.sft.warm_start_objectives) == (1, 2, 3, 4)
    assert tuple(warm_start_config(spec, "upto4").sft.warm_start_objectives) == (1, 2, 3, 4)
    assert tuple(base_config(spec).sft.warm_start_objectives) == (1, 2)  # the plain one
    assert spec.used_warm_starts() == ["plain", "upto4", "full"]  # `full`: an agent plays it
    # how an arm plays (its rollout settings: a prompt) follows its agents into the evaluation
    assert eval_config(spec, 7, "mem1-ppo-keep").rollout.keep_answers_prompt
    assert eval_config(spec, 7, "mem1-ppo-keep").world.seed == 7
    assert not eval_config(spec, 7, "mem1-ppo").rollout.keep_answers_prompt
    assert agent_play_overrides(spec, "mem1-ppo-keep") == ["rollout.keep_answers_prompt=true"]
    assert agent_play_overrides(spec, "mem1-ppo-upto4") == []  # a warm start's sft.* trains only
    assert agent_play_overrides(spec, "warm-start-full") == []  # its memory is its agent's
    # directories: the paper's arms keep the pipeline's names, a variant has its own
    dirs = {r.label: r.dir.relative_to(tmp_path).as_posix() for r in arm_runs(spec, tmp_path)}
    assert dirs == {
        "mem1-ppo · seed 0": "ppo_mem1/seed0", "mem1-ppo · seed 1": "ppo_mem1/seed1",
        "full-ppo · seed 0": "ppo_full/seed0", "mem1-grpo · seed 0": "grpo_mem1/seed0",
        "mem1-ppo-long · seed 3": "arm_mem1-ppo-long/seed3",
        "mem1-ppo-upto4 · seed 0": "arm_mem1-ppo-upto4/seed0",
        "mem1-ppo-keep · seed 0": "arm_mem1-ppo-keep/seed0", "mem1-sft · seed 0": "sft_mem1/seed0",
    }  # fmt: skip
    assert list(dirs)[-1] == "mem1-sft · seed 0"  # the RL arms first
    for d in [tmp_path / "warm_start", tmp_path / "warm_start_upto4", tmp_path / "warm_start_full",
              *(r.dir for r in arm_runs(spec, tmp_path))]:  # fmt: skip
        (d / "policy").mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            (d / "policy" / name).write_text("{}")
    agents = {a: (Path(p).parent.relative_to(tmp_path).as_posix(), m)
              for a, p, m in eval_agents(spec, tmp_path)}  # fmt: skip
    assert agents == {
        "warm-start": ("warm_start", "mem1"), "warm-start-upto4": ("warm_start_upto4", "mem1"),
        # a warm start plays under the memory it was trained under
        "warm-start-full": ("warm_start_full", "full"),
        "mem1-ppo-s0": ("ppo_mem1/seed0", "mem1"), "mem1-ppo-s1": ("ppo_mem1/seed1", "mem1"),
        "mem1-ppo-long-s3": ("arm_mem1-ppo-long/seed3", "mem1"),
        "mem1-ppo-upto4-s0": ("arm_mem1-ppo-upto4/seed0", "mem1"),
        "truncate-ppo-s0": ("ppo_full/seed0", "truncate"),
    }  # fmt: skip
    labels = [c.label for c in claims_for(2, [4, 8], spec.roles, spec.above)]
    assert labels[-2:] == [
        "mem1-ppo-upto4 above mem1-ppo at N=4",
        "mem1-ppo-upto4 above mem1-ppo at N=8",
    ]
    assert claims_for(2, [4], spec.roles)[0].a == "mem1-ppo-long"
    # the paper's claims against the full context where the file reads them
    assert spec.paper == PaperClaims(full_at=(4,), full_test="not_below", peak_at=8)
    labels = [c.label for c in claims_for(2, [4, 8], spec.roles, (), spec.paper)]
    assert labels[1:3] == ["MEM1 not below full context at N=4",
                           "MEM1's peak tokens at N=8 / full context's"]  # fmt: skip
    # the record a run keeps reads back as the same experiment, its arms in the file's order
    record = json.loads(json.dumps(spec.to_dict(), sort_keys=True))
    assert ExperimentSpec.from_dict(record) == spec
    assert list(ExperimentSpec.from_dict(record).arms) == list(spec.arms)


def test_a_run_made_before_arms_were_data_reads_back_and_resumes(tmp_path):
    spec = load_experiment("smoke")
    record = spec.to_dict() | {"arms": {"mem1-ppo": [0, 1], "full-ppo": [0, 1], "mem1-sft": [0]}}
    record["agents"] = ["warm-start", "mem1-ppo", "full-ppo", "truncate-ppo", "mem1-sft"]
    for key in ("warm_starts", "plays", "roles", "above"):
        record.pop(key)
    old = ExperimentSpec.from_dict(record)
    assert {a: (x.trainer, x.memory, x.seeds) for a, x in old.arms.items()} == {
        a: (x.trainer, x.memory, x.seeds) for a, x in spec.arms.items()
    }
    assert (
        old.agent_memory("truncate-ppo") == "truncate"
        and old.agent_arm("truncate-ppo") == "full-ppo"
    )
    (tmp_path / "experiment.json").write_text(
        json.dumps({"experiment": record, "config": json.loads(config_json(base_config(spec)))})
    )
    check_run_dir(tmp_path, spec, base_config(spec))  # the same arms: it resumes
    assert [r.dir.relative_to(tmp_path).as_posix() for r in arm_runs(spec, tmp_path)][:2] == [
        "ppo_mem1/seed0",
        "ppo_mem1/seed1",
    ]


def test_a_run_refuses_an_arm_declared_otherwise_under_its_name(tmp_path):
    spec = load_experiment("smoke")
    check_run_dir(tmp_path, spec, base_config(spec))
    other = load_experiment("smoke", ["experiment.arms.mem1-ppo.set={ppo.actor_lr: 3.0e-5}"])
    with pytest.raises(ValueError, match=r"other settings \(mem1-ppo\)"):
        check_run_dir(tmp_path, other, base_config(other))


SHIPPED = sorted(p.stem for p in (Path(__file__).parents[1] / "data" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_experiment_loads_and_resolves_its_plan(name, tmp_path):
    spec = load_experiment(name)
    cfg = base_config(spec)
    runs = arm_runs(spec, tmp_path)
    assert runs and all(arm_config(spec, r.arm, r.seed).model.seed == r.seed for r in runs)
    assert ExperimentSpec.from_dict(spec.to_dict()) == spec
    assert {a for a in spec.agents if spec.agent_arm(a)} <= set(spec.arms) | set(spec.plays)
    assert eval_config(spec, 4242).world.seed == 4242 and cfg.world.seed == 0


def test_the_horizon_experiment_keeps_the_papers_setting_and_names_each_lever():
    spec = load_experiment("horizon")
    paper = arm_config(spec, "mem1-ppo", 0)
    assert (paper.data.train_objectives, tuple(paper.sft.warm_start_objectives)) == (2, (1, 2))
    assert not paper.ppo.curriculum and not paper.rollout.keep_answers_prompt
    # the claims rest on three seeds each
    assert all(len(spec.arms[a].seeds) >= 3 for a in ("mem1-ppo", "full-ppo", "mem1-sft"))
    up = warm_start_config(spec, "upto4")
    assert tuple(up.sft.warm_start_objectives) == (1, 2, 3, 4)
    assert arm_config(spec, "mem1-ppo-upto4", 0).data.train_objectives == 2
    assert tuple(arm_config(spec, "mem1-ppo-curriculum", 0).ppo.curriculum) == (1, 2, 4)
    assert eval_config(spec, 4242, "mem1-ppo-keep").rollout.keep_answers_prompt
    assert spec.worlds == (4242,) and spec.objectives == (1, 2, 4, 8, 16)
