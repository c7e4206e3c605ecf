"""A run's retrieval index, made by the index stage (`mem1 index`, the `build-index` flow)
under the run directory's `indexes/` (or `retrieval.index`, prebuilt; or a retrieval server
at `retrieval.url`), and the retriever every rollout reads it through (or, with
`retrieval.backend=web`, a web search API instead of an index)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mem1_core.config import Config
from mem1_core.data.run_tasks import corpus_path
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


def ensure_run_index(cfg: Config, paths: RunPaths) -> Path:
    """The run's index: `retrieval.index` if given (never rebuilt), else one under
    `indexes/`, reused while the corpus fingerprint is unchanged."""
    from mem1_core.retrieval import ensure_index as ensure

    if cfg.retrieval.index is not None:
        return prebuilt_index(cfg)
    index_dir, _built = ensure(
        corpus_path(cfg, paths),
        cfg.retrieval.kind,
        paths.indexes,
        show_progress=False,
        **index_options(cfg),
    )
    return index_dir


def _index_retriever(cfg: Config, paths: RunPaths) -> Retriever:
    if cfg.retrieval.url:
        from mem1_core.retrieval import HttpRetriever

        return HttpRetriever(cfg.retrieval.url, outage_s=cfg.retrieval.outage_seconds)
    return load_index(ensure_run_index(cfg, paths))


def _web_retriever(cfg: Config, paths: RunPaths) -> Retriever:
    from mem1_core.retrieval.web_search import WebSearchRetriever, settings_from_config

    return WebSearchRetriever(settings_from_config(cfg.retrieval, paths.root))


BACKENDS: dict[str, Callable[[Config, RunPaths], Retriever]] = {
    "index": _index_retriever,
    "web": _web_retriever,
}
"""`retrieval.backend` -> the builder of the retriever a run's rollouts read."""


def make_retriever(cfg: Config, paths: RunPaths) -> Retriever:
    return BACKENDS[cfg.retrieval.backend](cfg, paths)
