"""The retriever as a Ray actor: one loaded index answering through a handle exactly as
it does in process."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from mem1_core.retrieval import Retriever, build_index, load_index

DOCS = [
    ("d0", "Gorde To", "Gorde To was a painter born in Tirvane in 1847."),
    ("d1", "Tirvane", "Tirvane is a city in Osland."),
    ("d2", "Osland", "Osland is a country whose capital is Tirvane."),
]


@pytest.mark.slow
def test_ray_actor_serves_the_index(tmp_path):
    ray = pytest.importorskip("ray")
    from mem1_core.retrieval.ray_actor import RayRetriever, start_retriever_actor

    corpus = tmp_path / "c.parquet"
    pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"]).to_parquet(corpus)
    index = build_index(corpus, "bm25", tmp_path / "idx", show_progress=False)
    queries = ["Where was Gorde To born?", "", "capital of Osland"]
    # A private local cluster, even beside a `ray start` one on this machine (a plain ray.init()
    # joins the cluster it recorded): no dashboard, no usage reporting.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        handle = start_retriever_actor(index, corpus_path=corpus)
        remote = RayRetriever(handle, timeout_s=60)
        assert isinstance(remote, Retriever)
        assert remote.search(queries, 2) == load_index(index).search(queries, 2)
        assert ray.get(handle.info.remote(), timeout=60) == {"kind": "bm25", "documents": 3}
    finally:
        ray.shutdown()
