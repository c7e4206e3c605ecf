"""`mem1 serve-retriever` as a drop-in for Search-R1's / MEM1's retrieval server, and our
HTTP client against the other servers of that schema.

The independent definition is the original agents' client: Search-R1's
`search_r1/llm_agent/generation.py` (`_batch_search`, `_passages2string`), which MEM1's
`Mem1/train/rollout/llm_agent/generation_think.py` and `Mem1/inference/data_pipelines.py`
repeat unchanged. It is re-implemented here from its behaviour, and run against our real
server (uvicorn on loopback). What it should read is computed from the raw JSON Lines of the
corpus and the in-process ranking, without our corpus code.
"""

from __future__ import annotations

import json

import httpx
import pyarrow as pa
import pyarrow.ipc
import pytest
from fastapi import FastAPI, Request

from mem1_core.retrieval import HttpRetriever, build_index, load_index
from mem1_core.retrieval.client import passage_id
from mem1_core.retrieval.corpus import format_contents
from mem1_core.retrieval.server import ServerLimits, background_server, create_app

# Search-R1 `contents` in forms other than `"Title"\ntext`, each with the query that finds it.
ODD = {
    "Kalomir Vesh\nKalomir Vesh was a painter.": "Kalomir Vesh painter",  # unquoted title
    "A one-line passage with no title line about Zembla.": "Zembla",  # no newline
    '  "Tirvane"  \nTirvane is a city. ': "Tirvane city",  # surrounding spaces
    '"Quorn"\r\nQuorn is a country.\r\nIts capital is Tirvane.': "Quorn country",  # CRLF
    '"The "Quiet" Harbor"\n\nA novel.\n': "Quiet Harbor novel",  # inner quotes, blank lines
    "\nA passage whose title line is empty, about Vaskor.": "Vaskor",  # leading newline
    '"Ærø"\nÆrø is an island — 30 km² — in the Baltic.': "Ærø island",  # non-ASCII
}
# Enough ordinary documents that all match one query, for topk 150.
FILLER = [format_contents(f"Place {i}", f"Place {i} is a town in Osland.") for i in range(200)]
TOWN_QUERY = "town in Osland"


def passages2string(result: list[dict]) -> str:
    """What Search-R1's agent reads from one query's result: the first line of `contents`
    as the title (quotes and all), the rest as the text."""
    out = ""
    for idx, item in enumerate(result, 1):
        title, _, text = item["document"]["contents"].partition("\n")
        out += f"Doc {idx}(Title: {title}) {text}\n"
    return out


def search_r1_batch_search(url: str, queries: list[str], topk: int | None) -> list[str]:
    """Search-R1's `batch_search`: one POST for all queries, scores asked for, the answer's
    `result` read without looking at the status (a 422 body has no `result`)."""
    payload = {"queries": queries, "topk": topk, "return_scores": True}
    body = httpx.post(f"{url}/retrieve", json=payload, timeout=120).json()
    return [passages2string(result) for result in body["result"]]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(path, {id: contents as written}) of a Search-R1 JSON Lines corpus."""
    path = tmp_path_factory.mktemp("dropin") / "wiki.jsonl"
    raw = {f"odd{i}": c for i, c in enumerate(ODD)} | {f"f{i}": c for i, c in enumerate(FILLER)}
    path.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in raw.items()))
    return path, raw


@pytest.fixture(scope="module")
def retriever(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("dropin-idx") / "idx"
    return load_index(build_index(corpus[0], "bm25", out, show_progress=False))


@pytest.fixture(scope="module")
def url(retriever):
    with background_server(create_app(retriever, ServerLimits())) as base:
        yield base


def expected(raw: dict[str, str], retriever, queries: list[str], k: int) -> list[str]:
    """What the agent should read: the corpus's own strings, in our ranking."""
    ranked = retriever.search(queries, k)
    return [
        passages2string([{"document": {"contents": raw[h.doc_id]}} for h in hits])
        for hits in ranked
    ]


def test_odd_contents_reach_the_agent_byte_for_byte(url, corpus, retriever):
    raw = corpus[1]
    queries = list(ODD.values())
    for hits, contents in zip(retriever.search(queries, 1), ODD, strict=True):
        assert hits[0].passage == contents  # each query finds its document first
    assert search_r1_batch_search(url, queries, 3) == expected(raw, retriever, queries, 3)
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 1}, timeout=10)
    assert [docs[0]["contents"] for docs in r.json()["result"]] == list(ODD)  # bare documents
    with HttpRetriever(url) as client:  # our client keeps the passage too
        assert client.search(queries, 3) == retriever.search(queries, 3)


def test_512_queries_in_one_request(url, corpus, retriever):
    # Search-R1's training batch of 512 posts every searching rollout of a turn at once.
    queries = [[*ODD.values(), TOWN_QUERY][i % (len(ODD) + 1)] + f" {i}" for i in range(512)]
    got = search_r1_batch_search(url, queries, 3)
    assert len(got) == 512 and got == expected(corpus[1], retriever, queries, 3)


def test_a_query_of_3000_characters(url, corpus, retriever):
    query = ("Quorn country " * 300)[:3000]
    assert len(query) == 3000
    got = search_r1_batch_search(url, [query], 3)
    assert got == expected(corpus[1], retriever, [query], 3) and "Quorn" in got[0]


