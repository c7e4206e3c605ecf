"""The configuration reference: every field of `Config` with its type, its docstring (read
from the section dataclasses' source, where each field's docstring follows it) and, for a
resolved config, where its value came from.

A value comes from the last of load_config's layers that sets it: the field's `default`,
`profile NAME` (data/profiles/NAME.yaml), `file PATH` (`--config`), `--set`. The layers are
read with the loader's own readers; the values themselves are load_config's, so what is
shown is what a run gets. `mem1 config show` prints one resolved config;
`mem1 config reference` writes docs/configuration.md.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import re
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem1_core.config.loader import (
    _read_mapping,
    load_config,
    parse_overrides,
    profile_names,
    profile_values,
    profiles_dir,
)
from mem1_core.config.run import Config

DEFAULT = "default"
SET = "--set"
PROFILE_FIELD = "profile"
"""Config's only top-level scalar: the profile's name, given by `--profile`."""

REFERENCE_COMMAND = "mem1 config reference > docs/configuration.md"
"""How docs/configuration.md is written (tests/test_config_reference.py regenerates it)."""


@dataclass(frozen=True)
class FieldDoc:
    """One leaf field of Config: `key` is `section.field`."""

    key: str
    type: str
    default: Any
    doc: str


@dataclass(frozen=True)
class Resolved:
    """A field of a resolved config: its value and the layer it came from."""

    key: str
    value: Any
    source: str
    doc: str
    here: str | None = None
    """What a machine-dependent value (`model.autocast: auto`) resolves to in this process,
    and why; None for every other field."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": jsonable(self.value),
            "source": self.source,
            "doc": self.doc,
            **({"here": self.here} if self.here else {}),
        }


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
    """{field name: the string literal that follows its annotation in the class body ("" if
    none)}, over the dataclass and its bases."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, after in zip(body, [*body[1:], None], strict=True):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                doc = ""
                if (
                    isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    doc = inspect.cleandoc(after.value.value)
                out[node.target.id] = doc
    return out


def type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def config_fields(cls: type = Config, prefix: str = "") -> list[FieldDoc]:
    """Every leaf field of `cls`, in declaration order (sections recursed into)."""
    hints = typing.get_type_hints(cls)
    docs = field_docstrings(cls)
    out: list[FieldDoc] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.extend(config_fields(tp, f"{prefix}{f.name}."))
        else:
            out.append(FieldDoc(prefix + f.name, type_name(tp), _default(f), docs[f.name]))
    return out


def leaf_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys of a nested mapping's leaves: {"ppo": {"lr": 1}} -> ["ppo.lr"]."""
    keys: list[str] = []
    for k, v in values.items():
        if isinstance(v, dict) and v:
            keys.extend(leaf_keys(v, f"{prefix}{k}."))
        else:
            keys.append(prefix + str(k))
    return keys


def provenance(
    profile: str = "tiny",
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] | dict[str, Any] = (),
) -> dict[str, str]:
    """{dotted key: the last layer of load_config that sets it}; keys no layer sets are
    absent (their value is the default)."""
    layers: list[tuple[str, dict[str, Any]]] = [(f"profile {profile}", profile_values(profile))]
    if path is not None:
        layers.append((f"file {path}", _read_mapping(path)))
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides)
    layers.append((SET, extra))
    out = {PROFILE_FIELD: "--profile"}
    for source, values in layers:
        for key in leaf_keys(values):
            if key != PROFILE_FIELD:  # a file's `profile:` is ignored by load_config
                out[key] = source
    return out


def _value(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def resolve(
    profile: str = "tiny",
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] | dict[str, Any] = (),
) -> list[Resolved]:
    """Every field of the config load_config builds from these pieces, with its source."""
    cfg = load_config(profile, path, overrides)
    sources = provenance(profile, path, overrides)
    return [
        Resolved(f.key, value, sources.get(f.key, DEFAULT), f.doc, _here(f.key, value))
        for f in config_fields()
        for value in [_value(cfg, f.key)]
    ]


