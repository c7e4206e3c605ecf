"""Load and bad input on the retrieval server, over loopback: does a training run ride out a busy or restarting server?

    .venv/bin/python benchmarks/retriever_load.py [--seconds 60] [--clients 32]
        [--index DIR | --url URL [--pid PID]]

Two phases of `--seconds` each against one `mem1 serve-retriever` (started here over the
`tiny` world's BM25 index unless --url names a running server):

  clean   `--clients` concurrent clients post well-formed requests back to back: batches
          of 1 to 128 queries (the world's questions), topk 1 to 10.
  abuse   the same clients go on, and beside them: malformed bodies (bad JSON, wrong
          types, a missing field, a negative topk, not JSON at all), oversized ones (one
          query more than the server's max_queries, a body over its byte limit, a topk
          over max_topk) and slow-loris connections that trickle a request's headers, or
          its body, one piece a second.

The test reads the server's limits from GET /health, so it runs against either set of
limits (main's, or the larger ones of branch retr-dropin). Printed per phase: throughput
(requests and queries per second), p50/p99 latency of the well-formed requests, their
errors, the status codes each bad kind got, and the server's RSS (before, after each phase,
peak). `ok` requires that no well-formed request failed and that the RSS after the abuse
is within --rss-slack-mb of the RSS after the clean phase. Human-readable lines go to
stderr, one JSON object to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file: the checkout

from benchmarks.common import ROOT, free_port, retriever_command, wait_for_retriever  # noqa: E402
from mem1_core.runs.host_memory import resident_bytes  # noqa: E402

BATCHES = (1, 1, 4, 4, 16, 32, 128)
"""Queries per well-formed request, drawn uniformly (small batches are the common case:
one rollout turn's queries; 128 is a large rollout batch)."""
TOPKS = (1, 3, 3, 10)
MALFORMED_CLIENTS = 4
OVERSIZED_CLIENTS = 2
SLOW_LORIS = 16
TRICKLE_S = 1.0
"""Seconds between two pieces a slow-loris connection sends."""


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def rss_mb(pid: int | None) -> float | None:
    rss = None if pid is None else resident_bytes(pid)
    return None if rss is None else round(rss / 2**20, 1)


class RssSampler:
    def __init__(self, pid: int | None, every_s: float = 0.25):
        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid) or 0.0)
            time.sleep(self.every_s)

    def stop(self) -> float | None:
        self._stop.set()
        return self.peak if self.pid is not None else None


# ---- the server ------------------------------------------------------------------------------


def world_dir(work: Path) -> Path:
    """The `tiny` world (its questions are the queries), generated into `work`."""
    from mem1_core.config import load_config
    from mem1_core.data.world import generate_world, write_world

    if not (work / "world" / "questions.parquet").is_file():
        write_world(generate_world(load_config("tiny").world), work / "world")
    return work / "world"


def build_index(work: Path) -> Path:
    from mem1_core.retrieval import build_index as build

    corpus = world_dir(work) / "corpus.parquet"
    return build(corpus, "bm25", work / "index", show_progress=False)


def world_queries(work: Path) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(world_dir(work) / "questions.parquet")["question"].to_pylist()


def start_server(index: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = retriever_command(index, port, "--log-level", "warning")
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_retriever(port, proc)
    except (RuntimeError, TimeoutError) as e:
        proc.kill()
        raise RuntimeError(f"the retrieval server did not start ({e}); see {log}") from None
    return proc


# ---- clients ---------------------------------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.queries = 0
        self.good_errors: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()
        self.bad: dict[str, Counter[str]] = defaultdict(Counter)
        self.loris: Counter[str] = Counter()

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies)
        q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
        return {
            "requests_per_s": round(len(lat) / seconds, 1),
            "queries_per_s": round(self.queries / seconds, 1),
            "p50_ms": round(1000 * q[49], 1),
            "p99_ms": round(1000 * q[98], 1),
            "well_formed_requests": len(lat),
            "well_formed_errors": dict(self.good_errors),
            "well_formed_retried": dict(self.retried),
            "bad_requests": {k: dict(v) for k, v in sorted(self.bad.items())},
            "slow_loris": dict(self.loris),
        }


