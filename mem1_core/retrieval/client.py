"""`HttpRetriever`: the `Retriever` interface over a Search-R1-schema `/retrieve` server
(ours, `mem1 serve-retriever`, or Search-R1's own).

Answers are read as tolerantly as Search-R1's own client reads them (it uses only
`document.contents`): Search-R1's BM25 server sends documents without `id` (`title`,
`text`, `contents`), its search-API servers (Google, SerpAPI) send `{"document":
{"contents"}}` without `score` and ignore `topk`. A missing id is derived from the passage
(the same passage gets the same id in every answer), a missing score is 0.0 (the
server's order stands), and a server that sends more than `k` passages is cut to `k`.

Connection failures, timeouts and 5xx answers are retried with exponential backoff (capped
at `max_backoff_s`): at least `retries` more times, and for as long as the outage has lasted
less than `outage_s` seconds, so a training run rides out a retrieval server that restarts
(retrieval.outage_seconds). A 4xx answer is the caller's fault and raises at once.
When the server stays unreachable the error says so and how to start one.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

import httpx

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.corpus import format_contents, parse_contents

log = logging.getLogger(__name__)


class RetrieverUnavailable(ConnectionError):
    """The retrieval server could not be reached, timed out, or kept failing."""


def passage_id(contents: str) -> str:
    """The id given to a document the server sent without one."""
    return "sha1:" + hashlib.sha1(contents.encode("utf-8")).hexdigest()[:16]


def _hit(item: dict[str, Any]) -> Hit:
    """One entry of a Search-R1 result: `{"document": doc, "score": s}`, the document
    without a score, or (with `return_scores` false) the bare document."""
    doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
    score = 0.0 if score is None else float(score)
    if "contents" in doc:
        passage = str(doc["contents"])
        title, text = parse_contents(passage)
    else:  # a server that splits the document only
        passage, title, text = None, str(doc.get("title", "")), str(doc["text"])
    doc_id = doc.get("id", doc.get("doc_id"))
    if doc_id is None:
        doc_id = passage_id(passage if passage is not None else format_contents(title, text))
    return Hit(doc_id=str(doc_id), title=title, text=text, score=score, passage=passage)


def parse_result(result: list[Any], k: int | None = None) -> list[list[Hit]]:
    """Search-R1 `result` -> hits, at most `k` per query when given."""
    return [[_hit(item) for item in docs[:k]] for docs in result]


class HttpRetriever:
    """Retriever client for `POST {url}/retrieve`; implements `Retriever`."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.25,
        max_batch: int = 256,
        outage_s: float = 0.0,
        max_backoff_s: float = 2.0,
    ):
        """`url`: server base URL (a trailing `/retrieve` is accepted). `retries`: extra
        attempts after the first; `outage_s`: keep retrying until the server has failed for
        this long; `max_batch`: queries per request (the server's limit)."""
        base = url.rstrip("/")
        self.base_url = base.removesuffix("/retrieve")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.outage_s = outage_s
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/retrieve"
        last: str = ""
        attempt, start = 0, time.monotonic()
        while attempt <= self.retries or time.monotonic() - start < self.outage_s:
            if attempt:
                if attempt == 1:
                    log.warning("retrieval server at %s: %s; retrying", self.base_url, last)
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
            attempt += 1
            try:
                response = self._client.post(url, json=payload)
            except httpx.TimeoutException:
                last = f"no answer within {self.timeout_s:g} s"
                continue
            except httpx.TransportError as e:
                last = f"cannot connect ({type(e).__name__}: {e})"
                continue
            if response.status_code >= 500:
                last = f"server error {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise ValueError(f"retrieval server refused the request: {response.text[:500]}")
            if attempt > 1:
                log.warning("retrieval server at %s answers again", self.base_url)
            return response.json()
        raise RetrieverUnavailable(
            f"retrieval server at {self.base_url} failed after {attempt} attempts: {last}; "
            f"gave up after {time.monotonic() - start:.1f} s. Is it running? Start one with "
            "`mem1 serve-retriever --index DIR`."
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            batch = queries[start : start + self.max_batch]
            body = self._post({"queries": batch, "topk": k, "return_scores": True})
            result = body.get("result") if isinstance(body, dict) else None
            if not isinstance(result, list) or len(result) != len(batch):
                got = len(result) if isinstance(result, list) else type(result).__name__
                raise ValueError(
                    f"retrieval server at {self.base_url} answered {len(batch)} queries with "
                    f"{got} results; is it a Search-R1-schema /retrieve server?"
                )
            out.extend(parse_result(result, k))
        return out

    def health(self) -> dict[str, Any]:
        try:
            response = self._client.get(f"{self.base_url}/health")
        except httpx.HTTPError as e:
            raise RetrieverUnavailable(f"retrieval server at {self.base_url}: {e}") from e
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
