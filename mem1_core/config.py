"""Typed, frozen configuration and the named profiles that select its defaults.

A profile (`tiny`: the embedded CPU default; `smoke`: the same code in seconds, for tests;
`paper`: the GPU setup of the paper) picks defaults for every section; a YAML file and
`section.field=value` overrides are applied on top (`load_config`). Flows take those
JSON-able pieces and build the dataclass on their first line.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class _Section:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[arg-type]


@dataclass(frozen=True)
class WorldConfig(_Section):
    """The procedurally generated encyclopedia (mem1_core.world)."""

    seed: int = 0
    """Seed for names, relations, phrasing and the split."""
    n_countries: int = 24
    n_cities: int = 160
    n_people: int = 1600
    n_orgs: int = 320
    n_works: int = 640
    near_duplicate_fraction: float = 0.15
    """Chance that an entity gets a sibling whose name differs in one syllable (a distractor)."""
    test_fraction: float = 0.25
    """Fraction of entities (and so of questions) held out for the test split."""

    def __post_init__(self) -> None:
        if min(self.n_countries, self.n_cities, self.n_people, self.n_orgs, self.n_works) < 1:
            raise ValueError("world sizes must all be >= 1")
        if self.n_cities < self.n_countries:
            raise ValueError("n_cities must be >= n_countries: every country needs a capital")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError("test_fraction must be in (0, 1)")
        if not 0.0 <= self.near_duplicate_fraction < 1.0:
            raise ValueError("near_duplicate_fraction must be in [0, 1)")


@dataclass(frozen=True)
class DataConfig(_Section):
    """Where questions come from and how they are composed into N-objective tasks."""

    source: str = "world"
    """`world` (embedded), `hotpotqa`, `nq`, or `hotpotqa+nq` (the paper's mix)."""
    hotpotqa: str = "hotpotqa/hotpot_qa"
    """Hub dataset name or a local .json/.jsonl/.parquet file in HotpotQA's row format."""
    hotpotqa_config: str = "distractor"
    nq: str = "nq_open"
    """Hub dataset name (`nq_open`) or a local file in FlashRAG's row format."""
    train_objectives: int = 2
    """N of the training tasks (the paper trains on 2-objective tasks)."""
    eval_objectives: tuple[int, ...] = (1, 2, 4, 8, 16)
    mode: str = "per_source"
    """`per_source` (consecutive questions of one source, as the paper) or `mixed`."""
    seed: int = 0
    max_train_tasks: int | None = None
    max_eval_tasks: int | None = 64

    def __post_init__(self) -> None:
        if self.source not in ("world", "hotpotqa", "nq", "hotpotqa+nq"):
            raise ValueError(f"data.source={self.source!r}: use world, hotpotqa, nq or hotpotqa+nq")
        if self.mode not in ("per_source", "mixed"):
            raise ValueError(f"data.mode={self.mode!r}: use per_source or mixed")
        if self.train_objectives < 1 or any(n < 1 for n in self.eval_objectives):
            raise ValueError("objective counts must be >= 1")


@dataclass(frozen=True)
class RetrievalConfig(_Section):
    """The retriever that answers `<query>`."""

    kind: str = "bm25"
    """`bm25` (embedded default) or `dense` (e5 + FAISS, the paper)."""
    topk: int = 3
    """Passages returned per query as one `<info>` block."""
    encoder: str = "intfloat/e5-base-v2"
    corpus: str | None = None
    """Corpus path for non-world sources (Search-R1 JSONL or corpus Parquet)."""
    url: str | None = None
    """If set, talk to a retrieval server at this URL instead of an in-process index."""

    def __post_init__(self) -> None:
        if self.kind not in ("bm25", "dense"):
            raise ValueError(f"retrieval.kind={self.kind!r}: use bm25 or dense")
        if self.topk < 1:
            raise ValueError("retrieval.topk must be >= 1")


@dataclass(frozen=True)
class Config(_Section):
    """One run's whole configuration."""

    profile: str = "tiny"
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)


PROFILES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "smoke": {
        "world": {"n_countries": 6, "n_cities": 24, "n_people": 160, "n_orgs": 32, "n_works": 64},
        "data": {"eval_objectives": (1, 2, 4), "max_eval_tasks": 8, "max_train_tasks": 64},
    },
    "paper": {
        "data": {"source": "hotpotqa+nq", "max_eval_tasks": 128},
        "retrieval": {"kind": "dense", "topk": 3},
    },
}


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
        raise ValueError(
            f"unknown config field(s) {sorted(unknown)} in {where or 'config'}; "
            f"known: {sorted(names)}"
        )
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}".lstrip(".")) for k, v in values.items()}
    return cls(**kwargs)


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
    """Profile defaults, then the YAML file at `path`, then `overrides`."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    values: dict[str, Any] = _merge({"profile": profile}, PROFILES[profile])
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{path}: the config file must be a mapping of sections")
        loaded.pop("profile", None)
        values = _merge(values, loaded)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    return _build(Config, _merge(values, extra))


def config_json(cfg: Any) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)
