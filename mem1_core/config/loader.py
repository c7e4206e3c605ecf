"""Reading a Config: a profile's defaults, then a YAML file, then `section.field=value`
overrides, each coerced to the annotated field types.

The profiles are YAML files in the repository's `data/profiles/` (one per profile, only
what differs from the sections' defaults). mem1 is installed editable (`pip install -e`),
so they are found beside the package; `MEM1_PROFILES` names another folder.

A field the sections do not have is an error that names the nearest known field, or the
section that has a field of that name (`ppo.num_rollout_workers`: a field of `resources`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from mem1_core.config.run import Config

PROFILES_DIR = Path(__file__).resolve().parents[2] / "data" / "profiles"
"""The repository's `data/profiles/` (overridden by the `MEM1_PROFILES` environment variable)."""


def profiles_dir() -> Path:
    return Path(os.environ.get("MEM1_PROFILES") or PROFILES_DIR)


def profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def profile_values(profile: str) -> dict[str, Any]:
    """The sections a profile sets (its YAML file), as a nested dict."""
    path = profiles_dir() / f"{profile}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown profile {profile!r}; choose one of {profile_names()} (the YAML files in "
            f"{profiles_dir()})"
        )
    return _read_mapping(path)


def _read_mapping(path: str | Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{path}: the config file must be a mapping of sections")
    return loaded


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Convert a YAML/CLI value to the annotated field type, or raise a ValueError."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, where)
            except ValueError:
                pass
        raise ValueError(f"{where}: cannot read {value!r} as {tp}")
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
        return tuple(_coerce(inner, v, where) for v in value)
    if tp is bool:
        if isinstance(value, str):
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
            raise ValueError(f"{where}: expected true/false, got {value!r}")
        return bool(value)
    if tp in (int, float, str):
        try:
            if tp is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            return tp(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}") from None
    return value


def _build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        hints = ""
        for u in sorted(unknown):
            # a field of another section first: a near name here would mislead
            elsewhere = [f"{s}.{u}" for s in _sections_with(u)]
            near = difflib.get_close_matches(u, names, n=1)
            if elsewhere:
                hints += f" ({u!r}: it is {' or '.join(elsewhere)})"
            elif near:
                hints += f" ({u!r}: did you mean {near[0]!r}?)"
        raise ValueError(
            f"unknown config field(s) {sorted(unknown)} in {where or 'config'}{hints}; "
            f"known: {sorted(names)}"
        )
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}".lstrip(".")) for k, v in values.items()}
    return cls(**kwargs)


def _sections_with(name: str) -> list[str]:
    """The sections of Config that have a field `name` (where a misplaced field belongs)."""
    return [
        section
        for section, tp in typing.get_type_hints(Config).items()
        if dataclasses.is_dataclass(tp) and name in {f.name for f in dataclasses.fields(tp)}
    ]


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`["train.lr=1e-3", "world.seed=3"]` -> nested dict (values parsed as YAML scalars)."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: write section.field=value")
        key, raw = item.split("=", 1)
        node = out
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw) if raw.strip() else ""
    return out


def load_config(
    profile: str = "tiny",
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] | dict[str, Any] = (),
) -> Config:
    """Profile defaults, then the YAML file at `path`, then `overrides`. An error in the
    file or the overrides names which of them holds the bad value."""
    values: dict[str, Any] = _merge({"profile": profile}, profile_values(profile))
    if path is not None:
        loaded = _read_mapping(path)
        loaded.pop("profile", None)
        values = _merge(values, loaded)
        _build_from(values, f"config file {path}")  # built once here to name the file
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    values = _merge(values, extra)
    return _build_from(values, "--set overrides" if extra else None)


def config_from_dict(values: dict[str, Any]) -> Config:
    """A config from its resolved values (`Config.to_dict()`, `config_json`, a run's
    run.json): how a parent flow hands the config it built once to its stages, which then
    build nothing from the profile again."""
    return _build_from(copy.deepcopy(dict(values)), "config")


def _build_from(values: dict[str, Any], source: str | None) -> Config:
    try:
        return _build(Config, values)
    except ValueError as e:
        if source is None:
            raise
        raise ValueError(f"{source}: {e}") from None


def config_json(cfg: Any) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)


_ABSENT = object()


def config_changes(old: dict, new: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """The keys (`section.field`, or a top-level key) whose values differ between two resolved
    configs as JSON (`config_json`), `skip` naming sections or fields to leave out.

    A key the old config lacks was added to the code after it was written; what it recorded
    ran as that key's default does (a new option defaults to the behaviour before it), so it
    differs only where the new value is not the default. Without this, every new config field
    would keep every run (and every evaluation cell) made before it from being resumed."""
    defaults = json.loads(config_json(Config()))

    def differs(key: str, was: Any, default: Any, now: Any) -> bool:
        return key not in skip and (default if was is _ABSENT else was) != now

    out = []
    for s, sec in new.items():
        if s in skip:
            continue
        if not isinstance(sec, dict):
            if differs(s, old.get(s, _ABSENT), defaults.get(s, _ABSENT), sec):
                out.append(s)
            continue
        was, default = old.get(s) or {}, defaults.get(s) or {}
        out += [
            f"{s}.{k}"
            for k, v in sec.items()
            if differs(f"{s}.{k}", was.get(k, _ABSENT), default.get(k, _ABSENT), v)
        ]
    return sorted(out)
