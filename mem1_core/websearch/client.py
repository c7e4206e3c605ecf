"""`WebSearchRetriever`: the `Retriever` interface over a web search API in the JSON shape
of Serper's (the search engine the MEM1 paper's agent is transferred to zero-shot).

    POST {endpoint}   headers {"X-API-KEY": key}   body {"q": query, "num": k}
      -> {"organic": [{"title", "link", "snippet", "position"}, ...], ...}

Each organic result becomes one `Hit`: its title, its snippet as the text, its link as the
id. The QA environment writes hits as `Doc i (Title: ...) text` lines, the form the agent
read from the Wikipedia retriever in training (Search-R1's `_passages2string`), so a search
engine's answer reaches the agent in the same shape as a passage; `passage` keeps Search-R1's
`"Title"\\nsnippet` contents. A snippet's line breaks are folded into spaces (one line per
document, as in training). An answer without organic results is a valid empty result: the
`<info>` then says `No results.`. Serper's other blocks (answer box, knowledge graph) are
left out: the agent never saw their like in training.

Around every request:
- the API key is read from an environment variable at the first request that needs it, so
  a rerun served from the cache needs none; a missing key is an error naming the variable;
- a rate limit spaces requests (requests per second, shared by the worker threads);
- every request has a timeout; timeouts, connection errors, 429 and 5xx answers are retried
  with exponential backoff (a 429's `Retry-After` is honoured up to the backoff's cap), a
  bounded number of times, then `WebSearchUnavailable` (a `RetrieverUnavailable`: a training
  run stops and `--resume` continues it);
- a refused key (401/403), any other 4xx, and an answer that is not JSON or not of this shape
  raise `WebSearchError` at once: retrying would not change them;
- answers are cached on disk by (endpoint, query, k) (`ResponseCache`); with `offline` a
  query the cache does not hold is an error instead of a request.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from mem1_core.retrieval.base import Hit
from mem1_core.retrieval.client import RetrieverUnavailable
from mem1_core.retrieval.corpus import format_contents
from mem1_core.websearch.cache import ResponseCache

log = logging.getLogger(__name__)

SERPER_ENDPOINT = "https://google.serper.dev/search"
API_KEY_HEADER = "X-API-KEY"
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""Answers that may succeed when asked again (rate limited, the service briefly down)."""
_SPACES = re.compile(r"\s+")


class WebSearchError(ValueError):
    """The search API refused the request or answered in a shape this client cannot read;
    asking again would not help."""


class WebSearchUnavailable(RetrieverUnavailable):
    """The search API kept failing (timeouts, connection errors, 429 or 5xx) past the retries."""


