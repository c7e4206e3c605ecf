"""`mem1 index`, `mem1 search`, `mem1 serve-retriever`, `mem1 search-standin`: build an index,
query it (JSON Lines out), serve it over HTTP in the Search-R1 schema, or behind a local
stand-in of a Serper-style web search API."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mem1_core.cli.commands.data import add_config_args

# Option flags -> option names of each index kind; a flag left unset keeps the default,
# and a flag of the other kind is refused by the options' own validation.
_NONE_WORDS = ("none", "off", "")
_BM25_FLAGS = ("stemmer", "stopwords", "title_repeat", "method", "k1", "b")
_DENSE_FLAGS = (
    "model",
    "query_prefix",
    "passage_prefix",
    "pooling",
    "max_length",
    "batch_size",
    "index_type",
    "device",
)


def _index(args: argparse.Namespace) -> int:
    from mem1_core.retrieval import build_index, read_manifest
    from mem1_core.retrieval.index import index_size_bytes

    options: dict[str, Any] = {
        name: getattr(args, name)
        for name in (*_BM25_FLAGS, *_DENSE_FLAGS)
        if getattr(args, name) is not None
    }
    for name in ("stemmer", "stopwords"):
        if name in options and options[name].lower() in _NONE_WORDS:
            options[name] = None
    if args.kind == "dense" and "model" not in options:
        raise ValueError("a dense index needs --model (a hub name or a local model directory)")
    out = build_index(
        args.corpus, args.kind, args.out, on_problem="error" if args.strict else "drop", **options
    )
    m = read_manifest(out)
    summary = {
        "index": str(out),
        "kind": m.kind.value,
        "documents": m.documents,
        "build_seconds": m.build_seconds,
        "size_bytes": index_size_bytes(out),
        "corpus_report": m.corpus_report,
        "options": m.options,
    }
    print(json.dumps(summary))
    return 0


def _search(args: argparse.Namespace) -> int:
    from mem1_core.retrieval import HttpRetriever, load_index

    if (args.index is None) == (args.url is None):
        raise ValueError("give exactly one of --index DIR or --url URL")
    retriever = (
        load_index(args.index, args.corpus, device=args.device)
        if args.index is not None
        else HttpRetriever(args.url)
    )
    queries = args.questions or [line.rstrip("\n") for line in sys.stdin]
    for query, hits in zip(queries, retriever.search(queries, args.k), strict=True):
        print(json.dumps({"query": query, "hits": [asdict(h) for h in hits]}))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from mem1_core.retrieval import load_index, read_manifest
    from mem1_core.retrieval.server import ServerLimits, create_app, serve

    limits = ServerLimits(  # first: a bad limit fails before a large index loads
        default_topk=args.default_topk,
        max_topk=args.max_topk,
        max_queries=args.max_queries,
        max_passages=args.max_passages,
        max_body_bytes=args.max_body_bytes,
    )
    manifest = read_manifest(args.index)
    retriever = load_index(args.index, args.corpus, device=args.device)
    info = {"kind": manifest.kind.value, "documents": manifest.documents}
    serve(
        create_app(retriever, limits, info),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
    )
    return 0


def _standin(args: argparse.Namespace) -> int:
    import os
    import time

    from mem1_core.retrieval import load_index
    from mem1_core.websearch.standin import standin_server

    if (args.index is None) == (args.run is None):
        raise ValueError("give exactly one of --index DIR or --run RUN")
    key = os.environ.get(args.key_env, "").strip()
    if not key:
        raise ValueError(
            f"set {args.key_env} to the key the stand-in accepts (any string; the client reads "
            "the same variable: retrieval.web_api_key_env)"
        )
    if args.run is not None:
        from mem1_core.cli.commands.data import config_from_args
        from mem1_core.domains.registry import get_domain
        from mem1_core.runs.layout import RunPaths

        args.index = get_domain("qa").ensure_index(config_from_args(args), RunPaths(Path(args.run)))
    retriever = load_index(args.index)
    snippet = None if args.snippet_chars <= 0 else args.snippet_chars
    with standin_server(
        retriever, api_key=key, host=args.host, port=args.port, snippet_chars=snippet
    ) as standin:
        print(f"stand-in web search API at {standin.url} (index {args.index}); Ctrl-C stops it")
        print(f"  --set env.kind=websearch --set retrieval.web_endpoint={standin.url} "
              f"--set retrieval.web_api_key_env={args.key_env}", flush=True)  # fmt: skip
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    from mem1_core.retrieval.server import DEFAULT_HOST, DEFAULT_PORT, ServerLimits

    p = subparsers.add_parser("index", help="build a BM25 or dense retrieval index")
    p.add_argument("--corpus", required=True, help="corpus .parquet or Search-R1 .jsonl")
    p.add_argument("--kind", required=True, choices=["bm25", "dense"])
    p.add_argument("--out", required=True, help="index directory (replaced if it exists)")
    p.add_argument("--strict", action="store_true", help="refuse duplicate ids / empty docs")
    g = p.add_argument_group("bm25 options")
    g.add_argument("--stemmer", help="PyStemmer algorithm or 'none'")
    g.add_argument("--stopwords", help="stop-word list ('en') or 'none'")
    g.add_argument("--title-repeat", type=int, help="title weight (times prepended)")
    g.add_argument("--method", help="lucene | robertson | atire | bm25l | bm25+")
    g.add_argument("--k1", type=float)
    g.add_argument("--b", type=float)
    g = p.add_argument_group("dense options")
    g.add_argument("--model", help="Hugging Face encoder: hub name or local directory")
    g.add_argument("--query-prefix", help="default 'query: ' for e5 models, else ''")
    g.add_argument("--passage-prefix", help="default 'passage: ' for e5 models, else ''")
    g.add_argument("--pooling", choices=["mean", "cls"])
    g.add_argument("--max-length", type=int)
    g.add_argument("--batch-size", type=int)
    g.add_argument("--index-type", choices=["flat", "hnsw"])
    g.add_argument("--device", help="torch device for the encoder (cpu, cuda)")
    p.set_defaults(func=_index)

    p = subparsers.add_parser("search", help="query an index or server; JSON Lines out")
    p.add_argument("--index", help="index directory")
    p.add_argument("--url", help="retrieval server URL instead of --index")
    p.add_argument("--corpus", help="refuse the index unless built from this corpus")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--device", help="torch device for a dense encoder")
    p.add_argument("questions", nargs="*", help="queries (default: one per stdin line)")
    p.set_defaults(func=_search)

    limits = ServerLimits()
    p = subparsers.add_parser("serve-retriever", help="serve an index over HTTP (Search-R1 schema)")
    p.add_argument("--index", required=True)
    p.add_argument("--corpus", help="refuse the index unless built from this corpus")
    p.add_argument("--host", default=DEFAULT_HOST, help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--device", help="torch device for a dense encoder")
    g = p.add_argument_group("request limits (see ServerLimits)")
    g.add_argument("--default-topk", type=int, default=limits.default_topk, help="for topk 0/null")
    g.add_argument("--max-topk", type=int, default=limits.max_topk, help="larger is served at this")
    g.add_argument("--max-queries", type=int, default=limits.max_queries)
    g.add_argument("--max-passages", type=int, default=limits.max_passages, help="queries x topk")
    g.add_argument("--max-body-bytes", type=int, default=limits.max_body_bytes)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=_serve)

    p = subparsers.add_parser(
        "search-standin", help="serve an index as a local stand-in of a Serper-style search API"
    )
    p.add_argument("--index", help="index directory")
    p.add_argument("--run", help="a run directory: serve its index (built if missing)")
    p.add_argument("--host", default=DEFAULT_HOST, help="bind address (default loopback)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--key-env", default="SERPER_API_KEY", help="variable holding the key to accept")
    p.add_argument(
        "--snippet-chars", type=int, default=0, help="cut snippets to this length (0: whole)"
    )
    add_config_args(p)
    p.set_defaults(func=_standin)