async def well_formed(
    client: httpx.AsyncClient, queries: list[str], stats: Stats, until: float, rng: random.Random
) -> None:
    """Post well-formed requests back to back. A transport error is retried once, as
    HttpRetriever does: a pooled keep-alive connection the server closed a moment before
    the request reused it (uvicorn closes idle ones after 5 s) is the client's race, not a
    failure to serve; `retried` counts them, `well_formed_errors` what failed twice."""
    while time.monotonic() < until:
        n = rng.choice(BATCHES)
        body = {"queries": rng.sample(queries, n), "topk": rng.choice(TOPKS), "return_scores": True}
        t0 = time.perf_counter()
        kind = None
        for attempt in range(2):
            try:
                r = await client.post("/retrieve", json=body)
                ok = r.status_code == 200 and len(r.json()["result"]) == n
                kind = None if ok else f"status {r.status_code}"
                break
            except httpx.TransportError as e:
                kind = type(e).__name__
                if attempt == 0:
                    stats.retried[kind] += 1
            except httpx.HTTPError as e:
                kind = type(e).__name__
                break
        if kind is None:
            stats.latencies.append(time.perf_counter() - t0)
            stats.queries += n
        else:
            stats.good_errors[kind] += 1


def bad_requests(limits: dict[str, Any]) -> dict[str, list[tuple[str, dict]]]:
    """kind -> (content, headers) variants; contents are built once (the big ones too)."""
    max_q = int(limits.get("max_queries", 256))
    max_k = int(limits.get("max_topk", 100))
    # over the declared byte limit; without one (main's server), 8 MiB in a single query
    big = int(limits.get("max_body_bytes", 8 * 2**20 - 2**20)) + 2**20
    js = {"content-type": "application/json"}
    return {
        "malformed": [
            ('{"queries": ["unterminated', js),
            ('{"queries": "not a list", "topk": 3}', js),
            ('{"topk": 3}', js),
            ('{"queries": ["x"], "topk": -5}', js),
            ('{"queries": [1, {"a": 2}, null]}', js),
            ("queries=a&topk=3", {"content-type": "application/x-www-form-urlencoded"}),
            ("\x00\xff garbage", {"content-type": "application/octet-stream"}),
        ],
        "oversized": [
            (json.dumps({"queries": ["q"] * (max_q + 1), "topk": 1}), js),
            (json.dumps({"queries": ["x" * big], "topk": 1}), js),
            (json.dumps({"queries": ["capital"], "topk": max_k + 1}), js),
        ],
    }


def _label(kind: str, content: str) -> str:
    if kind == "oversized":
        if content.startswith('{"queries": ["q", "q"'):
            return "oversized:too_many_queries"
        return "oversized:huge_body" if len(content) > 2**20 else "oversized:topk_over_max"
    return f"malformed:{content[:18]!r}"


async def abuser(
    client: httpx.AsyncClient, variants: list[tuple[str, dict]], kind: str, stats: Stats,
    until: float, rng: random.Random,
) -> None:  # fmt: skip
    while time.monotonic() < until:
        content, headers = rng.choice(variants)
        label = _label(kind, content)
        try:
            r = await client.post("/retrieve", content=content.encode(), headers=headers)
            stats.bad[label][str(r.status_code)] += 1
        except httpx.HTTPError as e:
            stats.bad[label][type(e).__name__] += 1
        await asyncio.sleep(0.05)


async def slow_loris(host: str, port: int, body: bool, stats: Stats, until: float) -> None:
    """Trickle one request, a piece a second, until `until` or until the server drops it."""
    kind = "slow_body" if body else "slow_headers"
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        stats.loris[f"{kind}: refused"] += 1
        return
    head = f"POST /retrieve HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    pieces = iter([head + "Content-Length: 100000\r\n\r\n"] if body else [head])
    started = time.monotonic()
    try:
        while time.monotonic() < until:
            piece = next(pieces, '{"q' if body else "X-Trickle: a\r\n")
            writer.write(piece.encode())
            await writer.drain()
            try:
                data = await asyncio.wait_for(reader.read(1024), timeout=TRICKLE_S)
                if data == b"" or data.startswith(b"HTTP/1.1 4"):
                    held = time.monotonic() - started
                    stats.loris[f"{kind}: dropped by the server after {held:.0f} s"] += 1
                    return
            except TimeoutError:
                pass
        stats.loris[f"{kind}: held to the end"] += 1
    except (ConnectionError, OSError):
        stats.loris[f"{kind}: reset by the server after {time.monotonic() - started:.0f} s"] += 1
    finally:
        writer.close()


