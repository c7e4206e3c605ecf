"""The experiment's headline across training seeds and worlds, computed once from the tasks'
own scores and written to `eval/headline.json`; everything else renders it.

The estimators are ESTIMATOR's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mem1_core.experiment.plan import split_agent
from mem1_core.experiment.spec import CLAIM_ROLES, PaperClaims

HEADLINE_SCHEMA = 1

ESTIMATOR = """Estimators (per world, agent, N; T tasks, the same for every agent and seed):
- a seed's cell: the mean over tasks of each task's EM fraction (or peak tokens) ± the
  standard error of that mean;
- the pooled cell: each task's score averaged over the agent's seeds, then the mean over tasks
  ± the standard error over tasks of those averages. Tasks are the sampling unit; the spread
  between seeds is shown by the per-seed rows, not folded into this error;
- a difference a − b: per seed, a under that seed against b under the same seed (b's pooled
  score where b has no such seed: the warm start, an arm trained once); pooled, the per-task
  difference of the seed-averaged scores. `se` treats a and b as independent, `se_paired` is
  the standard error of the per-task differences (they played the same tasks: the error to
  test a difference with);
- a ratio a / b (peak tokens): the ratio of the means, its error by the delta method.

A claim holds on a world at the stated bar only where it holds for every seed on its own and
pooled: one seed's paired error measures task noise, not training noise.

The bar, once: a difference claim is a one-sided test that a − b > 0, its figure in paired
standard errors; the bar of k SE is the one-sided level alpha = P(Z > k) (k = 2: 2.3 %), the
2-sigma convention of the smol experiment. One claim on one world is an intersection-union test
(every seed and the pool must clear it), whose p-value is the largest of its parts'. The
experiment makes many such tests (each difference claim on each world), so Holm's step-down
correction over all of them holds the chance that any claim holds by chance to alpha: sorted
p_(1) <= ... <= p_(m), the j-th holds while every p_(i), i <= j, is at most alpha / (m - i + 1).
A claim every part of which clears the bar but which Holm does not keep reads "not after
correction". The peak-token ratio is a bound on a measured ratio, not a test.
"""
"""How the headline's figures are estimated (headline.json carries it)."""
POOLED = "pooled"

Scores = dict[str, dict[int, dict[str, tuple[float, float]]]]
"""agent name (with its seed: `mem1-ppo-s1`) -> N -> task id -> (EM fraction, peak tokens)."""
Behaviour = dict[str, dict[int, dict[str, dict[str, Any]]]]
"""agent name -> N -> task id -> its behaviour figures (mem1_core.evaluation.behaviour)."""


def _behaviour_cell(behaviour: Behaviour, names: list[str], n: int) -> dict[str, Any] | None:
    """Each behaviour figure of agents `names` (one agent's seeds) at N=`n`: per task averaged
    over the seeds that have it (None: none does), then the mean ± SE over the tasks that have
    it (`<figure>`, `<figure>_se`, `<figure>_tasks`); None unless every one played N=`n`."""
    from mem1_core.evaluation.behaviour import BEHAVIOUR

    cells = [behaviour.get(a, {}).get(n) for a in names]
    if not cells or any(c is None for c in cells):
        return None
    out: dict[str, Any] = {}
    for key in BEHAVIOUR:
        per_task = []
        for t in cells[0]:
            vals = [c[t][key] for c in cells if t in c and c[t][key] is not None]
            if vals:
                per_task.append(_mean(vals))
        out[key] = _mean(per_task) if per_task else None
        out[f"{key}_se"] = _se(per_task)
        out[f"{key}_tasks"] = len(per_task)
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _se(xs: list[float]) -> float | None:
    """Standard error of the mean (None below two values: no spread to see)."""
    if len(xs) < 2:
        return None
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def _per_task(scores: Scores, names: list[str], n: int, k: int) -> dict[str, float] | None:
    """Task id -> score `k` (0: EM, 1: peak tokens) averaged over the agents `names` (one
    agent's seeds); None unless every one of them played the same tasks at N=`n`."""
    cells = [scores.get(a, {}).get(n) for a in names]
    if not cells or any(c is None for c in cells) or any(set(c) != set(cells[0]) for c in cells):
        return None
    return {t: _mean([c[t][k] for c in cells]) for t in cells[0]}


def _names(seeds: Mapping[str, list], agent: str, seed) -> list[str]:
    """The evaluated names of `agent` under `seed`: that seed's, or all of its seeds' where
    `seed` is POOLED or not one of the agent's (the warm start: its one run)."""
    own = seeds[agent]
    pick = own if seed == POOLED or seed not in own else [seed]
    return [agent if x is None else f"{agent}-s{x}" for x in pick]


