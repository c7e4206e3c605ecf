"""An experiment file (`data/experiments/<name>.yaml`) read into its ExperimentSpec: the keys
it may have, how each is written, and the overrides of the file itself (`experiment.key=value`,
the part a run selects: mem1_core.experiment.parts). What a spec must satisfy is checked by the
spec itself (mem1_core.experiment.spec.ExperimentSpec.__post_init__).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from mem1_core.experiment.spec import (
    CLAIM_ROLES,
    EXPERIMENTS_DIR,
    PLAIN,
    WARM_START_AGENT,
    Above,
    Arm,
    ExperimentSpec,
    PaperClaims,
    Play,
    WarmStart,
)


def experiments_dir() -> Path:
    return Path(os.environ.get("MEM1_EXPERIMENTS") or EXPERIMENTS_DIR)


def experiment_path(name_or_path: str) -> Path:
    """`smol` -> data/experiments/smol.yaml; a path to a YAML file as it is."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") or p.is_file():
        if not p.is_file():
            raise FileNotFoundError(f"experiment file {p} does not exist")
        return p
    found = experiments_dir() / f"{name_or_path}.yaml"
    if not found.is_file():
        names = sorted(x.stem for x in experiments_dir().glob("*.yaml"))
        raise ValueError(f"experiment {name_or_path!r}: no {found}; the experiments are {names}")
    return found


_KEYS = {"profile", "set", "warm_starts", "arms", "eval", "curve", "claims", "ray", "parts",
         "merge", "select"}  # fmt: skip
_EVAL_KEYS = {"worlds", "objectives", "objectives_per_n", "agents", "plays", "teacher", "set"}
_ARM_KEYS = {"trainer", "memory", "seeds", "set", "warm_start"}
_CLAIM_KEYS = {"se", "peak_ratio", "above", "effects", "full_at", "full_test", "peak_at",
               *CLAIM_ROLES}  # fmt: skip


def _setting(key: str, value: Any) -> str:
    """A `set:` entry as the loader's override (`ppo.critic_layers=null`)."""
    return f"{key}={json.dumps(value)}"


def _settings(where: str, raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: `set:` is a mapping of section.field: value")
    return tuple(_setting(k, v) for k, v in raw.items())


def _unknown(where: str, got: Any, allowed: set[str]) -> None:
    extra = set(got) - allowed
    if extra:
        raise ValueError(f"{where}: unknown keys {sorted(extra)}; known: {sorted(allowed)}")


def _arm(path: Path, name: str, raw: Any) -> Arm:
    where = f"{path}: arm {name}"
    if not isinstance(raw, dict) or not {"trainer", "memory", "seeds"} <= set(raw):
        raise ValueError(
            f"{where}: write it as {{trainer: ppo|grpo|sft, memory: mem1|full|..., seeds: [0, 1]}} "
            f"(optional `set:` and `warm_start:`), not {raw!r}"
        )
    _unknown(where, raw, _ARM_KEYS)
    return Arm(
        trainer=str(raw["trainer"]), memory=str(raw["memory"]),
        seeds=tuple(int(s) for s in raw["seeds"]),
        overrides=_settings(where, raw.get("set")),
        warm_start=str(raw.get("warm_start", PLAIN)),
    )  # fmt: skip


SPEC_PREFIX = "experiment."
"""An override of the experiment file itself, not of the config: `experiment.eval.worlds=[7]`,
`experiment.arms.mem1-ppo.seeds=[0,1,2]`."""


def _apply_spec_overrides(raw: dict, overrides: list[str]) -> None:
    for item in overrides:
        key, sep, value = item.removeprefix(SPEC_PREFIX).partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: write {SPEC_PREFIX}key.subkey=value")
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part} is not a mapping in the experiment")
        node[leaf] = yaml.safe_load(value) if value.strip() else ""


