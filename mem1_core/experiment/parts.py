"""A part of an experiment: what some of its training seeds, or one of its named parts, need.

An experiment of many arms × seeds takes hours; a run directory lives on one disk and dies with
its machine. A part is a run of its own, in its own run directory, on any machine: its arms
(a named part's, `--part NAME`, the file's `parts:`) under its training seeds (`--seeds K`),
the warm starts those arms start from (a part trains them itself), and the evaluation of its
agents (a warm start's agent wherever a part trains that warm start). Its records
(mem1_core.experiment.records) merge with the other parts' into the headline one run of the
whole experiment writes, figure for figure.

A part is selected by overrides of the experiment itself, so every stage of its run (the
deployment's subflows, a resume) loads the same part: `experiment.select.seeds=[0]`,
`experiment.select.part=core` (`select_overrides`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mem1_core.experiment.spec import ExperimentSpec

SELECT = "experiment.select"
"""The override prefix that selects a part (mem1_core.experiment.parse.load_experiment)."""


def select_overrides(seeds: list[int] | None = None, part: str | None = None) -> list[str]:
    """The experiment overrides that select training seeds `seeds` and/or part `part`."""
    out = []
    if seeds:
        out.append(f"{SELECT}.seeds={sorted({int(s) for s in seeds})}")
    if part:
        out.append(f"{SELECT}.part={part}")
    return out


def parse_seeds(text: str) -> list[int]:
    """`0,2` -> [0, 2] (the command line's `--seeds`)."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seeds {text!r}: give training seeds as K[,K...], e.g. 0,2") from None
    if not seeds:
        raise ValueError("--seeds: give at least one training seed (K[,K...])")
    return seeds


def select_part(
    spec: ExperimentSpec, seeds: list[int] | None = None, part: str | None = None
) -> ExperimentSpec:
    """The part of `spec` that trains `part`'s arms (all arms without one) under `seeds` (all
    of each arm's without them): those arms, the warm starts they start from, the agents that
    play them (and each warm start's agent the part trains), and the claims and effects whose
    two agents the part evaluates. The whole experiment rides along (`whole`), for the merge."""
    where = f"experiment {spec.name}"
    arms = dict(spec.arms)
    if part is not None:
        if part not in spec.parts:
            raise ValueError(
                f"{where}: no part {part!r}; its parts are {list(spec.parts) or 'none'} "
                "(the file's `parts:`)"
            )
        arms = {a: arms[a] for a in spec.parts[part]}
    if seeds is not None:
        wanted = sorted(set(seeds))
        known = sorted({s for a in arms.values() for s in a.seeds})
        missing = [s for s in wanted if s not in known]
        if missing:
            of = f" of part {part}" if part else ""
            raise ValueError(f"{where}: no arm{of} trains seed {missing}; its seeds are {known}")
        arms = {a: replace(x, seeds=tuple(s for s in x.seeds if s in wanted))
                for a, x in arms.items()}  # fmt: skip
        arms = {a: x for a, x in arms.items() if x.seeds}
    starts = {x.warm_start for x in arms.values()}

    def plays_here(agent: str) -> bool:
        arm = spec.agent_arm(agent)
        return arm in arms if arm is not None else spec.warm_start_agents()[agent] in starts

    agents = tuple(a for a in spec.agents if plays_here(a))
    selection: dict[str, Any] = {"seeds": sorted(set(seeds)) if seeds is not None else None,
                                 "part": part}  # fmt: skip
    return replace(
        spec,
        arms=arms,
        agents=agents,
        plays={p: x for p, x in spec.plays.items() if x.arm in arms},
        warm_starts={w: x for w, x in spec.warm_starts.items() if w in starts},
        above=tuple(c for c in spec.above if c.a in agents and c.b in agents),
        effects=tuple(c for c in spec.effects if c.a in agents and c.b in agents),
        selection=selection,
        whole=spec.to_dict(),
    )


def part_label(spec: ExperimentSpec) -> str:
    """`seeds 0` / `part core, seeds 1, 2` / `whole`: which part a run or its records are."""
    sel = spec.selection or {}
    bits = []
    if sel.get("part"):
        bits.append(f"part {sel['part']}")
    if sel.get("seeds") is not None:
        bits.append("seed" + ("s " if len(sel["seeds"]) > 1 else " ")
                    + ", ".join(str(s) for s in sel["seeds"]))  # fmt: skip
    return ", ".join(bits) or "whole"