def _cell(per_em: dict[str, float], per_peak: dict[str, float], n: int) -> dict[str, Any]:
    em, peak = list(per_em.values()), list(per_peak.values())
    se = _se(em)
    return {
        "tasks": len(em),
        "em_frac": _mean(em), "em_frac_se": se,
        "em_sum": _mean(em) * n, "em_sum_se": None if se is None else se * n,
        "peak_tokens": _mean(peak), "peak_tokens_se": _se(peak),
    }  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims, as a comparison at one N and the bar it must clear."""

    key: str
    label: str
    a: str
    b: str
    metric: str
    """`em_frac` (a difference, bar in standard errors) or `peak_tokens` (a ratio, bar a
    number it must not exceed)."""
    n: int
    test: str = "above"
    """For a difference: `above` (a − b more than the bar's SE above 0) or `not_below` (a − b
    not more than the bar's SE below 0: no measurable deficit, no test of a gain; outside the
    Holm family)."""


def claims_for(
    train_n: int,
    objectives: list[int],
    roles: Mapping[str, str] | None = None,
    above: tuple = (),
    paper: PaperClaims | None = None,
) -> list[Claim]:
    """The paper's claims, by what they claim: MEM1 above its start at the training N (§5.2),
    MEM1 above the full context at N=8 and 16 (Table 1), MEM1's peak tokens at N=16 relative to
    the full context's (Table 1: 0.27), RL above SFT at every N ≥ 4 (§5.4); then an
    experiment's own (`above`: mem1_core.experiment.spec.Above). `roles`: the agents that play
    MEM1, the full context, SFT and MEM1's start (CLAIM_ROLES by default); `paper`: where and
    how MEM1 is held against the full context in the experiment's domain (the QA paper's by
    default; WebShop's: not below it at N=1, its peak tokens at N=1)."""
    r = {**CLAIM_ROLES, **(roles or {})}
    p = paper or PaperClaims()
    mem1, full, sft, start = r["mem1"], r["full"], r["sft"], r["start"]
    out = [Claim("mem1_above_start", f"MEM1 above its start at N={train_n}",
                 mem1, start, "em_frac", train_n)]  # fmt: skip
    words = p.full_test.replace("_", " ")
    out += [
        Claim(f"mem1_{p.full_test}_full@{n}", f"MEM1 {words} full context at N={n}",
              mem1, full, "em_frac", n, p.full_test)
        for n in p.full_at
    ]  # fmt: skip
    out.append(Claim(f"mem1_peak_over_full@{p.peak_at}",
                     f"MEM1's peak tokens at N={p.peak_at} / full context's",
                     mem1, full, "peak_tokens", p.peak_at))  # fmt: skip
    out += [
        Claim(f"rl_above_sft@{n}", f"RL above SFT at N={n}", mem1, sft, "em_frac", n)
        for n in objectives
        if n >= 4
    ]
    out += [
        Claim(f"{c.a}_above_{c.b}@{n}", f"{c.a} above {c.b} at N={n}", c.a, c.b, "em_frac", n)
        for c in above
        for n in c.objectives
    ]
    return out


def _compare(metric: str, a: dict[str, float], b: dict[str, float], n: int) -> dict[str, Any]:
    """a − b (EM) or a / b (peak tokens) of two per-task score maps over the same tasks."""
    ma, mb = _mean(list(a.values())), _mean(list(b.values()))
    sa, sb = _se(list(a.values())), _se(list(b.values()))
    if metric == "peak_tokens":
        value = ma / mb if mb else None
        se = (
            value * math.hypot(sa / ma, sb / mb)
            if value is not None and ma and sa is not None and sb is not None
            else None
        )
        return {"value": value, "se": se}
    paired = _se([a[t] - b[t] for t in a])
    se = math.hypot(sa, sb) if sa is not None and sb is not None else None
    return {
        "value": ma - mb, "se": se, "se_paired": paired,
        "value_sum": (ma - mb) * n, "se_sum_paired": None if paired is None else paired * n,
    }  # fmt: skip