def load_experiment(name_or_path: str, overrides: list[str] | None = None) -> ExperimentSpec:
    """An experiment from its YAML file. `overrides`: `section.field=value` go to the config
    after the file's `set:` (a user's --set wins); `experiment.key=value` replace the file's
    own keys (`experiment.eval.objectives_per_n=512`)."""
    path = experiment_path(name_or_path)
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict) or "profile" not in raw:
        raise ValueError(f"{path}: an experiment is a mapping with at least `profile:`")
    own = [o for o in overrides or [] if o.startswith(SPEC_PREFIX)]
    overrides = [o for o in overrides or [] if not o.startswith(SPEC_PREFIX)]
    _apply_spec_overrides(raw, own)
    select = raw.pop("select", None)
    ev, curve, claims = raw.get("eval") or {}, raw.get("curve") or {}, raw.get("claims") or {}
    for where, keys, allowed in (("", raw, _KEYS), ("eval.", ev, _EVAL_KEYS),
                                 ("claims.", claims, _CLAIM_KEYS)):  # fmt: skip
        extra = set(keys) - allowed
        if extra:
            raise ValueError(
                f"{path}: unknown keys {sorted(where + k for k in extra)}; known: {sorted(allowed)}"
            )
    arms = {str(a): _arm(path, str(a), v) for a, v in (raw.get("arms") or {}).items()}
    warm_starts = {}
    for w, v in (raw.get("warm_starts") or {}).items():
        if not isinstance(v, dict):
            raise ValueError(f"{path}: warm start {w}: write {{set: {{section.field: value}}}}")
        _unknown(f"{path}: warm start {w}", v, {"set"})
        warm_starts[str(w)] = WarmStart(_settings(f"{path}: warm start {w}", v.get("set")))
    plays = {}
    for p, v in (ev.get("plays") or {}).items():
        if not isinstance(v, dict) or set(v) != {"arm", "memory"}:
            raise ValueError(f"{path}: eval.plays {p}: write {{arm: ARM, memory: MEMORY}}")
        plays[str(p)] = Play(str(v["arm"]), str(v["memory"]))
    pairs: dict[str, list[Above]] = {"above": [], "effects": []}
    for key, out in pairs.items():
        for c in claims.get(key) or ():
            if not isinstance(c, dict) or set(c) != {"a", "b", "objectives"}:
                raise ValueError(
                    f"{path}: claims.{key}: write {{a: AGENT, b: AGENT, objectives: [N]}}"
                )
            out.append(Above(str(c["a"]), str(c["b"]), tuple(int(n) for n in c["objectives"])))
    whole = ExperimentSpec(
        name=path.stem,
        profile=str(raw["profile"]),
        overrides=(*_settings(str(path), raw.get("set")), *overrides),
        arms=arms,
        warm_starts=warm_starts,
        plays=plays,
        worlds=tuple(int(w) for w in ev.get("worlds", ())),
        objectives=tuple(int(n) for n in ev.get("objectives", (1, 2, 4, 8, 16))),
        objectives_per_n=int(ev.get("objectives_per_n", 128)),
        agents=tuple(str(a) for a in ev.get("agents", (WARM_START_AGENT, *arms))),
        teacher=bool(ev.get("teacher", False)),
        eval_overrides=_settings(f"{path}: eval", ev.get("set")),
        curve_objectives=tuple(int(n) for n in curve.get("objectives", (8,))),
        curve_points=int(curve.get("points", 4)),
        se_bar=float(claims.get("se", 2.0)),
        peak_ratio_bar=float(claims.get("peak_ratio", 0.3)),
        roles={r: str(claims.get(r, a)) for r, a in CLAIM_ROLES.items()},
        paper=PaperClaims(
            full_at=tuple(int(n) for n in claims.get("full_at", PaperClaims.full_at)),
            full_test=str(claims.get("full_test", PaperClaims.full_test)),
            peak_at=int(claims.get("peak_at", PaperClaims.peak_at)),
        ),
        above=tuple(pairs["above"]),
        effects=tuple(pairs["effects"]),
        ray=bool(raw.get("ray", False)),
        parts=_parts(path, raw.get("parts")),
        pair_across_starts=_merge(path, raw.get("merge")),
    )
    if not select:
        return whole
    from mem1_core.experiment.parts import select_part  # noqa: I001

    if not isinstance(select, dict) or set(select) - {"seeds", "part"}:
        raise ValueError(f"{path}: select a part as {{seeds: [0, 1], part: NAME}}, not {select!r}")
    seeds = select.get("seeds")
    return select_part(whole, None if seeds is None else [int(s) for s in seeds],
                       select.get("part"))  # fmt: skip


def _parts(path: Path, raw: Any) -> dict[str, tuple[str, ...]]:
    """The file's `parts:` ({core: {arms: [mem1-ppo, full-ppo]}, ...})."""
    out = {}
    for p, v in (raw or {}).items():
        if not isinstance(v, dict) or set(v) != {"arms"} or not isinstance(v["arms"], list):
            raise ValueError(f"{path}: part {p}: write {{arms: [ARM, ...]}}")
        out[str(p)] = tuple(str(a) for a in v["arms"])
    return out


def _merge(path: Path, raw: Any) -> bool:
    """The file's `merge:` ({pair_across_starts: true}): whether merging parts whose warm
    starts differ is meant."""
    if raw is None:
        return False
    if not isinstance(raw, dict) or set(raw) - {"pair_across_starts"}:
        raise ValueError(f"{path}: merge: write {{pair_across_starts: true|false}}")
    return bool(raw.get("pair_across_starts", False))