def test_topk_0_takes_the_default_and_150_is_served(url, corpus, retriever):
    default = search_r1_batch_search(url, [TOWN_QUERY], 3)
    assert search_r1_batch_search(url, [TOWN_QUERY], 0) == default  # Search-R1: `not topk`
    assert search_r1_batch_search(url, [TOWN_QUERY], None) == default
    got = search_r1_batch_search(url, [TOWN_QUERY], 150)
    assert got == expected(corpus[1], retriever, [TOWN_QUERY], 150)
    assert got[0].count("(Title: ") == 150


def test_default_count_cap(url):
    # 8192 queries are served; more is a 422 that the HTTP client avoids by splitting.
    queries = [f"Place {i % 200}" for i in range(8192)]
    r = httpx.post(f"{url}/retrieve", json={"queries": queries, "topk": 1}, timeout=120)
    assert r.status_code == 200 and len(r.json()["result"]) == 8192
    r = httpx.post(f"{url}/retrieve", json={"queries": [*queries, "x"]}, timeout=120)
    assert r.status_code == 422 and "at most 8192 queries" in r.text


def test_an_index_from_before_passages_serves_built_contents(corpus, tmp_path):
    # docs.arrow written before the `passage` column: loads, and serves `"Title"\ntext`.
    # Such an index also predates the manifest's file sizes (`file_bytes`).
    index = build_index(corpus[0], "bm25", tmp_path / "idx", show_progress=False)
    docs = index / "docs.arrow"
    with pa.OSFile(str(docs), "rb") as source:  # read into memory: the file is rewritten
        table = pa.ipc.open_file(source).read_all().drop_columns("passage")
    with pa.OSFile(str(docs), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    manifest = json.loads((index / "manifest.json").read_text())
    del manifest["file_bytes"]
    (index / "manifest.json").write_text(json.dumps(manifest))
    old = load_index(index)
    hits = old.search(["Quorn country"], 1)[0]
    assert hits[0].passage is None
    with background_server(create_app(old)) as base:
        r = httpx.post(f"{base}/retrieve", json={"queries": ["Quorn country"], "topk": 1})
        contents = r.json()["result"][0][0]["contents"]
    assert contents == format_contents("Quorn", "Quorn is a country.\r\nIts capital is Tirvane.")


# Our HTTP client against stand-ins answering in the shapes of the other servers.
STAND_IN_DOCS = ['"Kesmar"\nKesmar is a city in Osland.', "Osland\r\nOsland is a country."]


def _stand_in(shape: str) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(request: Request) -> dict:
        queries = (await request.json())["queries"]
        if shape == "bm25":  # Search-R1's BM25 server with stored documents: no id
            docs = [
                {
                    "document": {
                        "title": c.split("\n")[0].strip('"'),
                        "text": "\n".join(c.split("\n")[1:]),
                        "contents": c,
                    },
                    "score": 9.5 - i,
                }
                for i, c in enumerate(STAND_IN_DOCS)
            ]
        elif shape == "search_api":  # Google / SerpAPI proxies: no id, no score, no topk
            docs = [{"document": {"contents": c}} for c in STAND_IN_DOCS * 3]
        elif shape == "bare":  # return_scores false: the corpus rows themselves
            docs = [{"id": i, "contents": c, "extra": 1} for i, c in enumerate(STAND_IN_DOCS)]
        else:  # a broken server: one result short
            return {"result": [[] for _ in queries[1:]]}
        return {"result": [docs for _ in queries]}

    return app


def test_client_reads_a_search_r1_bm25_server_without_ids():
    with background_server(_stand_in("bm25")) as base:
        hits = HttpRetriever(base).search(["q1", "q2"], 2)
    assert hits[0] == hits[1]
    assert [(h.title, h.text, h.score, h.passage) for h in hits[0]] == [
        ("Kesmar", "Kesmar is a city in Osland.", 9.5, STAND_IN_DOCS[0]),
        ("Osland", "Osland is a country.", 8.5, STAND_IN_DOCS[1]),  # title line stripped
    ]
    assert [h.doc_id for h in hits[0]] == [passage_id(c) for c in STAND_IN_DOCS]
    assert len({h.doc_id for h in hits[0]}) == 2


def test_client_reads_a_search_api_server_without_scores():
    with background_server(_stand_in("search_api")) as base:
        hits = HttpRetriever(base).search(["q"], 3)[0]
    assert len(hits) == 3  # the server ignores topk; the client keeps k
    assert [h.passage for h in hits] == [*STAND_IN_DOCS, STAND_IN_DOCS[0]]
    assert [h.score for h in hits] == [0.0] * 3
    assert hits[0].doc_id == hits[2].doc_id == passage_id(STAND_IN_DOCS[0])


def test_client_reads_bare_documents_and_refuses_a_short_answer():
    with background_server(_stand_in("bare")) as base:
        hits = HttpRetriever(base).search(["q"], 5)[0]
    assert [(h.doc_id, h.passage, h.score) for h in hits] == [
        ("0", STAND_IN_DOCS[0], 0.0),
        ("1", STAND_IN_DOCS[1], 0.0),
    ]
    with background_server(_stand_in("short")) as base:
        with pytest.raises(ValueError, match="answered 2 queries with 1 results"):
            HttpRetriever(base).search(["a", "b"], 1)
