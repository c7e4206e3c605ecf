"""A local stand-in for a Serper-style web search API, answering from a local retriever (the
world's BM25 index), so that the web-search backend is tested and evaluated offline.

    POST /search   headers {"X-API-KEY": key}   body {"q": query, "num": k}
      -> {"searchParameters": {"q", "num", "type"}, "organic": [{"title", "link", "snippet",
          "position"}, ...], "credits": 1}

A wrong or missing key is a 403 `{"message": "Unauthorized.", "statusCode": 403}`, as the
real service answers. `Faults` switches what a real service does on a bad day: a 500, a slow
answer (past the client's timeout), 429s before a success, an empty result, malformed JSON.
Each snippet is the document's body cut to `snippet_chars` (a search engine's snippet is a
couple of sentences; None keeps the whole body, so the web path shows exactly what the
index path shows).

It is the standard library's threading HTTP server in a daemon thread (`standin_server`),
or in the foreground (`mem1 search-standin`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from mem1_core.retrieval.base import Retriever

SEARCH_PATH = "/search"
LINK_BASE = "https://world.invalid/wiki/"
"""Links of the stand-in's results (the `.invalid` domain never resolves)."""


@dataclass
class Faults:
    """What the stand-in does instead of answering well; switched between requests."""

    status: int | None = None
    """Answer every request with this HTTP status (500: the service is down)."""
    delay_s: float = 0.0
    """Sleep this long before answering (past the client's timeout: a hung service)."""
    rate_limited: int = 0
    """Answer the next this-many requests with 429 (and `Retry-After: 0`), then normally."""
    empty: bool = False
    """Answer with no organic results."""
    malformed: bool = False
    """Answer 200 with a body that is not JSON."""


@dataclass
class StandIn:
    """A running stand-in: its URL, its switches and what it has seen."""

    url: str
    """The search endpoint (`http://host:port/search`)."""
    api_key: str
    faults: Faults = field(default_factory=Faults)
    requests: int = 0
    """Requests received (any path, any answer)."""
    queries: list[str] = field(default_factory=list)
    """The `q` of every well-formed, authorised request, in order of arrival."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def snippet(text: str, chars: int | None) -> str:
    """`text` cut at a word boundary to at most `chars` characters, with ` ...` when cut."""
    if chars is None or len(text) <= chars:
        return text
    cut = text[:chars].rsplit(" ", 1)[0] or text[:chars]
    return cut + " ..."


def organic(retriever: Retriever, query: str, k: int, snippet_chars: int | None) -> list[dict]:
    """The stand-in's organic results for one query: the retriever's top `k`, as Serper's."""
    hits = retriever.search([query], k)[0]
    return [
        {
            "title": h.title,
            "link": LINK_BASE + quote(h.title.replace(" ", "_") or h.doc_id),
            "snippet": snippet(h.text, snippet_chars),
            "position": i,
        }
        for i, h in enumerate(hits, 1)
    ]


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a hung (delayed) answer never blocks shutdown

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client gave up first (its timeout): expected under `delay_s`
        super().handle_error(request, client_address)


def _handler(
    state: StandIn, retriever: Retriever, snippet_chars: int | None, max_num: int
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
            pass  # quiet: one line per request would drown a test's output

        def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
            self._send(code, json.dumps(obj).encode("utf-8"), headers)

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            with state.lock:
                state.requests += 1
                faults = Faults(**vars(state.faults))
                if state.faults.rate_limited > 0:
                    state.faults.rate_limited -= 1
            if faults.delay_s:
                time.sleep(faults.delay_s)
            if self.path.split("?")[0] != SEARCH_PATH:
                return self._json(404, {"message": "Not found.", "statusCode": 404})
            if self.headers.get("X-API-KEY") != state.api_key:
                return self._json(403, {"message": "Unauthorized.", "statusCode": 403})
            if faults.status is not None:
                return self._json(faults.status, {"message": "Injected failure."})
            if faults.rate_limited > 0:
                return self._json(429, {"message": "Too many requests."}, {"Retry-After": "0"})
            try:
                request = json.loads(raw)
                query, num = str(request["q"]), int(request.get("num", 10))
            except (ValueError, KeyError, TypeError):
                return self._json(
                    400, {"message": "Expected a JSON body with 'q'.", "statusCode": 400}
                )
            with state.lock:
                state.queries.append(query)
            if faults.malformed:
                return self._send(200, b'{"organic": [{"title": "truncated')
            num = max(1, min(num, max_num))
            results = [] if faults.empty else organic(retriever, query, num, snippet_chars)
            self._json(
                200,
                {
                    "searchParameters": {"q": query, "num": num, "type": "search"},
                    "organic": results,
                    "credits": 1,
                },
            )

    return Handler


def make_server(
    retriever: Retriever,
    *,
    api_key: str,
    host: str = "127.0.0.1",
    port: int = 0,
    snippet_chars: int | None = None,
    max_num: int = 100,
) -> tuple[ThreadingHTTPServer, StandIn]:
    """A bound (not yet serving) stand-in server and its state; port 0 picks a free port."""
    state = StandIn(url="", api_key=api_key)
    server = _Server((host, port), _handler(state, retriever, snippet_chars, max_num))
    state.url = f"http://{host}:{server.server_address[1]}{SEARCH_PATH}"
    return server, state


@contextmanager
def standin_server(
    retriever: Retriever,
    *,
    api_key: str = "standin-key",
    snippet_chars: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> Iterator[StandIn]:
    """Serve a stand-in from a daemon thread for the duration of the block."""
    server, state = make_server(
        retriever, api_key=api_key, host=host, port=port, snippet_chars=snippet_chars
    )
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