async def phase(
    url: str, queries: list[str], seconds: float, clients: int, limits: dict | None
) -> tuple[Stats, float]:
    stats, until = Stats(), time.monotonic() + seconds
    host, port = url.removeprefix("http://").rsplit(":", 1)
    limits_http = httpx.Limits(max_connections=clients + 16, max_keepalive_connections=clients + 16)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits_http) as client:
        jobs = [
            well_formed(client, queries, stats, until, random.Random(i)) for i in range(clients)
        ]
        if limits is not None:
            bad = bad_requests(limits)
            jobs += [abuser(client, bad["malformed"], "malformed", stats, until, random.Random(100 + i))
                     for i in range(MALFORMED_CLIENTS)]  # fmt: skip
            jobs += [abuser(client, bad["oversized"], "oversized", stats, until, random.Random(200 + i))
                     for i in range(OVERSIZED_CLIENTS)]  # fmt: skip
            jobs += [
                slow_loris(host, int(port), i % 2 == 1, stats, until) for i in range(SLOW_LORIS)
            ]
        t0 = time.monotonic()
        await asyncio.gather(*jobs)
    return stats, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    p.add_argument("--clients", type=int, default=32, help="concurrent well-formed clients")
    p.add_argument("--index", help="index to serve (default: the tiny world's BM25, built here)")
    p.add_argument("--url", help="a running server instead (its RSS needs --pid)")
    p.add_argument("--pid", type=int, help="the --url server's process id, for its RSS")
    p.add_argument("--rss-slack-mb", type=float, default=100.0)
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="mem1-retriever-load-"))
    proc = None
    try:
        if args.url:
            url, pid = args.url.rstrip("/"), args.pid
        else:
            index = Path(args.index) if args.index else build_index(work)
            port = free_port()
            proc = start_server(index, port, work / "server.log")
            url, pid = f"http://127.0.0.1:{port}", proc.pid
        health = httpx.get(f"{url}/health", timeout=10).json()
        limits = health.get("limits", {})
        queries = world_queries(work)
        httpx.post(f"{url}/retrieve", json={"queries": queries[:8], "topk": 3}, timeout=30)
        before = rss_mb(pid)
        say(f"server {url} (pid {pid}): {health.get('documents')} documents, limits {limits}; "
            f"RSS {before} MB; {args.clients} clients, {args.seconds:g} s per phase")  # fmt: skip
        report: dict[str, Any] = {"url": url, "limits": limits, "clients": args.clients,
                                  "seconds_per_phase": args.seconds, "rss_mb_before": before}  # fmt: skip
        for name, abuse in (("clean", None), ("abuse", limits)):
            sampler = RssSampler(pid)
            stats, took = asyncio.run(phase(url, queries, args.seconds, args.clients, abuse))
            out = stats.summary(took) | {"rss_mb_after": rss_mb(pid), "rss_mb_peak": sampler.stop()}
            report[name] = out
            say(f"{name}: {out['requests_per_s']} req/s ({out['queries_per_s']} queries/s), "
                f"p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, well-formed errors "
                f"{out['well_formed_errors'] or 'none'} (retried once: "
                f"{out['well_formed_retried'] or 'none'}); RSS after {out['rss_mb_after']} MB, "
                f"peak {out['rss_mb_peak']} MB")  # fmt: skip
            for kind, codes in out["bad_requests"].items():
                say(f"  {kind}: {codes}")
            for kind, n in out["slow_loris"].items():
                say(f"  {kind}: {n}")
        time.sleep(2)
        report["rss_mb_idle_after"] = rss_mb(pid)
        grew = (
            None
            if pid is None
            else report["abuse"]["rss_mb_after"] - report["clean"]["rss_mb_after"]
        )
        report["rss_growth_mb_under_abuse"] = grew
        report["ok"] = (
            not report["clean"]["well_formed_errors"]
            and not report["abuse"]["well_formed_errors"]
            and report["abuse"]["well_formed_requests"] > 0
            and (grew is None or grew <= args.rss_slack_mb)
        )
        say(f"ok: {report['ok']} (RSS growth under abuse: {grew} MB)")
        print(json.dumps(report))
        return 0 if report["ok"] else 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
