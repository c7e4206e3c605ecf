"""A run's starting policy: a policy's own tokenizer adopted by the run that starts from it; the
initial policy (hub model, shipped base, or the tiny model from config). The run's tokenizer is
made by mem1_core.domains.inputs.ensure_tokenizer (a tiny one is fitted on its domain's texts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mem1_core.config import Config
from mem1_core.models.model import build_tiny_model, load_model
from mem1_core.models.tokenizer import load_tokenizer
from mem1_core.runs.atomic import atomic_dir
from mem1_core.runs.layout import RunPaths

ADOPTED = "mem1-adopted-from"
"""A file in the run's tokenizer directory naming the policy it was copied from: that run
reads with the policy's tokenizer under any profile (the profile's base yields to it)."""


def adopt_init_tokenizer(cfg: Config, paths: RunPaths, init: Path | None) -> None:
    """A trained policy brings its tokenizer: a run that starts from it must tokenise with
    the same one, under any profile. The run's tokenizer is copied from `init` if it has none
    yet; a different one is an error (a model read through another tokenizer's ids is silently
    garbage: the tiny tokenizer is retrained per run directory, and its training data can
    change between versions)."""
    if init is None or not (init / "tokenizer.json").exists():
        return
    from mem1_core.models.base import resolve_base

    is_base = cfg.model.base is not None and resolve_base(cfg.model.base) == Path(init).resolve()
    theirs = load_tokenizer(init)
    if (paths.tokenizer / "tokenizer.json").exists():
        if load_tokenizer(paths.tokenizer).get_vocab() != theirs.get_vocab():
            raise ValueError(
                f"{init} was trained with another tokenizer than {paths.tokenizer}: start from "
                "a policy of this run, or use a fresh run directory (it adopts the policy's)"
            )
        return
    with atomic_dir(paths.tokenizer) as tmp:
        theirs.save_pretrained(tmp)
        if not is_base:
            (tmp / ADOPTED).write_text(f"{init}\n")


def initial_policy(cfg: Config, tokenizer):
    """The starting point: the hub model, the shipped base (`model.base`), or the tiny model
    from config with random weights."""
    if cfg.model.base is not None:
        from mem1_core.models.base import check_base, resolve_base

        check_base(cfg.model.base)
        return load_model(resolve_base(cfg.model.base), cfg.model, tokenizer)
    if cfg.model.name_or_path is None:
        return build_tiny_model(cfg.model, tokenizer)
    return load_model(cfg.model.name_or_path, cfg.model, tokenizer)


def load_policy(cfg: Config, tokenizer: Any, init: Path | None, device: torch.device):
    """The policy a run starts from (`init`, else the initial policy) on `device`, in eval mode."""
    model = (
        initial_policy(cfg, tokenizer) if init is None else load_model(init, cfg.model, tokenizer)
    )
    return model.to(device).eval()
