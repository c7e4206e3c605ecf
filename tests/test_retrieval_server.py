"""The HTTP server in the Search-R1 schema, and the HTTP client's failure modes. Servers
run in a thread on 127.0.0.1 with an ephemeral port; every loop is bounded."""

from __future__ import annotations

import socket
import time
from dataclasses import asdict

import httpx
import pandas as pd
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mem1_core.retrieval import HttpRetriever, RetrieverUnavailable, build_index, load_index
from mem1_core.retrieval.corpus import parse_contents
from mem1_core.retrieval.server import ServerLimits, background_server, create_app

DOCS = [
    ("d0", "Gorde To", "Gorde To was a painter born in Tirvane in 1847."),
    ("d1", "Tirvane", "Tirvane is a city in Osland.\nIt was founded in 1602."),
    ("d2", "Osland", "Osland is a country whose capital is Tirvane."),
    ("d3", "Kesmar", "Kesmar is a city in Osland."),
]
LIMITS = ServerLimits(max_topk=5, max_queries=4, max_passages=12, max_body_bytes=4000)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    root = tmp_path_factory.mktemp("srv")
    pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"]).to_parquet(root / "c.parquet")
    return load_index(build_index(root / "c.parquet", "bm25", root / "idx", show_progress=False))


@pytest.fixture(scope="module")
def url(retriever):
    with background_server(create_app(retriever, LIMITS, {"kind": "bm25"})) as base:
        yield base


def test_retrieve_answers_the_search_r1_schema(url, retriever):
    body = {"queries": ["Where was Gorde To born?", "Tirvane"], "topk": 2, "return_scores": True}
    r = httpx.post(f"{url}/retrieve", json=body, timeout=10)
    assert r.status_code == 200
    result = r.json()["result"]
    want = retriever.search(body["queries"], 2)
    assert len(result) == 2
    for got, hits in zip(result, want, strict=True):
        assert [set(item) for item in got] == [{"document", "score"}] * len(hits)
        assert [item["document"]["id"] for item in got] == [h.doc_id for h in hits]
        assert [item["score"] for item in got] == pytest.approx([h.score for h in hits])
        for item, h in zip(got, hits, strict=True):
            assert set(item["document"]) == {"id", "contents"}
            assert parse_contents(item["document"]["contents"]) == (h.title, h.text)
    # Search-R1 without scores: bare documents; a missing topk takes the server default.
    r = httpx.post(f"{url}/retrieve", json={"queries": ["Osland capital"]}, timeout=10)
    docs = r.json()["result"][0]
    assert len(docs) == 3 and set(docs[0]) == {"id", "contents"}


def test_blank_query_gets_an_empty_list(url):
    r = httpx.post(f"{url}/retrieve", json={"queries": ["", "Kesmar", " "], "topk": 2}, timeout=10)
    assert r.status_code == 200
    result = r.json()["result"]
    assert result[0] == [] and result[2] == [] and result[1][0]["id"] == "d3"
    assert httpx.post(f"{url}/retrieve", json={"queries": []}, timeout=10).json() == {"result": []}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"topk": 2}, "queries"),  # missing field
        ({"queries": "Kesmar"}, "queries"),  # not a list
        ({"queries": [1, 2]}, "queries"),  # not strings
        ({"queries": ["a"], "topk": "many"}, "topk"),
        ({"queries": ["a"], "topk": 2.5}, "topk"),
        ({"queries": ["a"], "return_scores": "sometimes"}, "return_scores"),
        ({"queries": ["a"], "topk": -1}, "topk must be >= 0"),
        ({"queries": ["a"] * 5}, "at most 4 queries"),
        ({"queries": ["a"] * 3, "topk": 5}, "3 queries x topk 5 is more than 12 passages"),
        ({"queries": ["a"] * 3, "topk": 50}, "3 queries x topk 5 is more than 12 passages"),
    ],
)
def test_bad_bodies_and_limits_get_422_with_a_message(url, body, message):
    r = httpx.post(f"{url}/retrieve", json=body, timeout=10)
    assert r.status_code == 422
    assert message in r.text


def test_topk_zero_null_or_missing_takes_the_default_and_a_large_one_is_capped(url):
    def served(**topk):
        body = {"queries": ["Osland Tirvane city"], **topk}
        r = httpx.post(f"{url}/retrieve", json=body, timeout=10)
        assert r.status_code == 200, r.text
        return [d["id"] for d in r.json()["result"][0]]

    default = served(topk=3)
    assert len(default) == 3
    assert served() == served(topk=None) == served(topk=0) == default
    assert len(served(topk=50)) == 4  # capped at max_topk 5; only 4 documents match


