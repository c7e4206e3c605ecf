"""The experiment's headline as a reader sees it: the claims table, each world's agents × N
(pooled over seeds, and per seed) in both units, and two plots: the PPO arms' held-out learning
curves per seed, and EM and peak tokens against N per world with error bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mem1_core.experiment.headline import POOLED


def _warm_start_cells(h: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """N -> the warm start's cell on the run's own world (empty before it is evaluated)."""
    own = next((w for w in h["worlds"].values() if w["own"]), None)
    cells = own["cells"] if own else []
    return {c["N"]: c for c in cells if c["agent"] == "warm-start" and c["seed"] == POOLED}


def write_experiment_headline(run_dir: Path) -> dict[str, Any]:
    """eval/headline.{json,md}, eval/curves.png and eval/scaling.png of an experiment run: its
    records (mem1_core.experiment.records.export_run, the one read of the run directory), then
    the headline of those records. On a run still going it is the headline so far: `complete`
    is false, `pending` names each unfinished stage, and a claim whose cells are not all played
    is left out. -> {"headline", "markdown", "plots": {title: path}}."""
    from mem1_core.experiment.records import export_run

    run_dir = Path(run_dir)
    return write_report(export_run(run_dir), run_dir / "eval", f"`{run_dir.name}`")


def write_report(rec, out: Path, title: str) -> dict[str, Any]:
    """headline.{json,md}, curves.png and scaling.png under `out`, from records alone (one
    part's or several merged: mem1_core.experiment.merge). -> {"headline", "markdown",
    "plots": {title: path}}."""
    from mem1_core.experiment.merge import headline_of
    from mem1_core.runs.atomic import write_json, write_text

    h = headline_of(rec)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plots = {
        "Learning curves (held-out EM, sampled reward, KL), per arm and seed": plot_curves(
            {k: rows for k, rows in h["curves"].items() if rows}, rec.train_n,
            out / "curves.png", start=_warm_start_cells(h),
        ),
        "EM and peak tokens against N, per world": plot_scaling(h, out / "scaling.png"),
    }  # fmt: skip
    pending = h["pending"]
    status = (
        ""
        if not pending
        else "**Not finished: the headline so far.** Still to do: " + "; ".join(pending) + ".\n\n"
    )
    md = f"# Experiment `{h['experiment']}`: {title}\n\n{status}{headline_markdown(h)}"
    write_json(h, out / "headline.json")
    write_text(md, out / "headline.md")
    return {"headline": h, "markdown": md, "plots": {k: str(v) for k, v in plots.items() if v}}


def _pm(v: float | None, se: float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def claim_figure(g: dict[str, Any], metric: str) -> str:
    """`+0.057 ± 0.015 (3.9 SE)` for a difference (its paired SE), `0.21 ± 0.06` for a ratio."""
    if metric == "peak_tokens":
        return _pm(g["value"], g.get("se"), 2)
    se = g.get("se_paired") or g.get("se")
    text = f"{g['value']:+.3f}" + ("" if se is None else f" ± {se:.3f}")
    return text + ("" if g.get("z") is None else f" ({g['z']:+.1f} SE)")


def driver_text(c: dict[str, Any], got: dict[str, Any]) -> str:
    """What drives a comparison, from the behaviour rows: `mem1-sft answers 2.0 of 4 (found
    0.50, kept 0.90); mem1-ppo 3.1 (0.62, 0.55)`."""
    d, n = got.get("drivers") or {}, c["N"]

    def f(b: dict[str, Any], key: str) -> str:
        return "–" if b.get(key) is None else f"{b[key]:.2f}"

    parts = []
    for agent in (c["b"], c["a"]):
        b = d.get(agent)
        if not b or b.get("answered") is None:
            continue
        if not parts:
            parts.append(f"{agent} answers {b['answered']:.1f} of {n} (found {f(b, 'found')}, "
                         f"kept {f(b, 'retention')})")  # fmt: skip
        else:
            parts.append(f"{agent} {b['answered']:.1f} ({f(b, 'found')}, {f(b, 'retention')})")
    return "; ".join(parts)


def claims_markdown(h: dict[str, Any], key: str = "claims") -> str:
    """One row per claim and world: the verdict, the bar, the pooled figure and each seed's
    (the verdict beside the claim: a wide table in the UI scrolls, and it is read first), the
    Holm-adjusted p-value, and what drives it (the behaviour rows). `key="effects"`: the
    measured effects, with no verdict, bar or correction."""
    rows = h.get(key) or []
    claims = key == "claims"
    seeds = sorted({s for c in rows for w in c["worlds"].values() for s in w["seeds"]})
    head = ["claim" if claims else "effect", "world", *(["verdict", "bar"] if claims else []),
            POOLED, *(f"seed {s}" for s in seeds), *(["p (Holm)"] if claims else []),
            "what drives it"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in rows:
        for w, got in c["worlds"].items():
            own = " (own)" if h["worlds"][w]["own"] else ""
            verdict = got["verdict"]
            cols = [c["label"], f"{w}{own}"]
            if claims:
                cols += [f"**{verdict}**" if verdict == "holds" else verdict, c["bar"]]
            cols.append(claim_figure(got[POOLED], c["metric"]))
            for s in seeds:
                g = got["seeds"].get(s)
                mark = " ✓" if claims and g and g["holds"] else ""
                cols.append(claim_figure(g, c["metric"]) + mark if g else "")
            if claims:
                cols.append(f"{got['p_holm']:.3g}" if got.get("p_holm") is not None else "–")
            cols.append(driver_text(c, got))
            lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def world_markdown(w: str, world: dict[str, Any]) -> str:
    """Agents × N on one world: EM fraction ± SE (mean peak tokens), then EM summed over
    objectives (the paper's 0..N), one row per agent pooled over its seeds and one per seed."""
    ns = world["objectives"]
    by = {(c["agent"], str(c["seed"]), c["N"]): c for c in world["cells"]}
    rows = []
    for agent, seeds in world["seeds"].items():
        several = len([s for s in seeds if s is not None]) > 1
        rows.append((f"{agent} · pooled" if several else agent, POOLED))
        if several:
            rows += [(f"{agent} · seed {s}", str(s)) for s in seeds if s is not None]
    head = "| agent | " + " | ".join(f"N={n}" for n in ns) + " |\n" + "|---" * (len(ns) + 1) + "|"
    out = []
    for title, fmt in (
        ("EM fraction ± SE (mean peak tokens)",
         lambda c: f"{_pm(c['em_frac'], c['em_frac_se'])} ({c['peak_tokens']:,.0f})"),
        ("EM summed over objectives ± SE (the paper's units, 0..N)",
         lambda c: _pm(c["em_sum"], c["em_sum_se"], 2)),
    ):  # fmt: skip
        out += [f"World {w}{' (the run’s own test split)' if world['own'] else ' (held out)'}: "
                f"{title}.", "", head]  # fmt: skip
        for label, seed in rows:
            agent = label.split(" · ")[0]
            cells = [by.get((agent, seed, n)) for n in ns]
            out.append(f"| {label} | " + " | ".join(fmt(c) if c else "" for c in cells) + " |")
        out.append("")
    return "\n".join(out)


BEHAVIOUR_HEAD = ["agent", "N", "answered / N", "queries (distinct)", "turns / budget",
                  "answered early", "format errors", "found", "retention"]  # fmt: skip
"""The behaviour table's columns (mem1_core.evaluation.behaviour says what each counts)."""


def behaviour_row(label: str, n: int, b: dict[str, Any]) -> str:
    """One behaviour row: means per task (± SE where a rate or count decides a diagnosis)."""

    def f(key: str, digits: int = 2, se: bool = False) -> str:
        v = b.get(key)
        if v is None:
            return "–"
        return _pm(v, b.get(f"{key}_se"), digits) if se else f"{v:.{digits}f}"

    cols = [label, str(n), f"{f('answered', 2, True)} / {n}",
            f"{f('queries', 1)} ({f('distinct_queries', 1)})",
            f"{f('turns', 1)} / {f('turns_budget', 0)}", f("early"), f("format_errors"),
            f("found", 2, True), f("retention", 2, True)]  # fmt: skip
    return "| " + " | ".join(cols) + " |"


def behaviour_markdown(world: dict[str, Any]) -> str:
    """Agents × N on one world: what each did, pooled over its seeds (each task's figure
    averaged over the seeds, then the mean over tasks), then per seed in a folded block."""
    head = "| " + " | ".join(BEHAVIOUR_HEAD) + " |\n" + "|---" * len(BEHAVIOUR_HEAD) + "|"
    pooled, per_seed = [head], [head]
    for c in world["cells"]:
        if not c.get("behaviour"):
            continue
        if c["seed"] == POOLED:
            pooled.append(behaviour_row(c["agent"], c["N"], c["behaviour"]))
        else:
            per_seed.append(
                behaviour_row(f"{c['agent']} · seed {c['seed']}", c["N"], c["behaviour"])
            )
    if len(pooled) == 1:
        return ""
    out = "\n".join(pooled) + "\n"
    if len(per_seed) > 1:
        out += (
            "\n<details><summary>per seed</summary>\n\n" + "\n".join(per_seed) + "\n\n</details>\n"
        )
    return out


BEHAVIOUR_NOTE = (
    "Per task: answered, the parts of its `<answer>` (neither empty nor `?`); queries, its "
    "searches (distinct once normalised); turns against its budget; answered early, an answer "
    "with fewer distinct queries than objectives (tasks that answered); format errors, invalid "
    "turns; found, the share of objectives whose gold answer appeared in an `<info>`; "
    "retention (MEM1's memories), of those found, the share still in the last `<IS>` before "
    "the answer or in the answer.\n"
)


def claims_heading(h: dict[str, Any]) -> str:
    """The bars, stated once (their reason: the headline's estimator text)."""
    bars = h["bars"]
    return (
        f"bar: {bars['se']:g} paired SE, one-sided α = {bars.get('alpha', 0):.3f}, "
        f"Holm-corrected over the {bars.get('tests', 0)} claim × world tests; peak-token ratio "
        f"≤ {bars['peak_ratio']:g}; ✓ a seed that clears the uncorrected bar"
    )


def headline_markdown(h: dict[str, Any]) -> str:
    parts = [
        f"## Claims ({claims_heading(h)})\n",
        claims_markdown(h) if h["claims"] else "No claim can be judged yet.\n",
    ]
    if h.get("effects"):
        parts += ["## Effects (measured, not claimed: fewer seeds than a claim needs; no "
                  "correction)\n", claims_markdown(h, "effects")]  # fmt: skip
    for w, world in h["worlds"].items():
        body = world_markdown(w, world) if world["cells"] else "No evaluation cell played yet.\n"
        parts.append(f"## World {w}\n\n{body}")
        if behaviour := behaviour_markdown(world):
            tag = "the run’s own test split" if world["own"] else "held out"
            parts.append(f"## Behaviour, world {w} ({tag})\n\n{BEHAVIOUR_NOTE}\n{behaviour}")
    if len(h.get("parts") or []) > 1:
        parts.append(parts_markdown(h))
    if h.get("walls"):
        parts.append(walls_markdown(h))
    parts.append(f"## How the figures are estimated\n\n{h['estimator']}")
    return "\n".join(parts)


def parts_markdown(h: dict[str, Any]) -> str:
    """Where each merged part ran: its run, commit, CPU and the minutes it trained and
    evaluated (stages linked from another run aside)."""
    rows = "\n".join(
        f"| {p['label']} | {p['run']} | {(p.get('commit') or '?')[:10]} | {p['minutes']:.1f} | "
        f"{'; '.join(p['cpus']) or '?'} |"
        for p in h["parts"]
    )
    return ("## Parts\n\n| part | run | commit | minutes | CPU |\n|---|---|---|---|---|\n"
            f"{rows}\n")  # fmt: skip


def walls_markdown(h: dict[str, Any]) -> str:
    """The wall time per stage with its CPUs; a stage linked from another run (`--reuse`) is
    named with the run it trained in, and the total says how much of it this run trained."""
    cpus, reused = h.get("cpus") or {}, h.get("walls_reused") or {}
    rows = "\n".join(
        f"| {k}{f' (trained in {Path(reused[k]).name}, linked)' if k in reused else ''} "
        f"| {v / 60:.1f} | {'; '.join(cpus.get(k, [])) or '?'} |"
        for k, v in h["walls"].items()
    )
    total = sum(h["walls"].values()) / 60
    own = sum(v for k, v in h["walls"].items() if k not in reused) / 60
    here = f"\n| of which trained in this run | {own:.1f} | |" if reused else ""
    return (f"## Wall time per stage\n\n| stage | minutes | CPU |\n|---|---|---|\n"
            f"{rows}\n| total | {total:.1f} | |{here}\n")  # fmt: skip


# ---- curves -------------------------------------------------------------------------------


def plot_curves(
    curves: dict[str, list[dict]],
    train_n: int,
    path: Path,
    start: dict[int, dict[str, Any]] | None = None,
) -> Path | None:
    """Held-out EM against PPO iterations (training N solid, longer N dashed), the sampled
    reward and the KL to the start: one colour per arm, one marker per seed. `start`: the
    warm start's cell per N from the final evaluation of the run's own world (its EM ± SE, a
    grey line and band at each N the curves show: where the arms began)."""
    if not any(curves.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (held, sampled, kl) = plt.subplots(1, 3, figsize=(17, 4.2), gridspec_kw={"wspace": 0.25})
    arms = sorted({label.split(" · ")[0] for label in curves})
    for label, rows in curves.items():
        arm, _, seed = label.partition(" · ")
        color = f"C{arms.index(arm)}"
        marker = "osd^v"[int(seed.split()[-1]) % 5] if seed else "o"
        it = [r["iteration"] + 1 for r in rows]
        sampled.plot(
            it, [r.get("reward") for r in rows], marker + "-", color=color, ms=3, label=label
        )
        kl.plot(it, [r.get("kl") for r in rows], marker + "-", color=color, ms=3, label=label)
        keys = ["eval/reward"] + sorted(
            {k for r in rows for k in r if k.startswith("eval/n")}, key=lambda s: int(s[6:-7])
        )
        for key, style in zip(keys, ("-", "--", ":", "-."), strict=False):
            pts = [(r["iteration"] + 1, r[key]) for r in rows if r.get(key) is not None]
            n = train_n if key == "eval/reward" else int(key[6:-7])
            if pts:
                held.plot(
                    *zip(*pts, strict=True), marker + style, color=color, label=f"{label}, N={n}"
                )
    shown = {train_n} | {
        int(k[6:-7]) for rows in curves.values() for r in rows for k in r if k.startswith("eval/n")
    }
    for n, style in zip(sorted(shown), ("-", "--", ":", "-."), strict=False):
        cell = (start or {}).get(n)
        if cell is None:
            continue
        em, se = cell["em_frac"], cell.get("em_frac_se") or 0.0
        held.axhline(em, color="0.45", ls=style, lw=1,
                     label=f"warm start, N={n} ({cell['tasks']} tasks, final evaluation)")  # fmt: skip
        held.axhspan(em - se, em + se, color="0.45", alpha=0.12, lw=0)
    for ax, title in ((held, "held-out EM (greedy)"), (sampled, f"sampled reward, N={train_n}"),
                      (kl, "KL to the warm start (per token)")):  # fmt: skip
        ax.set_xlabel("PPO iteration")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_scaling(h: dict[str, Any], path: Path) -> Path | None:
    """Per world, EM fraction and peak tokens against N, pooled over seeds, ± SE (the worlds
    with a cell played)."""
    worlds = {w: world for w, world in h["worlds"].items() if world["cells"]}
    if not worlds:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, len(worlds), figsize=(6.5 * len(worlds), 8.5), squeeze=False,
        gridspec_kw={"hspace": 0.35, "wspace": 0.25},
    )  # fmt: skip
    for col, (w, world) in enumerate(worlds.items()):
        em_ax, peak_ax = axes[0][col], axes[1][col]
        for k, agent in enumerate(world["seeds"]):
            cells = sorted(
                (c for c in world["cells"] if c["agent"] == agent and c["seed"] == POOLED),
                key=lambda c: c["N"],
            )
            ns = [c["N"] for c in cells]
            em_ax.errorbar(ns, [c["em_frac"] for c in cells], yerr=[c["em_frac_se"] or 0 for c in cells],
                           fmt="o-", color=f"C{k}", capsize=3, label=agent)  # fmt: skip
            peak_ax.errorbar(ns, [c["peak_tokens"] for c in cells],
                             yerr=[c["peak_tokens_se"] or 0 for c in cells],
                             fmt="o-", color=f"C{k}", capsize=3, label=agent)  # fmt: skip
        tag = "own test split" if world["own"] else "held out"
        fig.suptitle("pooled over training seeds, ± SE over tasks", fontsize=10)
        for ax, what in ((em_ax, "EM fraction"), (peak_ax, "peak tokens")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("objectives N")
            ax.set_title(f"world {w} ({tag}): {what}", fontsize=10)
            ax.set_xticks(world["objectives"], [str(n) for n in world["objectives"]])
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
