"""The retrieval HTTP server, in the Search-R1 / MEM1 schema so that their retrieval
servers and ours are interchangeable.

    POST /retrieve  {"queries": [str, …], "topk": k, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score"}, …], …]}
    GET  /health    -> {"status": "ok", "kind", "documents", "limits"}

As in Search-R1's `retrieval_server.py`: `contents` is the document's string as the corpus
gave it (`"Title"\\ntext` for Search-R1's wiki corpus; any other form passes through
unchanged); a missing, null or zero `topk` takes the server's default; with
`return_scores` false each result is the bare document list (what the original means to
send, though it cannot: it unpacks its retriever's answer as a (results, scores) pair).
The request model is the original's, so the bodies it refuses (missing `queries`, wrong
types, bad JSON) get 422 here too.

Departures: what the original accepts is bounded by memory here rather than left
unbounded (`ServerLimits`: the body's bytes, the number of queries, the passages in one
answer; a `topk` above `max_topk` is served at `max_topk`, not refused); a negative
`topk`, which the original passes on to the index and fails on with 500, is a 422; a
blank query answers `[]` instead of arbitrary documents.
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
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mem1_core.retrieval.base import Hit, Retriever
from mem1_core.retrieval.corpus import format_contents

DEFAULT_HOST = "127.0.0.1"  # loopback: exposing a retriever is an explicit choice
DEFAULT_PORT = 8000  # Search-R1's default, so its agent configs work unchanged


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on one request, sized so that Search-R1's training (a batch of 512
    rollouts posting every search of a turn at once) and its evaluation fit, while one
    request cannot exhaust the server's memory."""

    default_topk: int = 3
    """`topk` when a request omits it or sends 0 or null (Search-R1's `--topk` default)."""
    max_topk: int = 1000
    """Largest `topk` served; a larger one is served at this size (Search-R1 serves any
    size, and its BM25 server too answers fewer passages than asked when it finds fewer)."""
    max_queries: int = 8192
    """Most queries in one request; more is a 422 (the HTTP client splits larger batches)."""
    max_passages: int = 262_144
    """Most passages in one answer (queries x served topk, e.g. 8192 x 32 or 512 x 512);
    more is a 422 that asks to split the request. Bounds the answer's memory."""
    max_body_bytes: int = 32 * 2**20
    """Largest request body, in bytes; larger is a 413, refused before it is read whole.
    Bounds the request's memory (Search-R1 has no limit on a query's length either)."""

    def __post_init__(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(
                f"need 1 <= default_topk <= max_topk, got {self.default_topk} and "
                f"{self.max_topk}; raise --max-topk or lower --default-topk"
            )
        for name in ("max_queries", "max_passages", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RetrieveRequest(BaseModel):
    """Search-R1's `QueryRequest`, field for field (unknown fields are ignored, as there)."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def served_topk(request: RetrieveRequest, limits: ServerLimits) -> int:
    """The number of passages to answer per query, or an HTTP 422 naming the limit."""
    if request.topk is not None and request.topk < 0:
        raise HTTPException(422, f"topk must be >= 0 (0 means the default), got {request.topk}")
    # Search-R1 tests `if not request.topk`: 0 and null both take the default.
    topk = min(request.topk or limits.default_topk, limits.max_topk)
    if len(request.queries) > limits.max_queries:
        raise HTTPException(
            422, f"at most {limits.max_queries} queries per request, got {len(request.queries)}"
        )
    if len(request.queries) * topk > limits.max_passages:
        raise HTTPException(
            422,
            f"{len(request.queries)} queries x topk {topk} is more than {limits.max_passages} "
            "passages in one answer; split the request",
        )
    return topk


class _BodyLimit:
    """ASGI middleware refusing a request body over `max_bytes` with 413: at once when its
    Content-Length says so, else as soon as the streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"request body over {self.max_bytes} bytes; split the request"
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await JSONResponse({"detail": message}, 413)(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.max_bytes:
                # Raised inside FastAPI's body read, which re-raises HTTPExceptions, so
                # the app's own exception handler answers it.
                raise HTTPException(413, message)
            return msg

        await self.app(scope, counting_receive, send)


def _document(hit: Hit) -> dict[str, str]:
    contents = hit.passage if hit.passage is not None else format_contents(hit.title, hit.text)
    return {"id": hit.doc_id, "contents": contents}


def create_app(
    retriever: Retriever, limits: ServerLimits = ServerLimits(), info: dict[str, Any] | None = None
) -> FastAPI:
    """A FastAPI app serving `retriever`; `info` is added to the /health answer."""
    app = FastAPI(title="mem1 retriever", docs_url=None, redoc_url=None)
    app.add_middleware(_BodyLimit, max_bytes=limits.max_body_bytes)

    @app.post("/retrieve")
    def retrieve(request: RetrieveRequest) -> JSONResponse:
        # A plain `def`: FastAPI runs it in its thread pool, so a slow search does not
        # block the event loop and concurrent requests overlap. The answer goes straight
        # to JSON: FastAPI's validation of a returned dict cost more than the search.
        topk = served_topk(request, limits)
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
