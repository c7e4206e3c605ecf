"""Retrieval benchmark on the task world: BM25 speed against rank-bm25, recall@k of the
supporting documents per hop count, and server throughput with concurrent clients.

    .venv/bin/python benchmarks/bench_retrieval.py --world DIR [--dense-model PATH]

Without --world the seed-0 world is generated into a temporary directory. Every figure
comes from this one run; ratios compare measurements taken seconds apart on the same
machine, corpus and queries. Prints a human-readable report and, last, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout

from benchmarks.common import free_port, retriever_command, wait_for_retriever  # noqa: E402
from mem1_core.retrieval import Retriever, build_index, load_index, read_manifest
from mem1_core.retrieval import bm25 as bm25_module
from mem1_core.retrieval.bm25 import BM25Retriever, document_texts, tokenize, top_k
from mem1_core.retrieval.index import index_size_bytes

RECALL_KS = (1, 3, 5, 10)


def world_dir(path: str | None, tmp: Path) -> Path:
    if path is not None:
        return Path(path)
    from mem1_core.config import WorldConfig
    from mem1_core.data.world import generate_world, write_world

    write_world(generate_world(WorldConfig(seed=0)), tmp / "world")
    return tmp / "world"


def best_time(fn: Callable[[], Any], min_seconds: float) -> float:
    """Seconds per call of `fn`: calls repeat until `min_seconds` have passed, and the
    fastest call counts (the least disturbed by other load on a shared machine)."""
    best, start = float("inf"), time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start >= min_seconds:
            return best


def bench_speed(
    bm25: BM25Retriever, corpus: pd.DataFrame, queries: list[str], k: int, args
) -> dict[str, Any]:
    """Queries per second of ours and rank-bm25 over the same tokens and queries."""
    from rank_bm25 import BM25Okapi

    opts = bm25.options
    doc_tokens = tokenize(document_texts(corpus, opts), opts)
    reference = BM25Okapi(doc_tokens)  # same tokens as ours; Okapi idf with its floor
    query_tokens = tokenize(queries, opts)
    ids = bm25.token_ids(queries)
    n_ref = min(len(queries), args.reference_queries)

    def ours_core() -> None:  # pre-tokenized queries -> top-k rows and scores
        chunk = max(1, bm25_module._SCORE_CELLS // len(corpus))  # as search() batches
        for s in range(0, len(ids), chunk):
            top_k(bm25.scorer.scores(ids[s : s + chunk]), k)

    def ref_core() -> None:
        for toks in query_tokens[:n_ref]:
            scores = reference.get_scores(toks)
            best = np.argpartition(scores, len(scores) - k)[-k:]
            best[np.argsort(-scores[best])]

    texts = corpus["contents"].tolist()

    def ref_end_to_end() -> None:  # tokenize, score, rank, fetch the passages
        for toks in tokenize(queries[:n_ref], opts):
            scores = reference.get_scores(toks)
            best = np.argpartition(scores, len(scores) - k)[-k:]
            [texts[i] for i in best[np.argsort(-scores[best])]]

    singles = queries[: args.single_queries]
    cases = {
        "core_ours": (ours_core, len(queries)),
        "core_ref": (ref_core, n_ref),
        "e2e_ours": (lambda: bm25.search(queries, k), len(queries)),
        "e2e_ref": (ref_end_to_end, n_ref),
        "single_ours": (lambda: [bm25.search([q], k) for q in singles], len(singles)),
    }
    # Rounds alternate between the cases so that a burst of load hits all of them alike.
    per_query = {name: float("inf") for name in cases}
    for _ in range(args.rounds):
        for name, (fn, n) in cases.items():
            per_query[name] = min(per_query[name], best_time(fn, args.min_seconds) / n)
    t_ours, t_ref = per_query["core_ours"], per_query["core_ref"]
    t_ours_e2e, t_ref_e2e = per_query["e2e_ours"], per_query["e2e_ref"]
    t_single = per_query["single_ours"]
    return {
        "k": k,
        "queries": len(queries),
        "reference_queries": n_ref,
        "core_qps_ours": 1 / t_ours,
        "core_qps_rank_bm25": 1 / t_ref,
        "core_ratio": t_ref / t_ours,
        "end_to_end_qps_ours": 1 / t_ours_e2e,
        "end_to_end_qps_rank_bm25": 1 / t_ref_e2e,
        "end_to_end_ratio": t_ref_e2e / t_ours_e2e,
        "one_query_per_call_qps_ours": 1 / t_single,
        "one_query_per_call_ratio": t_ref_e2e / t_single,
    }


def bench_recall(retriever: Retriever, questions: pd.DataFrame, title_to_id: dict[str, str]):
    """Recall@k of the supporting documents per hop count: the mean over questions of the
    fraction of their supporting documents in the top k; plus the fraction of questions
    with all of them in the top k, and the recall of the agent's single-entity lookups
    (each plan step's query, whose target is that step's document)."""
    kmax = max(RECALL_KS)
    hits = retriever.search(questions["question"].tolist(), kmax)
    support = [{title_to_id[t] for t in ts} for ts in questions["supporting_titles"]]
    ranked = [[h.doc_id for h in hs] for hs in hits]
    out: dict[str, Any] = {}
    for hops in sorted(questions["hops"].unique()):
        sel = np.flatnonzero(questions["hops"].to_numpy() == hops)
        row: dict[str, Any] = {"questions": len(sel)}
        for k in RECALL_KS:
            frac = [len(support[i] & set(ranked[i][:k])) / len(support[i]) for i in sel]
            row[f"recall@{k}"] = float(np.mean(frac))
            row[f"all@{k}"] = float(np.mean([support[i] <= set(ranked[i][:k]) for i in sel]))
        out[f"hops={hops}"] = row
    steps = {}
    for plan in questions["plan"]:
        for step in json.loads(plan):
            steps[step["query"]] = title_to_id[step["title"]]
    step_hits = retriever.search(list(steps), kmax)
    step_ranked = [{h.doc_id for h in hs[:k]} for k in RECALL_KS for hs in step_hits]
    out["plan_steps"] = {"questions": len(steps)}
    for j, k in enumerate(RECALL_KS):
        found = step_ranked[j * len(steps) : (j + 1) * len(steps)]
        out["plan_steps"][f"recall@{k}"] = float(
            np.mean([t in f for t, f in zip(steps.values(), found, strict=True)])
        )
    return out


def load_run(
    url: str, queries: list[str], per_request: int, clients: int, seconds: float, requests: int
) -> dict[str, Any]:
    """`clients` threads post to /retrieve until `requests` have been sent in total or
    `seconds` have passed, whichever comes first."""
    import httpx

    lock = threading.Lock()
    latencies: list[float] = []
    sent = [0]
    deadline = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < deadline:
                with lock:
                    if sent[0] >= requests:
                        return
                    n = sent[0]
                    sent[0] += 1
                start = (n * per_request) % len(queries)
                body = {"queries": queries[start : start + per_request], "topk": 3}
                t0 = time.perf_counter()
                http.post(f"{url}/retrieve", json=body).raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": len(latencies),
        "qps": len(latencies) * per_request / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * float(np.percentile(latencies, 95)),
    }


def bench_server(index_dir: Path, queries: list[str], args) -> dict[str, Any]:
    """Queries per second through POST /retrieve of `mem1 serve-retriever` (its own
    process, as deployed) with concurrent clients on loopback: one query per request (an
    agent turn) and batched requests (a rollout worker)."""
    import subprocess

    port = free_port()
    server = subprocess.Popen(retriever_command(index_dir, port, "--log-level", "warning"))
    try:
        url = wait_for_retriever(port, server, timeout=60)
        return {
            f"{n}_per_request": load_run(
                url, queries, n, args.server_clients, args.server_seconds, args.server_requests
            )
            for n in (1, args.server_batch)
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


def print_report(report: dict[str, Any]) -> None:
    s = report["speed"]
    print(f"world: {report['documents']} documents, {report['questions']} questions")
    print(f"BM25 index: built in {report['bm25_build_seconds']:.2f} s, {report['bm25_mb']:.2f} MB")
    print(f"\nBM25 speed, k={s['k']} (queries/s)        ours   rank-bm25   ratio")
    for name, key in [
        ("scoring + top-k (pre-tokenized)", "core"),
        ("end to end (tokenize..passages)", "end_to_end"),
    ]:
        print(
            f"  {name:34s}{s[key + '_qps_ours']:8.0f}{s[key + '_qps_rank_bm25']:10.0f}"
            f"{s[key + '_ratio']:9.1f}x"
        )
    print(
        f"  {'one query per search() call':34s}{s['one_query_per_call_qps_ours']:8.0f}"
        f"{s['end_to_end_qps_rank_bm25']:10.0f}{s['one_query_per_call_ratio']:9.1f}x"
    )
    for name, recall in report["recall"].items():
        print(f"\nrecall of supporting documents, {name}")
        for group, row in recall.items():
            cells = "  ".join(f"@{k} {row[f'recall@{k}']:.4f}" for k in RECALL_KS)
            print(f"  {group:11s} n={row['questions']:5d}  {cells}")
    print("\nserver /retrieve on loopback, topk=3")
    for name, row in report["server"].items():
        print(
            f"  {name:16s} {row['clients']} clients: {row['qps']:7.0f} queries/s "
            f"({row['requests']} requests, p50 {row['p50_ms']:.1f} ms, p95 {row['p95_ms']:.1f} ms)"
        )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", help="world directory (default: generate seed 0 into a temp dir)")
    p.add_argument("--k", type=int, default=10, help="k for the speed comparison")
    p.add_argument("--min-seconds", type=float, default=1.0, help="time per speed measurement")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per measurement")
    p.add_argument("--reference-queries", type=int, default=400, help="rank-bm25 queries timed")
    p.add_argument("--single-queries", type=int, default=1000, help="one-query calls timed")
    p.add_argument("--dense-model", help="also measure a dense index with this encoder")
    p.add_argument("--server-clients", type=int, default=8)
    p.add_argument("--server-seconds", type=float, default=8.0, help="bound per server run")
    p.add_argument("--server-requests", type=int, default=20000, help="bound per server run")
    p.add_argument("--server-batch", type=int, default=32, help="queries per batched request")
    p.add_argument("--out", help="also write the JSON report here")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        world = world_dir(args.world, tmp)
        corpus_path = world / "corpus.parquet"
        corpus = pd.read_parquet(corpus_path)
        questions = pd.read_parquet(world / "questions.parquet")
        title_to_id = dict(zip(corpus["title"], corpus["doc_id"], strict=True))
        bm25_dir = build_index(corpus_path, "bm25", tmp / "bm25", show_progress=False)
        bm25 = load_index(bm25_dir)
        assert isinstance(bm25, BM25Retriever)
        queries = questions["question"].tolist()
        report: dict[str, Any] = {
            "documents": len(corpus),
            "questions": len(questions),
            "bm25_build_seconds": read_manifest(bm25_dir).build_seconds,
            "bm25_mb": index_size_bytes(bm25_dir) / 2**20,
            "bm25_options": read_manifest(bm25_dir).options,
            "speed": bench_speed(bm25, corpus, queries, args.k, args),
            "recall": {"bm25": bench_recall(bm25, questions, title_to_id)},
        }
        if args.dense_model:
            dense_dir = build_index(
                corpus_path, "dense", tmp / "dense", model=args.dense_model, show_progress=False
            )
            report["dense_build_seconds"] = read_manifest(dense_dir).build_seconds
            dense = load_index(dense_dir)
            name = "/".join(Path(args.dense_model).parts[-2:])
            report["recall"][f"dense ({name})"] = bench_recall(dense, questions, title_to_id)
        report["server"] = bench_server(bm25_dir, queries, args)
    print_report(report)
    print(json.dumps(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
