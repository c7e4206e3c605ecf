"""The build-index flow, run for real on an ephemeral Prefect (the smoke world): it builds
once, then reuses the index while the corpus fingerprint is unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mem1_core.config import load_config
from mem1_core.retrieval import load_index

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def test_index_options_follow_the_retrieval_config():
    from mem1_core.retrieval.run_index import index_options

    assert index_options(load_config("smoke")) == {}
    paper = load_config("paper")
    assert index_options(paper) == {"model": paper.retrieval.encoder}


def test_tasks_build_then_reuse(tmp_path):
    from flows.index import build_or_reuse, corpus_path

    cfg = load_config("smoke")
    corpus = corpus_path.fn(cfg, tmp_path)
    first = build_or_reuse.fn(corpus, "bm25", tmp_path / "indexes", {})
    again = build_or_reuse.fn(corpus, "bm25", tmp_path / "indexes", {})
    assert not first["cached"] and again["cached"] and again["index"] == first["index"]
    with pytest.raises(ValueError, match="retrieval.corpus"):
        corpus_path.fn(load_config("paper"), tmp_path)


@pytest.mark.slow
def test_build_index_flow_builds_then_reuses(tmp_path):
    from flows.index import build_index_flow

    first = build_index_flow(profile="smoke", runs_root=str(tmp_path))
    assert first["kind"] == "bm25" and first["documents"] > 0 and not first["cached"]
    assert first["size_mb"] > 0 and first["build_seconds"] > 0
    again = build_index_flow(profile="smoke", runs_root=str(tmp_path))
    assert again["cached"] and again["index"] == first["index"]
    hits = load_index(first["index"]).search(["Where was anyone born?"], 1)
    assert len(hits) == 1


def test_a_prebuilt_index_is_used_as_it_is(tmp_path):
    """retrieval.index (built by `mem1 index`, e.g. on GPUs): reported, never rebuilt, its
    corpus not read; its kind must be retrieval.kind."""
    from flows.index import build_index_flow, build_or_reuse, corpus_path
    from mem1_core.domains.registry import domain_of
    from mem1_core.runs.layout import RunPaths

    smoke = load_config("smoke")
    built = build_or_reuse.fn(corpus_path.fn(smoke, tmp_path), "bm25", tmp_path / "prebuilt", {})
    overrides = ["data.source=nq", "data.nq=nq.jsonl", "data.nq_test=t.jsonl"]  # no corpus
    given = [*overrides, "retrieval.kind=bm25", f"retrieval.index={built['index']}"]
    run = tmp_path / "run"
    out = build_index_flow.fn(profile="smoke", overrides=given, out_dir=str(run))
    assert out["index"] == built["index"] and out["cached"] and not run.exists()
    prebuilt = load_config("smoke", overrides=given)
    assert domain_of(prebuilt).ensure_index(prebuilt, RunPaths(run)) == Path(out["index"])
    dense = load_config("smoke", overrides=[*given, "retrieval.kind=dense"])
    with pytest.raises(ValueError, match="is a bm25 index: set retrieval.kind=bm25"):
        domain_of(dense).ensure_index(dense, RunPaths(run))
    served = build_index_flow.fn(profile="smoke", overrides=[*overrides, "retrieval.url=http://x"])
    assert served == {"url": "http://x", "kind": "bm25"}
