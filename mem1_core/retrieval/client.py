"""`HttpRetriever`: the `Retriever` interface over a Search-R1-schema `/retrieve` server
(ours, `mem1 serve-retriever`, or Search-R1's own).

Connection failures, timeouts and 5xx answers are retried a bounded number of times with
exponential backoff; a 4xx answer is the caller's fault and raises at once. When the
server stays unreachable the error says so and how to start one.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.corpus import parse_contents


class RetrieverUnavailable(ConnectionError):
    """The retrieval server could not be reached, timed out, or kept failing."""


def parse_result(result: list[Any]) -> list[list[Hit]]:
    """Search-R1 `result` (with or without scores) -> hits."""
    out = []
    for docs in result:
        hits = []
        for item in docs:
            doc, score = (item["document"], item["score"]) if "document" in item else (item, 0.0)
            title, text = parse_contents(doc["contents"])
            hits.append(Hit(doc_id=str(doc["id"]), title=title, text=text, score=float(score)))
        out.append(hits)
    return out


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
    ):
        """`url`: server base URL (a trailing `/retrieve` is accepted). `retries`: extra
        attempts after the first; `max_batch`: queries per request (the server's limit)."""
        base = url.rstrip("/")
        self.base_url = base.removesuffix("/retrieve")
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/retrieve"
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
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
            return response.json()
        raise RetrieverUnavailable(
            f"retrieval server at {self.base_url} failed after {self.retries + 1} attempts: "
            f"{last}. Is it running? Start one with `mem1 serve-retriever --index DIR`."
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_batch):
            batch = queries[start : start + self.max_batch]
            body = self._post({"queries": batch, "topk": k, "return_scores": True})
            out.extend(parse_result(body["result"]))
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