def world_headline(
    scores: Scores, agents: list[str] | None = None, behaviour: Behaviour | None = None
) -> dict[str, Any]:
    """One world's cells (each agent per seed and pooled) and every comparison the claims
    draw on, per seed and pooled. `agents`: the experiment's agent names, in its order (an
    evaluated name is split into agent and seed against them); `behaviour`: each cell's
    per-task behaviour (records.export_run), its means in each cell's `behaviour`."""
    seeds: dict[str, list[int | None]] = {}
    for name in scores:
        base, seed = split_agent(name, agents)
        seeds.setdefault(base, []).append(seed)
    order = {a: k for k, a in enumerate(agents or ())}  # the file's order
    seeds = {
        a: sorted(s, key=lambda x: -1 if x is None else x)
        for a, s in sorted(seeds.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    }
    ns = sorted({n for by_n in scores.values() for n in by_n})

    cells = []
    for agent, own in seeds.items():
        for seed in [*(s for s in own if s is not None), POOLED]:
            for n in ns:
                em = _per_task(scores, _names(seeds, agent, seed), n, 0)
                peak = _per_task(scores, _names(seeds, agent, seed), n, 1)
                if em is not None:
                    cell = {"agent": agent, "seed": seed, "N": n, **_cell(em, peak, n)}
                    if behaviour is not None:
                        cell["behaviour"] = _behaviour_cell(
                            behaviour, _names(seeds, agent, seed), n
                        )
                    cells.append(cell)
    return {"objectives": ns, "seeds": seeds, "cells": cells, "scores": scores}


def compare(world: Mapping[str, Any], a: str, b: str, metric: str, n: int, seed) -> dict | None:
    """a against b at N=`n` under `seed` (an int, or POOLED) on one world's headline: a's
    seed against b's same seed, or b's pooled scores where b has no such seed."""
    seeds, scores = world["seeds"], world["scores"]
    if a not in seeds or b not in seeds:
        return None
    k = 0 if metric == "em_frac" else 1

    ta = _per_task(scores, _names(seeds, a, seed), n, k)
    tb = _per_task(scores, _names(seeds, b, seed), n, k)
    if ta is None or tb is None or set(ta) != set(tb) or not ta:
        return None
    return _compare(metric, ta, tb, n)


def _holds(claim: Claim, got: dict[str, Any], se_bar: float, ratio_bar: float) -> dict:
    if claim.metric == "peak_tokens":
        ok = got["value"] is not None and got["value"] <= ratio_bar
        return got | {"holds": ok}
    se = got.get("se_paired") or got.get("se")
    z = None if not se else got["value"] / se
    bar = -se_bar if claim.test == "not_below" else se_bar
    return got | {"z": z, "holds": z is not None and z > bar}


def one_sided_p(z: float | None) -> float:
    """P(Z > z) for a standard normal Z: the one-sided p-value of a difference `z` of its
    standard errors above 0 (1 where there is no error to test with)."""
    return 1.0 if z is None else 0.5 * math.erfc(z / math.sqrt(2.0))


def holm(p: Mapping[str, float], alpha: float) -> dict[str, dict[str, Any]]:
    """Holm's step-down correction (Holm 1979) of the tests `p` (name -> p-value) at family-wise
    level `alpha`: sorted p_(1) ≤ … ≤ p_(m), test k is rejected while p_(j) ≤ alpha / (m − j + 1)
    for every j ≤ k. -> name -> {p, p_holm (the adjusted p-value, max_{j≤k} min(1, (m−j+1)
    p_(j))), rejected}."""
    order = sorted(p, key=lambda k: p[k])
    m, out, running, going = len(order), {}, 0.0, True
    for j, name in enumerate(order):
        going = going and p[name] <= alpha / (m - j)
        running = max(running, min(1.0, (m - j) * p[name]))
        out[name] = {"p": p[name], "p_holm": running, "rejected": going}
    return out


def _bar_text(c: Claim, se_bar: float, ratio_bar: float) -> str:
    if c.metric == "peak_tokens":
        return f"≤ {ratio_bar:g}"
    return f"> −{se_bar:g} SE" if c.test == "not_below" else f"> {se_bar:g} SE"


def judge_claims(
    worlds: Mapping[str, Mapping[str, Any]], claims: list[Claim], se_bar: float, ratio_bar: float
) -> list[dict[str, Any]]:
    """Each claim on each world: its figure per seed of MEM1 and pooled, whether each clears the
    bar, and the verdict (`holds`: pooled and every seed; `seed 0 only`: the seeds that do)."""
    out = []
    for c in claims:
        row = {"key": c.key, "label": c.label, "a": c.a, "b": c.b, "N": c.n, "metric": c.metric,
               "test": c.test, "bar": _bar_text(c, se_bar, ratio_bar),
               "worlds": {}}  # fmt: skip
        for w, world in worlds.items():
            seeds = [s for s in world["seeds"].get(c.a, []) if s is not None]
            per_seed = {}
            for s in seeds:
                got = compare(world, c.a, c.b, c.metric, c.n, s)
                if got is not None:
                    per_seed[str(s)] = _holds(c, got, se_bar, ratio_bar)
            pooled = compare(world, c.a, c.b, c.metric, c.n, POOLED)
            if pooled is None:
                continue
            pooled = _holds(c, pooled, se_bar, ratio_bar)
            held = [s for s, g in per_seed.items() if g["holds"]]
            if pooled["holds"] and len(held) == len(per_seed):
                verdict = "holds"
            elif held:
                verdict = f"seed {', '.join(held)} only"
            else:
                verdict = "does not hold"
            row["worlds"][w] = {"seeds": per_seed, POOLED: pooled, "verdict": verdict}
        if row["worlds"]:
            out.append(row)
    return out


def correct(claims: list[dict[str, Any]], alpha: float) -> None:
    """Holm over the experiment's difference claims × worlds, in place. A claim × world is one
    intersection–union test (it holds only where every seed and the pool clear the bar), whose
    p-value is the largest of its parts' (Berger 1982); Holm keeps the chance that any of the
    family's claims holds by chance at most `alpha`. Each claim × world gets `p`, `p_holm`,
    and its verdict `holds` only where Holm rejects; a claim every part of which clears the
    uncorrected bar while Holm does not reject reads `not after correction`. A `not_below`
    claim rejects nothing (it holds where no deficit shows), so it is no member of the family."""
    tests = {}
    for i, c in enumerate(claims):
        if c["metric"] != "em_frac" or c.get("test", "above") != "above":
            continue
        for w, got in c["worlds"].items():
            parts = [*got["seeds"].values(), got[POOLED]]
            tests[(i, w)] = max(one_sided_p(g.get("z")) for g in parts)
    done = holm({f"{i}|{w}": p for (i, w), p in tests.items()}, alpha)
    for i, w in tests:
        got, res = claims[i]["worlds"][w], done[f"{i}|{w}"]
        got["p"], got["p_holm"] = res["p"], res["p_holm"]
        if got["verdict"] == "holds" and not res["rejected"]:
            got["verdict"] = "not after correction"


def effect_list(effects: tuple) -> list[Claim]:
    """The experiment's effects (a above b at each N) as comparisons, no claims."""
    return [Claim(f"{e.a}_vs_{e.b}@{n}", f"{e.a} − {e.b} at N={n}", e.a, e.b, "em_frac", n)
            for e in effects for n in e.objectives]  # fmt: skip


def drivers(world: Mapping[str, Any], a: str, b: str, n: int) -> dict[str, Any]:
    """What drives a comparison at N=`n` on one world, from the behaviour rows (pooled): for
    each side, the objectives its answers give, the share found, the share of found answers
    retained. -> {agent: {answered, found, retention}} (absent: no behaviour row)."""
    out = {}
    for agent in (a, b):
        cell = next((c for c in world["cells"] if c["agent"] == agent and c["seed"] == POOLED
                     and c["N"] == n), None)  # fmt: skip
        if cell and cell.get("behaviour"):
            out[agent] = {k: cell["behaviour"][k] for k in ("answered", "found", "retention")}
    return out


def experiment_headline(
    evals: Mapping[int, Scores],
    own_world: int,
    train_n: int,
    se_bar: float,
    ratio_bar: float,
    experiment: str = "",
    agents: list[str] | None = None,
    roles: Mapping[str, str] | None = None,
    above: tuple = (),
    behaviours: Mapping[int, Behaviour] | None = None,
    effects: tuple = (),
    paper: PaperClaims | None = None,
) -> dict[str, Any]:
    """THE experiment headline from each world's per-task scores (mem1_core.experiment.records); `agents`,
    `roles`, `above`: the experiment's agent names, its claims' roles and its own claims;
    `behaviours`: each world's per-task behaviour (records.export_run); `effects`: differences
    measured and reported outside the claims (spec.ExperimentSpec.effects); `paper`: where the
    paper's claims against the full context are read (spec.PaperClaims)."""
    worlds = {
        str(w): world_headline(s, agents, (behaviours or {}).get(w)) for w, s in evals.items()
    }
    ns = sorted({n for w in worlds.values() for n in w["objectives"]})
    claims = judge_claims(worlds, claims_for(train_n, ns, roles, above, paper), se_bar, ratio_bar)
    correct(claims, one_sided_p(se_bar))
    effects = judge_claims(worlds, effect_list(effects), se_bar, ratio_bar)
    for rows in (claims, effects):
        for c in rows:
            for w, got in c["worlds"].items():
                got["drivers"] = drivers(worlds[w], c["a"], c["b"], c["N"])
    for w in worlds.values():  # the per-task scores stay in the trajectories
        w.pop("scores")
    return {
        "schema": HEADLINE_SCHEMA,
        "experiment": experiment,
        "train_objectives": train_n,
        "own_world": own_world,
        "estimator": ESTIMATOR,
        "worlds": {w: {"own": w == str(own_world), **h} for w, h in worlds.items()},
        "claims": claims,
        "bars": {
            "se": se_bar,
            "peak_ratio": ratio_bar,
            "alpha": one_sided_p(se_bar),
            "tests": sum(
                1
                for c in claims
                for w in c["worlds"]
                if c["metric"] == "em_frac" and c["test"] == "above"
            ),  # fmt: skip
        },
        "effects": effects,
    }
