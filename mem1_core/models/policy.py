"""A run's tokenizer and starting policy, made by the stage that first needs them: the hub
model's or the shipped base's tokenizer, else one trained on the run's world; a policy's own
tokenizer adopted by the run that starts from it; the initial policy (hub model, shipped base,
or the tiny model from config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from mem1_core.config import Config
from mem1_core.data.prompts import task_prompt
from mem1_core.data.run_tasks import ensure_world
from mem1_core.models.model import build_tiny_model, load_model
from mem1_core.models.tokenizer import load_tokenizer, train_tiny_tokenizer
from mem1_core.runs.atomic import atomic_dir
from mem1_core.runs.layout import RunPaths


def ensure_tokenizer(cfg: Config, paths: RunPaths):
    """The run's tokenizer: a hub model's; else the base's (`model.base`: one tokenizer for
    every run and world); else the tiny tokenizer trained on the world corpus and prompts (on
    the training shop's text and pages for WebShop)."""
    if (paths.tokenizer / ADOPTED).is_file():  # a policy's own: the profile's model yields
        return load_tokenizer(paths.tokenizer)
    if cfg.model.name_or_path is not None:
        return load_tokenizer(cfg.model.name_or_path)
    if cfg.model.base is not None:
        from mem1_core.models.base import check_base, resolve_base

        check_base(cfg.model.base)
        adopt_init_tokenizer(cfg, paths, resolve_base(cfg.model.base))
        return load_tokenizer(paths.tokenizer)
    if not (paths.tokenizer / "tokenizer.json").exists() and cfg.env.kind == "webshop":
        from mem1_core.webshop.run import training_shop_texts

        tok = train_tiny_tokenizer(training_shop_texts(cfg, paths), cfg.model.tokenizer_vocab)
        with atomic_dir(paths.tokenizer) as tmp:
            tok.save_pretrained(tmp)
    if not (paths.tokenizer / "tokenizer.json").exists():
        world = ensure_world(cfg, paths)
        corpus = pq.read_table(world / "corpus.parquet")["contents"].to_pylist()
        questions = pq.read_table(world / "questions.parquet")["question"].to_pylist()
        prompts = [task_prompt(questions[i : i + 2]) for i in range(0, len(questions), 2)]
        tok = train_tiny_tokenizer(corpus + prompts, cfg.model.tokenizer_vocab)
        with atomic_dir(paths.tokenizer) as tmp:
            tok.save_pretrained(tmp)
    return load_tokenizer(paths.tokenizer)


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
