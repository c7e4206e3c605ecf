"""The web-search retriever against the local stand-in of a Serper-style API: the stand-in
answers over a real socket from the world's real BM25 index. Every failure the stand-in can
inject ends in a clear error or a retry, within short timeouts; the cache makes a rerun send
no request."""

from __future__ import annotations

import json
import socket
import time

import pytest

from mem1_core.config import load_config
from mem1_core.qa.env import NO_RESULTS, format_passages
from mem1_core.websearch.cache import ResponseCache
from mem1_core.websearch.client import (
    WebSearchError,
    WebSearchRetriever,
    WebSearchSettings,
    WebSearchUnavailable,
    organic_hits,
)
from mem1_core.websearch.standin import Faults, snippet, standin_server

KEY_ENV = "MEM1_TEST_SEARCH_KEY"
KEY = "test-key-123"


@pytest.fixture(scope="module")
def server(small_index):
    with standin_server(small_index, api_key=KEY) as state:
        yield state


@pytest.fixture
def standin(server, monkeypatch):
    """The module's stand-in with its switches reset, and its key in the environment."""
    server.faults = Faults()
    monkeypatch.setenv(KEY_ENV, KEY)
    yield server
    server.faults = Faults()


@pytest.fixture
def questions(small_world):
    return small_world.questions["question"].to_pylist()[:6]


