"""A run's retrieval index, made by the index stage (`mem1 index`, the `build-index` flow)
under the run directory's `indexes/` over the corpus its domain names (Domain.index_corpus),
or `retrieval.index`, prebuilt; and the retriever every rollout reads it through (or a
retrieval server at `retrieval.url`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mem1_core.config import Config
from mem1_core.retrieval.base import Retriever
from mem1_core.retrieval.index import load_index
from mem1_core.runs.layout import RunPaths


def index_options(cfg: Config) -> dict:
    """The index options a retrieval config implies (the encoder of a dense index)."""
    return {"model": cfg.retrieval.encoder} if cfg.retrieval.kind == "dense" else {}


def prebuilt_index(cfg: Config) -> Path:
    """`retrieval.index`, checked to be an index of `retrieval.kind`."""
    from mem1_core.retrieval import read_manifest

    index_dir = Path(cfg.retrieval.index)
    kind = read_manifest(index_dir).kind.value  # not an index: says so
    if kind != cfg.retrieval.kind:
        raise ValueError(
            f"retrieval.index={index_dir} is a {kind} index: set retrieval.kind={kind}, "
            f"or point retrieval.index at a {cfg.retrieval.kind} index"
        )
    return index_dir


def ensure_run_index(cfg: Config, paths: RunPaths, corpus: Callable[[], Path]) -> Path:
    """The run's index: `retrieval.index` if given (never rebuilt), else one under `indexes/`
    over the file `corpus()` names (made if missing), reused while its fingerprint is
    unchanged."""
    from mem1_core.retrieval import ensure_index as ensure

    if cfg.retrieval.index is not None:
        return prebuilt_index(cfg)
    index_dir, _built = ensure(
        corpus(),
        cfg.retrieval.kind,
        paths.indexes,
        show_progress=False,
        **index_options(cfg),
    )
    return index_dir


def index_retriever(cfg: Config, paths: RunPaths, corpus: Callable[[], Path]) -> Retriever:
    """The retriever of a run's index (ensure_run_index's), or of the server at
    `retrieval.url`."""
    if cfg.retrieval.url:
        from mem1_core.retrieval import HttpRetriever

        return HttpRetriever(cfg.retrieval.url, outage_s=cfg.retrieval.outage_seconds)
    return load_index(ensure_run_index(cfg, paths, corpus))
