"""The retrieval HTTP server, in the Search-R1 / MEM1 schema so that their retrieval
servers and ours are interchangeable.

    POST /retrieve  {"queries": [str, …], "topk": k, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score"}, …], …]}
    GET  /health    -> {"status": "ok", "kind", "documents", "limits"}

`contents` is `"Title"\\ntext`, as in Search-R1's wiki corpus. As in Search-R1, with
`return_scores` false each result is the bare document list, and a missing `topk` takes
the server's default. Departures: requests are bounded (`ServerLimits`, refused with 422
and a message), and a blank query answers `[]` instead of arbitrary documents.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from mem1_core.retrieval.base import Hit, Retriever
from mem1_core.retrieval.corpus import format_contents

DEFAULT_HOST = "127.0.0.1"  # loopback: exposing a retriever is an explicit choice
DEFAULT_PORT = 8000  # Search-R1's default, so its agent configs work unchanged


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on one request; anything beyond is refused with 422."""

    max_topk: int = 100
    """Largest `topk`."""
    max_queries: int = 256
    """Most queries in one request (the HTTP client splits larger batches)."""
    max_query_chars: int = 2048
    """Longest query, in characters."""
    default_topk: int = 3
    """`topk` when a request omits it (Search-R1's default)."""

    def __post_init__(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError("need 1 <= default_topk <= max_topk")
        if self.max_queries < 1 or self.max_query_chars < 1:
            raise ValueError("max_queries and max_query_chars must be >= 1")


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # Search-R1 clients may send more fields

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def _check(request: RetrieveRequest, limits: ServerLimits) -> int:
    """The request's topk, or an HTTP 422 naming the violated limit."""
    topk = limits.default_topk if request.topk is None else request.topk
    if not 1 <= topk <= limits.max_topk:
        raise HTTPException(422, f"topk must be between 1 and {limits.max_topk}, got {topk}")
    if len(request.queries) > limits.max_queries:
        raise HTTPException(
            422, f"at most {limits.max_queries} queries per request, got {len(request.queries)}"
        )
    for i, q in enumerate(request.queries):
        if len(q) > limits.max_query_chars:
            raise HTTPException(
                422, f"query {i} has {len(q)} characters; the limit is {limits.max_query_chars}"
            )
    return topk


def _document(hit: Hit) -> dict[str, str]:
    return {"id": hit.doc_id, "contents": format_contents(hit.title, hit.text)}


def create_app(
    retriever: Retriever, limits: ServerLimits = ServerLimits(), info: dict[str, Any] | None = None
) -> FastAPI:
    """A FastAPI app serving `retriever`; `info` is added to the /health answer."""
    app = FastAPI(title="mem1 retriever", docs_url=None, redoc_url=None)

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> JSONResponse:
        # A plain `def`: FastAPI runs it in its thread pool, so a slow search does not
        # block the event loop and concurrent requests overlap. The answer goes straight
        # to JSON: FastAPI's validation of a returned dict cost more than the search.
        topk = _check(request, limits)
        results = retriever.search(request.queries, topk)
        if request.return_scores:
            body = [
                [{"document": _document(h), "score": h.score} for h in hits] for hits in results
            ]
        else:
            body = [[_document(h) for h in hits] for hits in results]
        return JSONResponse({"result": body})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "limits": asdict(limits), **(info or {})}

    return app


def bind_socket(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """A listening-ready TCP socket; port 0 picks a free ephemeral port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve(
    app: FastAPI,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    log_level: str = "info",
    access_log: bool = False,
) -> None:
    """Run `app` in the foreground until interrupted. Access logging is off by default:
    one log line per request costs more than a BM25 search."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)


@contextmanager
def background_server(
    app: FastAPI, host: str = DEFAULT_HOST, port: int = 0, startup_timeout_s: float = 15.0
) -> Iterator[str]:
    """Serve `app` from a thread; yields its base URL (tests, benchmarks)."""
    import uvicorn

    sock = bind_socket(host, port)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError("retrieval server failed to start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{bound_port}" if ":" not in host else f"http://[{host}]:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