def web(url: str, cache=None, **kw) -> WebSearchRetriever:
    kw = {"timeout_s": 2.0, "retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05} | kw
    settings = WebSearchSettings(
        endpoint=url,
        api_key_env=KEY_ENV,
        requests_per_second=1000.0,
        cache_dir=None if cache is None else str(cache),
        **kw,
    )
    return WebSearchRetriever(settings)


def test_whole_snippets_give_the_info_the_index_gives(standin, small_index, questions):
    """With the document's whole body as its snippet, the web path hands the agent the same
    `<info>` text as the in-process index: the backend loses nothing on the way."""
    with web(standin.url) as r:
        for k in (1, 3):
            got = r.search(questions, k)
            want = small_index.search(questions, k)
            assert [format_passages(h) for h in got] == [format_passages(h) for h in want]
            assert all(h.doc_id.startswith("https://") and h.score == 0.0 for hs in got for h in hs)
    assert format_passages(got[0]).startswith("Doc 1 (Title: ")


def test_a_rerun_is_served_from_the_cache(standin, questions, tmp_path, monkeypatch):
    with web(standin.url, tmp_path / "cache") as first:
        before = standin.requests
        hits = first.search([*questions, questions[0], "  "], 2)
        assert standin.requests - before == first.requests == len(questions)  # deduplicated
        assert hits[-1] == [] and hits[len(questions)] == hits[0]
    assert len(ResponseCache(tmp_path / "cache")) == len(questions)
    monkeypatch.delenv(KEY_ENV)  # a rerun from the cache needs no key
    before = standin.requests
    with web(standin.url, tmp_path / "cache", offline=True) as again:
        assert again.search([*questions, questions[0], "  "], 2) == hits
        assert again.requests == 0 and standin.requests == before
        # another k is another request: offline refuses it, without asking
        with pytest.raises(WebSearchError, match=r"1 queries are not in the cache"):
            again.search(questions[:1], 3)
    assert standin.requests == before


def test_an_unreadable_cache_entry_is_fetched_again(standin, questions, tmp_path):
    cache = ResponseCache(tmp_path)
    with web(standin.url, tmp_path) as r:
        want = r.search(questions[:1], 2)
        path = cache.path(standin.url, questions[0].strip(), 2)
        path.write_text('{"endpoint": "')  # not whole: as if written by hand, or cut short
        assert r.search(questions[:1], 2) == want and r.requests == 2
        assert json.loads(path.read_text())["query"] == questions[0].strip()


def test_a_missing_key_names_its_variable(standin, questions, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    before = standin.requests
    with web(standin.url) as r, pytest.raises(WebSearchError, match=KEY_ENV):
        r.search(questions[:1], 2)
    assert standin.requests == before


def test_a_wrong_key_is_refused_at_once(standin, questions, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "not-the-key")
    with web(standin.url) as r:
        with pytest.raises(WebSearchError, match=rf"refused the API key in \${KEY_ENV} \(HTTP 403"):
            r.search(questions[:1], 2)
        assert r.requests == 1  # no retry: the key would still be wrong


def test_server_errors_are_retried_then_named(standin, questions):
    standin.faults.status = 500
    start = time.monotonic()
    with web(standin.url, retries=2) as r:
        with pytest.raises(WebSearchUnavailable, match=r"failed after 3 attempts: HTTP 500"):
            r.search(questions[:1], 2)
        assert r.requests == 3
    assert time.monotonic() - start < 2.0


def test_a_hung_service_times_out(standin, questions):
    standin.faults.delay_s = 1.0
    start = time.monotonic()
    with web(standin.url, timeout_s=0.2, retries=1) as r:
        with pytest.raises(WebSearchUnavailable, match=r"2 attempts: no answer within 0.2 s"):
            r.search(questions[:1], 2)
    assert time.monotonic() - start < 1.5


def test_rate_limited_requests_are_retried_until_they_pass(standin, questions, tmp_path):
    standin.faults.rate_limited = 2
    with web(standin.url, tmp_path, retries=3) as r:
        hits = r.search(questions[:1], 2)
        assert r.requests == 3 and len(hits[0]) == 2
    standin.faults.rate_limited = 5  # more 429s than retries: a clear error at the end
    with web(standin.url, retries=1) as r:
        with pytest.raises(WebSearchUnavailable, match=r"2 attempts: HTTP 429"):
            r.search(questions[1:2], 2)


def test_an_empty_result_is_a_valid_empty_info(standin, questions, tmp_path):
    standin.faults.empty = True
    with web(standin.url, tmp_path) as r:
        assert r.search(questions[:2], 2) == [[], []]
        assert format_passages([]) == NO_RESULTS
    assert len(ResponseCache(tmp_path)) == 2  # an empty answer is an answer: cached


def test_malformed_json_is_an_error_and_not_cached(standin, questions, tmp_path):
    standin.faults.malformed = True
    with web(standin.url, tmp_path) as r:
        with pytest.raises(
            WebSearchError, match=r"answered HTTP 200 with something that is not JSON"
        ):
            r.search(questions[:1], 2)
        assert r.requests == 1
    assert len(ResponseCache(tmp_path)) == 0


def test_an_unreachable_service_is_named(questions, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/search"
    with web(url, retries=1) as r, pytest.raises(WebSearchUnavailable, match="cannot connect"):
        r.search(questions[:1], 2)


def test_the_rate_limit_spaces_requests(standin, questions):
    settings = WebSearchSettings(
        endpoint=standin.url, api_key_env=KEY_ENV, requests_per_second=25.0, concurrency=4
    )
    start = time.monotonic()
    with WebSearchRetriever(settings) as r:
        r.search(questions[:6], 1)
    assert time.monotonic() - start >= 5 / 25.0  # six starts, five intervals of 40 ms


def test_organic_results_become_hits_in_the_engines_order():
    body = {
        "organic": [
            {"title": "B", "link": "https://b", "snippet": "two\n lines", "position": 2},
            {"title": "A", "link": "https://a", "snippet": "first", "position": 1},
            {"link": "https://nothing"},  # neither title nor snippet: not a document
            {"title": "C", "link": "https://c", "snippet": "third", "position": 3},
        ],
        "knowledgeGraph": {"title": "left out"},
    }
    hits = organic_hits(body, 2)
    assert [(h.doc_id, h.title, h.text, h.passage) for h in hits] == [
        ("https://a", "A", "first", '"A"\nfirst'),
        ("https://b", "B", "two lines", '"B"\ntwo lines'),
    ]
    assert format_passages(hits) == "Doc 1 (Title: A) first\nDoc 2 (Title: B) two lines"
    assert organic_hits({"searchParameters": {}}, 3) == []
    with pytest.raises(WebSearchError, match="not an object"):
        organic_hits([], 3)
    with pytest.raises(WebSearchError, match="`organic` is a str"):
        organic_hits({"organic": "none"}, 3)


def test_snippets_are_cut_at_a_word():
    assert snippet("one two three", None) == "one two three"
    assert snippet("one two three", 9) == "one two ..."


def test_the_websearch_domain_is_qa_searching_the_web(standin, small_index, tmp_path):
    """`env.kind=websearch` is the QA domain with the web API as its search tool: it builds no
    index, and the scripted teacher plays the same episodes through the stand-in (whole
    snippets) as through the local index, turn for turn and reward for reward."""
    from mem1_core.domains.inputs import load_tasks, make_env, prepare
    from mem1_core.domains.registry import domain_of
    from mem1_core.models.tokenizer import load_tokenizer
    from mem1_core.training.sft import teacher_trajectories

    web_set = ["env.kind=websearch", f"retrieval.web_endpoint={standin.url}",
               f"retrieval.web_api_key_env={KEY_ENV}"]  # fmt: skip
    cfg = load_config("smoke", overrides=web_set)
    paths = prepare(cfg, tmp_path)
    assert not domain_of(cfg).uses_index(cfg) and not paths.indexes.exists()
    tok = load_tokenizer(paths.tokenizer)
    env = make_env(cfg, paths, tok)
    assert isinstance(env.retriever, WebSearchRetriever)
    local = make_env(load_config("smoke"), paths, tok, small_index)
    tasks = load_tasks(cfg, paths, "test", 2)[:4]
    played = {
        name: teacher_trajectories(tasks, tok, e, cfg.rollout, memory="mem1")
        for name, e in (("web", env), ("local", local))
    }
    texts = {k: [[t.gen_text for t in tr.turns] for tr in v] for k, v in played.items()}
    assert texts["web"] == texts["local"] and sum(map(len, texts["web"])) > 2 * len(tasks)
    assert [tr.em for tr in played["web"]] == [tr.em for tr in played["local"]]
    assert len(ResponseCache(tmp_path / "web_cache")) > 0  # the run's own cache by default
    with pytest.raises(ValueError, match="retrieval.url=http://x is a retrieval server"):
        domain_of(load_config("smoke", overrides=[*web_set, "retrieval.url=http://x"]))
    for bad, match in [
        (["env.kind=web"], "env.kind='web': use one of"),
        (["retrieval.web_requests_per_second=0"], "must be > 0"),
        (["retrieval.web_retries=-1"], "web_retries must be >= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_config("smoke", overrides=bad)


def test_the_transfer_record_pairs_the_arms_by_agent_and_n():
    from mem1_core.websearch.transfer import render_markdown, transfer_rows

    def head(em: list[float], tasks: dict) -> dict:
        cells = [
            {"agent": "base", "N": n, "tasks": 2, "em_frac": e, "em_frac_se": 0.5, "em_sum": e * n,
             "em_sum_se": 0.5 * n, "peak_tokens": 100.0 * n, "peak_tokens_se": 1.0}
            for n, e in zip((1, 2), em, strict=True)
        ]  # fmt: skip
        return {"cells": cells, "task_em": {"base": tasks}}

    local = head([1.0, 0.5], {"1": {"a": 1.0, "b": 1.0}, "2": {"c": 1.0, "d": 0.0}})
    web = head([0.5, 0.5], {"1": {"a": 1.0, "b": 0.0}, "2": {"c": 1.0, "d": 0.0}})
    rows = transfer_rows({"local": local, "web": web})
    assert [(r["N"], r["web_minus_local_em"]) for r in rows] == [(1, -0.5), (2, 0.0)]
    assert rows[0]["web_minus_local_em_se_paired"] == pytest.approx(0.5)
    assert rows[1]["web_minus_local_em_se_paired"] == 0.0
    record = {"what": "w", "command": "mem1 web-transfer", "snippet_chars": None, "rows": rows,
              "standin_requests": 3, "wall_seconds": 1.0, "cpu_seconds": 1.0,
              "machine": {"cpu": "cpu", "cores": 2}, "commit": "abc"}  # fmt: skip
    assert "| base | 2 | 2 | 1.000 ± 1.000 | 1.000 ± 1.000 | 0.000 ± 0.000 |" in render_markdown(
        record
    )
