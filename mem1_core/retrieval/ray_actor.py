"""A retriever inside a Ray actor, so many rollout workers share one loaded index
(docs/design.md §4.6: the retriever is a Ray actor at every scale).

    handle = start_retriever_actor(index_dir)      # after ray.init()
    retriever = RayRetriever(handle)               # a Retriever, usable anywhere
"""

from __future__ import annotations

import os
from typing import Any

from mem1_core.retrieval.base import Hit, read_manifest
from mem1_core.retrieval.index import load_index


class RetrieverActor:
    """Plain class holding a loaded index; wrap it with `ray.remote` (see below)."""

    def __init__(self, index_dir: str | os.PathLike, corpus_path: str | os.PathLike | None = None):
        self._manifest = read_manifest(index_dir)
        self._retriever = load_index(index_dir, corpus_path)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        return self._retriever.search(queries, k)

    def info(self) -> dict[str, Any]:
        return {"kind": self._manifest.kind.value, "documents": self._manifest.documents}


def start_retriever_actor(
    index_dir: str | os.PathLike,
    *,
    corpus_path: str | os.PathLike | None = None,
    num_cpus: float = 1,
    max_concurrency: int = 4,
    name: str | None = None,
    actor_options: dict[str, Any] | None = None,
) -> Any:
    """Start a `RetrieverActor` in the current Ray cluster and return its handle.
    `max_concurrency` > 1 lets several workers' calls overlap (searches only read).
    `actor_options`: more Ray actor options (where it runs, its restarts)."""
    import ray

    options: dict[str, Any] = {"num_cpus": num_cpus, "max_concurrency": max_concurrency}
    options |= actor_options or {}
    if name is not None:
        options["name"] = name
    return ray.remote(RetrieverActor).options(**options).remote(str(index_dir), corpus_path)


class RayRetriever:
    """`Retriever` over a `RetrieverActor` handle."""

    def __init__(self, handle: Any, timeout_s: float = 120.0):
        self.handle = handle
        self.timeout_s = timeout_s

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        import ray

        return ray.get(self.handle.search.remote(queries, k), timeout=self.timeout_s)
