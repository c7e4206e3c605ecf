"""Parts merged into one experiment, and the headline as a pure function of records.

`merge_records` joins the records of parts run anywhere (mem1_core.experiment.records) into the
records one run of the whole experiment would have written, and refuses, in one line naming the
source and the field, what would pair what should not be paired:
- another experiment, or an experiment config that trains differently;
- a duplicate arm × seed;
- one arm under different training settings;
- a warm start whose weights differ between parts (its arms would be compared with a start
  they did not start from), unless the experiment file's `merge: {pair_across_starts: true}`
  says that is meant; a warm start's agent evaluated in several parts from the same weights is
  kept once (the first part's cells);
- different evaluation tasks for one world and N.

`headline_of` computes the headline (mem1_core.experiment.headline.experiment_headline) from
records alone: a run directory is read once, to export it.
"""

from __future__ import annotations

from typing import Any

from mem1_core.experiment.records import Records, RecordsError, settings_changes


def _src(r: Records) -> str:
    return r.parts[0].get("source", "?") if r.parts else "?"


def _first_difference(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return next((k for k in keys if a.get(k) != b.get(k)), "?")


def _start_changes(a: dict, b: dict) -> list[str]:
    """What differs in a warm start's training between two parts: its settings, field by field
    (settings_changes), where both records hold them; its settings hash where one predates
    that."""
    if "settings" in a and "settings" in b:
        return [f"settings.{k}" for k in settings_changes(a["settings"], b["settings"])]
    return ["settings_hash"] if a["settings_hash"] != b["settings_hash"] else []


MERGE_ONLY = ("parts", "pair_across_starts")
"""What an experiment file says of its cut into parts and of how they merge, not of what it
trains or claims: parts recorded before the file gained a finer cut, or said that pairing
across starts is meant, are of the same experiment."""


def _what(experiment: dict) -> dict:
    return {k: v for k, v in experiment.items() if k not in MERGE_ONLY}


def merge_records(recs: list[Records]) -> Records:
    """One experiment's records from its parts' (see the module's docstring)."""
    from mem1_core.experiment.plan import training_changes

    if not recs:
        raise RecordsError("no records to merge: give run directories or exported records")
    first = recs[0]
    whole = first.experiment
    out = Records(whole, first.config, first.own_world, first.train_n, list(first.worlds))
    arms: dict[tuple[str, int], str] = {}
    settings: dict[str, tuple[dict, str]] = {}
    starts: dict[str, tuple[dict, str]] = {}
    across = any(r.experiment.get("pair_across_starts") for r in recs)  # the newest file's say
    tasks: dict[tuple[int, int], tuple[str, str]] = {}
    kept_cells: set[tuple] = set()
    for r in recs:
        src = _src(r)
        if _what(r.experiment) != _what(whole):
            key = _first_difference(_what(whole), _what(r.experiment))
            raise RecordsError(f"{src}: experiment.{key} differs from {_src(first)}'s: the parts "
                               "are of different experiments")  # fmt: skip
        changed = training_changes(first.config, r.config)
        if changed:
            raise RecordsError(f"{src}: config.{changed[0]} differs from {_src(first)}'s: the "
                               "parts train differently")  # fmt: skip
        for w, s in r.starts.items():
            seen = starts.setdefault(w, (s, src))
            if changed := _start_changes(seen[0], s):
                raise RecordsError(f"{src}: starts.{w}.{changed[0]} differs from {seen[1]}'s: "
                                   "the warm start trained under other settings")  # fmt: skip
            if seen[0]["weights_hash"] != s["weights_hash"] and not across:
                raise RecordsError(
                    f"{src}: starts.{w}.weights_hash differs from {seen[1]}'s: its arms would be "
                    "paired across different starting weights (write `merge: {pair_across_starts: "
                    "true}` in the experiment file where that is meant)"
                )
        for a in r.arms:
            key = (a["arm"], a["seed"])
            if key in arms:
                raise RecordsError(f"{src}: arms ({a['arm']}, seed {a['seed']}) is also in "
                                   f"{arms[key]}: a duplicate arm × seed")  # fmt: skip
            arms[key] = src
            seen = settings.setdefault(a["arm"], (a["settings"], src))
            if changed := settings_changes(seen[0], a["settings"]):
                field = changed[0]
                raise RecordsError(f"{src}: arms ({a['arm']}, seed {a['seed']}).settings.{field} "
                                   f"differs from {seen[1]}'s: one arm, two trainings")  # fmt: skip
            out.arms.append(a)
        dropped = set()
        for c in r.cells:
            wn = (c["world"], c["N"])
            seen = tasks.setdefault(wn, (c["tasks_hash"], src))
            if seen[0] != c["tasks_hash"]:
                raise RecordsError(
                    f"{src}: cells (world {c['world']}, N={c['N']}).tasks_hash differs from "
                    f"{seen[1]}'s: different evaluation tasks"
                )
            key = (c["world"], c["agent"], c["seed"], c["N"])
            if key in kept_cells:  # a warm start's agent, evaluated in more than one part
                dropped.add(key)
                continue
            kept_cells.add(key)
            out.cells.append(c)
        out.tasks += [t for t in r.tasks
                      if (t["world"], t["agent"], t["seed"], t["N"]) not in dropped]  # fmt: skip
        for w in r.worlds:
            if w not in out.worlds:
                out.worlds.append(w)
        out.starts = {**{w: s for w, (s, _) in starts.items()}}
        out.parts += r.parts
        out.samples += r.samples
    return out


def not_run(spec, rec: Records) -> list[str]:
    """The arm runs of the whole experiment that no merged part trains, one entry per arm
    ("mem1-ppo seeds 0, 2: no part has run it"); a part's own unfinished stages are its
    `pending`."""
    from mem1_core.experiment.parts import select_part

    taken = set()
    for p in rec.parts:
        sel = p.get("selection") or {}
        part = select_part(spec, sel.get("seeds"), sel.get("part"))
        taken |= {(arm, s) for arm, a in part.arms.items() for s in a.seeds}
    out = []
    for arm, a in spec.arms.items():
        seeds = [str(s) for s in a.seeds if (arm, s) not in taken]
        if seeds:
            many = "seeds" if len(seeds) > 1 else "seed"
            out.append(f"{arm} {many} {', '.join(seeds)}: no part has run it")
    return out


def headline_of(rec: Records) -> dict[str, Any]:
    """The experiment's headline (experiment_headline's) from its records, with `complete`,
    `pending`, the PPO arms' curves, each stage's wall time and CPU, and each part's
    provenance."""
    from mem1_core.experiment.headline import experiment_headline
    from mem1_core.experiment.plan import agent_name
    from mem1_core.experiment.spec import ExperimentSpec

    spec = ExperimentSpec.from_dict(rec.experiment)
    evals: dict[int, dict] = {w: {} for w in rec.worlds}
    behaviours: dict[int, dict] = {w: {} for w in rec.worlds}
    for t in rec.tasks:
        name = agent_name(t["agent"], t["seed"])
        evals[t["world"]].setdefault(name, {}).setdefault(t["N"], {})[t["task"]] = (
            t["em"], t["peak"])  # fmt: skip
        if t["behaviour"] is not None:
            by_n = behaviours[t["world"]].setdefault(name, {})
            by_n.setdefault(t["N"], {})[t["task"]] = t["behaviour"]
    h = experiment_headline(
        evals, rec.own_world, rec.train_n, spec.se_bar, spec.peak_ratio_bar, spec.name,
        list(spec.agents), spec.roles, spec.above, behaviours, spec.effects, spec.paper,
    )  # fmt: skip
    pending = rec.pending + not_run(spec, rec)
    h["complete"], h["pending"] = not pending, pending
    h["curves"] = {f"{a['arm']} · seed {a['seed']}": a["curve"]
                   for a in rec.arms if a["trainer"] != "sft"}  # fmt: skip
    several = len(rec.parts) > 1
    h["walls"], h["cpus"], h["walls_reused"] = {}, {}, {}
    for p in rec.parts:
        for stage, s in p["stages"].items():
            key = f"{p['label']} · {stage}" if several else stage
            h["walls"][key], h["cpus"][key] = s["seconds"], s["cpus"]
            if s.get("reused_from"):
                h["walls_reused"][key] = s["reused_from"]
    h["parts"] = [{
        "label": p["label"], "run": p["run"], "source": p.get("source"),
        "commit": (p.get("code") or {}).get("commit") or p["exported_with"].get("commit"),
        "minutes": sum(s["seconds"] for s in p["stages"].values() if not s.get("reused_from")) / 60,
        "cpus": sorted({c for s in p["stages"].values() for c in s["cpus"]}),
    } for p in rec.parts]  # fmt: skip
    return h