@dataclass(frozen=True)
class WebSearchSettings:
    """How to reach a search API and how gently (mirrors the `retrieval.web_*` config fields)."""

    endpoint: str = SERPER_ENDPOINT
    api_key_env: str = "SERPER_API_KEY"
    requests_per_second: float = 5.0
    timeout_s: float = 10.0
    retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    concurrency: int = 4
    cache_dir: str | None = None
    offline: bool = False

    def __post_init__(self) -> None:
        if self.requests_per_second <= 0:
            raise ValueError(f"requests_per_second must be > 0, got {self.requests_per_second}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.retries < 0 or self.concurrency < 1:
            raise ValueError("need retries >= 0 and concurrency >= 1")
        if self.offline and self.cache_dir is None:
            raise ValueError("offline answers from the cache: give a cache_dir")


class RateLimiter:
    """At most `rate` request starts per second, across threads (evenly spaced slots)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.interval = 1.0 / rate
        self._clock = clock
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            time.sleep(start - now)


def _clean(text: Any) -> str:
    return _SPACES.sub(" ", str(text or "")).strip()


def organic_hits(body: Any, k: int, where: str = "the search API") -> list[Hit]:
    """A Serper-shaped answer -> its first `k` organic results as hits, in the engine's order
    (`position` where given). Raises WebSearchError when `body` is not of that shape."""
    if not isinstance(body, dict):
        raise WebSearchError(f"{where} answered a JSON {type(body).__name__}, not an object")
    organic = body.get("organic", [])
    if not isinstance(organic, list):
        raise WebSearchError(f"{where}: `organic` is a {type(organic).__name__}, not a list")
    items = [r for r in organic if isinstance(r, dict) and (r.get("title") or r.get("snippet"))]
    ranked = sorted(enumerate(items), key=lambda p: (_position(p[1], p[0]), p[0]))
    hits = []
    for _, r in ranked[:k]:
        title, snippet = _clean(r.get("title")), _clean(r.get("snippet"))
        link = str(r.get("link") or "")
        hits.append(
            Hit(
                doc_id=link or f"{title}#{len(hits)}",
                title=title,
                text=snippet,
                score=0.0,  # the engine gives no score: its order stands
                passage=format_contents(title, snippet),
            )
        )
    return hits


def _position(result: dict, index: int) -> float:
    try:
        return float(result["position"])
    except (KeyError, TypeError, ValueError):
        return float(index + 1)


class WebSearchRetriever:
    """Retriever over a Serper-shaped search API; implements `Retriever`."""

    def __init__(self, settings: WebSearchSettings = WebSearchSettings()):
        self.settings = settings
        self.cache = ResponseCache(settings.cache_dir) if settings.cache_dir else None
        self.limiter = RateLimiter(settings.requests_per_second)
        self.requests = 0
        """Requests sent (attempts included): 0 in a rerun served from the cache."""
        self._count_lock = threading.Lock()
        self._client = httpx.Client(timeout=settings.timeout_s)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        wanted = [q.strip() for q in queries]
        answers: dict[str, Any] = {}
        missing = []
        for q in dict.fromkeys(q for q in wanted if q):  # each distinct query once
            cached = self.cache.get(self.settings.endpoint, q, k) if self.cache else None
            if cached is not None:
                answers[q] = cached
            else:
                missing.append(q)
        if missing and self.settings.offline:
            raise WebSearchError(
                f"offline web search: {len(missing)} queries are not in the cache "
                f"{self.settings.cache_dir} (first: {missing[0]!r}); turn off "
                "retrieval.web_offline and give an API key to fetch them"
            )
        if missing:
            key = self._api_key()
            workers = min(self.settings.concurrency, len(missing))
            with ThreadPoolExecutor(workers, thread_name_prefix="web-search") as pool:
                fetched = list(pool.map(lambda q: self._fetch(q, k, key), missing))
            answers.update(zip(missing, fetched, strict=True))
        where = f"web search at {self.settings.endpoint}"
        return [organic_hits(answers[q], k, where) if q else [] for q in wanted]

    def _api_key(self) -> str:
        name = self.settings.api_key_env
        key = os.environ.get(name, "").strip()
        if not key:
            raise WebSearchError(
                f"web search needs an API key: set the environment variable {name} (the "
                f"variable is retrieval.web_api_key_env), or rerun from a cache that holds "
                "every query with retrieval.web_offline=true"
            )
        return key

    def _fetch(self, query: str, k: int, key: str) -> Any:
        """One query's answer (parsed JSON, checked), fetched with retries and cached."""
        s = self.settings
        body = self._post({"q": query, "num": k}, key)
        organic_hits(body, k, f"web search at {s.endpoint}")  # refuse a bad shape before caching
        if self.cache is not None:
            self.cache.put(s.endpoint, query, k, body)
        return body

    def _post(self, payload: dict[str, Any], key: str) -> Any:
        s = self.settings
        headers = {API_KEY_HEADER: key, "Content-Type": "application/json"}
        start, last, wait = time.monotonic(), "", 0.0
        for attempt in range(s.retries + 1):
            if attempt:
                time.sleep(wait)
            self.limiter.wait()
            with self._count_lock:
                self.requests += 1
            wait = min(s.backoff_s * 2**attempt, s.max_backoff_s)
            try:
                response = self._client.post(s.endpoint, json=payload, headers=headers)
            except httpx.TimeoutException:
                last = f"no answer within {s.timeout_s:g} s"
                continue
            except httpx.TransportError as e:
                last = f"cannot connect ({type(e).__name__}: {e})"
                continue
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:200]}"
                if response.status_code == 429:
                    wait = max(wait, min(_retry_after(response), s.max_backoff_s))
                if attempt == 0:
                    log.warning("web search at %s: %s; retrying", s.endpoint, last)
                continue
            return _read_answer(response, s)
        raise WebSearchUnavailable(
            f"web search at {s.endpoint} failed after {s.retries + 1} attempts: {last}; gave up "
            f"after {time.monotonic() - start:.1f} s (retrieval.web_retries, "
            "retrieval.web_timeout_seconds)"
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> WebSearchRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", "0")))
    except ValueError:  # an HTTP date: not worth parsing for a capped wait
        return 0.0


def _read_answer(response: httpx.Response, s: WebSearchSettings) -> Any:
    """The JSON of a final (not retried) answer, or WebSearchError saying what went wrong."""
    code = response.status_code
    if code in (401, 403):
        raise WebSearchError(
            f"web search at {s.endpoint} refused the API key in ${s.api_key_env} (HTTP {code}: "
            f"{response.text[:200]}); check the key and the endpoint"
        )
    if code >= 400:
        raise WebSearchError(
            f"web search at {s.endpoint} refused the request (HTTP {code}): {response.text[:300]}"
        )
    try:
        return response.json()
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise WebSearchError(
            f"web search at {s.endpoint} answered HTTP {code} with something that is not JSON: "
            f"{response.text[:200]!r}"
        ) from None


def settings_from_config(retrieval: Any, run_root: str | os.PathLike | None) -> WebSearchSettings:
    """The settings `retrieval.web_*` name; the cache defaults to `web_cache/` under the run."""
    cache = retrieval.web_cache
    if cache is None and run_root is not None:
        cache = str(Path(run_root) / "web_cache")
    return WebSearchSettings(
        endpoint=retrieval.web_endpoint,
        api_key_env=retrieval.web_api_key_env,
        requests_per_second=retrieval.web_requests_per_second,
        timeout_s=retrieval.web_timeout_seconds,
        retries=retrieval.web_retries,
        concurrency=retrieval.web_concurrency,
        cache_dir=cache,
        offline=retrieval.web_offline,
    )
