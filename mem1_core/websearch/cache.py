"""An on-disk cache of a search API's answers, so that rerunning an evaluation sends no
request and reads the very answers the first run read.

One JSON file per (endpoint, query, k), named by the SHA-256 of that key and spread over
256 subdirectories; it holds the key beside the raw answer, so a file can be checked
against the key it was read for and the answers of a run can be inspected by hand. Files are
written atomically (a temporary sibling renamed into place): a killed run leaves whole
answers or none, and two processes writing the same answer race harmlessly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from mem1_core.runs.atomic import write_json

log = logging.getLogger(__name__)


def cache_key(endpoint: str, query: str, k: int) -> str:
    """The hex digest naming the cache file of one request."""
    blob = json.dumps([endpoint, query, k], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Raw answers of a search API on disk, keyed by (endpoint, query, k)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, endpoint: str, query: str, k: int) -> Path:
        digest = cache_key(endpoint, query, k)
        return self.root / digest[:2] / f"{digest}.json"

    def get(self, endpoint: str, query: str, k: int) -> Any | None:
        """The cached answer, or None when there is none. A file that does not read back as
        the entry of this key (hand-edited, or from another tool) counts as absent and is
        fetched again, with a warning."""
        path = self.path(endpoint, query, k)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("web search cache: %s is unreadable (%s); fetching it again", path, e)
            return None
        if not isinstance(entry, dict) or [entry.get(f) for f in ("endpoint", "query", "k")] != [
            endpoint,
            query,
            k,
        ]:
            log.warning("web search cache: %s is not the entry of its key; fetching it again", path)
            return None
        return entry.get("response")

    def put(self, endpoint: str, query: str, k: int, response: Any) -> Path:
        entry = {"endpoint": endpoint, "query": query, "k": k, "response": response}
        return write_json(entry, self.path(endpoint, query, k))

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*/*.json")) if self.root.is_dir() else 0