def test_body_over_the_byte_limit_gets_413(url):
    big = {"queries": ["x" * 4000]}
    r = httpx.post(f"{url}/retrieve", json=big, timeout=10)  # declared by Content-Length
    assert r.status_code == 413 and "over 4000 bytes" in r.text
    payload = httpx.Request("POST", "/", json=big).content

    def chunks():  # no Content-Length: refused while it streams in
        yield from (payload[i : i + 1000] for i in range(0, len(payload), 1000))

    r = httpx.post(f"{url}/retrieve", content=chunks(), timeout=10)
    assert r.status_code == 413 and "over 4000 bytes" in r.text
    # A long query within the byte limit is served (no per-query length limit).
    r = httpx.post(f"{url}/retrieve", json={"queries": ["Kesmar " * 500]}, timeout=10)
    assert r.status_code == 200 and r.json()["result"][0][0]["id"] == "d3"


def test_malformed_json_gets_422(url):
    r = httpx.post(
        f"{url}/retrieve", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422


def test_health(url):
    h = httpx.get(f"{url}/health", timeout=10).json()
    assert h["status"] == "ok" and h["kind"] == "bm25" and h["limits"]["max_topk"] == 5
    assert h["limits"]["max_body_bytes"] == 4000


def test_server_binds_loopback_by_default(retriever):
    from mem1_core.cli.main import build_parser

    args = build_parser().parse_args(["serve-retriever", "--index", "x"])
    assert args.host == "127.0.0.1"
    limits = ServerLimits()  # every limit has its flag, defaulting to the dataclass
    assert {f: getattr(args, f) for f in asdict(limits)} == asdict(limits)
    with background_server(create_app(retriever)) as base:
        assert base.startswith("http://127.0.0.1:")


def test_http_client_equals_in_process(url, retriever):
    queries = ["Gorde To", "", "city in Osland", "Tirvane founded", "Kesmar", "capital"]
    with HttpRetriever(url, max_batch=4) as client:  # 6 queries: two requests
        assert client.search(queries, 3) == retriever.search(queries, 3)
        assert client.health()["status"] == "ok"
        assert client.search(["Osland"], 50) == retriever.search(["Osland"], 5)  # capped
        with pytest.raises(ValueError, match="split the request"):
            client.search(["a"] * 4, 5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_reports_a_server_that_is_down():
    client = HttpRetriever(
        f"http://127.0.0.1:{_closed_port()}/retrieve", retries=2, backoff_s=0.01, timeout_s=2
    )
    start = time.monotonic()
    with pytest.raises(RetrieverUnavailable, match=r"failed after 3 attempts: cannot connect"):
        client.search(["x"], 1)
    assert time.monotonic() - start < 5
    with pytest.raises(RetrieverUnavailable):
        client.health()


def _flaky_app(calls: list[str], fail_first: int, delay_s: float = 0.0) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: Request):
        calls.append("x")
        if len(calls) <= fail_first:
            return JSONResponse({"detail": "boom"}, status_code=503)
        if delay_s:
            import asyncio

            await asyncio.sleep(delay_s)
        body = await request.json()
        doc = {"document": {"id": "7", "contents": '"T"\nbody'}, "score": 1.5}
        return {"result": [[doc] for _ in body["queries"]]}

    return app


def test_client_times_out_with_bounded_retries():
    calls: list[str] = []
    with background_server(_flaky_app(calls, fail_first=0, delay_s=1.0)) as base:
        client = HttpRetriever(base, timeout_s=0.2, retries=1, backoff_s=0.01)
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match=r"2 attempts: no answer within 0.2 s"):
            client.search(["x"], 1)
        assert time.monotonic() - start < 1.0 and len(calls) == 2


def test_client_retries_server_errors_then_succeeds():
    calls: list[str] = []
    with background_server(_flaky_app(calls, fail_first=2)) as base:
        hits = HttpRetriever(base, retries=2, backoff_s=0.01).search(["q"], 1)
        assert len(calls) == 3
        assert [(h.doc_id, h.title, h.text, h.score) for h in hits[0]] == [("7", "T", "body", 1.5)]
    calls.clear()
    with background_server(_flaky_app(calls, fail_first=10)) as base:
        with pytest.raises(RetrieverUnavailable, match="server error 503"):
            HttpRetriever(base, retries=1, backoff_s=0.01).search(["q"], 1)
        assert len(calls) == 2