def _here(key: str, value: Any) -> str | None:
    """`auto` of `model.autocast`, resolved on this machine (the probe runs once)."""
    if key != "model.autocast" or value != "auto":
        return None
    import torch

    from mem1_core.models.compute import describe_auto

    return describe_auto("cuda" if torch.cuda.is_available() else "cpu")


def jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def render_value(value: Any) -> str:
    """A value as `--set` reads it back (YAML flow: JSON scalars, lists)."""
    return json.dumps(jsonable(value))


def render_show(rows: list[Resolved], width: int = 100) -> str:
    """Plain text: `key = value` and its source on one line, the field's doc below it."""
    lines: list[str] = []
    section = None
    left = max(len(f"{r.key} = {render_value(r.value)}") for r in rows)
    left = min(left, width - 24)
    for r in rows:
        head = r.key.split(".")[0] if "." in r.key else None
        if head != section:
            section = head
            lines.append(f"\n[{head}]" if head else "")
        assignment = f"{r.key} = {render_value(r.value)}"
        lines.append(f"{assignment:<{left}}  # {r.source}")
        if r.here:
            lines.append(f"    -> {r.here}")
        if r.doc:
            lines.extend(
                textwrap.wrap(
                    " ".join(r.doc.split()), width, initial_indent="    ", subsequent_indent="    "
                )
            )
    return "\n".join(lines).strip("\n") + "\n"


# ---- the Markdown reference (docs/configuration.md) ----------------------------------------


def profile_summary(name: str) -> str:
    """The first sentence of a profile file's leading comment."""
    text = (profiles_dir() / f"{name}.yaml").read_text()
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    words = " ".join(comment)
    m = re.match(r"(.+?\.)(\s|$)", words)
    return m.group(1) if m else words


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + str(k)] = v
    return out


def render_reference() -> str:
    """docs/configuration.md: the layers, the profiles, then one table per section."""
    names = profile_names()
    by_profile = {name: _flat(load_config(name).to_dict()) for name in names}
    set_by = {name: set(leaf_keys(profile_values(name))) for name in names}
    hints = typing.get_type_hints(Config)
    out = [
        "# Configuration reference",
        "",
        f"Generated from the field docstrings in `mem1_core/config/` by `{REFERENCE_COMMAND}`;",
        "do not edit it by hand (a test regenerates it and fails when it differs).",
        "",
        "A config is resolved in layers, each later one winning: the defaults below, the",
        "profile's YAML file (`--profile NAME`: `data/profiles/NAME.yaml`), a YAML file of the",
        "same sections (`--config FILE`), then `--set section.field=value` overrides (values",
        "read as YAML). Every `mem1` stage and every flow takes these three. To see one resolved",
        "config, each field with its value, its doc and the layer it came from:",
        "",
        "```bash",
        "mem1 config show --profile smol --set ppo.iterations=8           # text",
        "mem1 config show --profile paper --config local.yaml --changed   # only what is not a default",
        "mem1 config show --profile tiny --json                            # one JSON object per field",
        "```",
        "",
        "## Profiles",
        "",
        "| profile | what it is |",
        "|---|---|",
        *(f"| `{n}` | {_cell(profile_summary(n))} |" for n in names),
        "",
        "The **profiles** column below lists the profiles that set a field, with their value.",
    ]
    fields = config_fields()
    for f in dataclasses.fields(Config):
        tp = hints[f.name]
        if not dataclasses.is_dataclass(tp):
            continue
        out += [
            "",
            f"## `{f.name}`",
            "",
            _cell(inspect.getdoc(tp) or ""),
            "",
            "| field | type | default | profiles | description |",
            "|---|---|---|---|---|",
        ]
        for fd in fields:
            if not fd.key.startswith(f.name + "."):
                continue
            profiles = "; ".join(
                f"{n}: `{render_value(by_profile[n][fd.key])}`"
                for n in names
                if fd.key in set_by[n]
            )
            out.append(
                f"| `{fd.key.split('.', 1)[1]}` | `{_cell(fd.type)}` | "
                f"`{_cell(render_value(fd.default))}` | {_cell(profiles)} | {_cell(fd.doc)} |"
            )
    return "\n".join(out) + "\n"
