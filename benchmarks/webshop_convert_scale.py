"""WebShop's conversion and shop search at the size of WebShop's full files, one JSON line a
stage.

    nice -n 19 env OMP_NUM_THREADS=1 python benchmarks/webshop_convert_scale.py \
        [--products 1180000] [--dir /tmp/webshop-scale] [--max-rss-gb 5] [--keep]

Writes a synthetic `items_shuffle.json` of N products in WebShop's format (titles ~80
characters, descriptions ~800, five bullet points, 0-3 option groups, image links; words
drawn from a Zipf vocabulary; a tenth of the prices ranges, a few items WebShop's loader
skips) and an `items_ins_v2.json` (every product's attributes, synthetic instructions for 1 %
of them). Then, each in a child process whose peak RSS is read from the kernel (and which is
killed past `--max-rss-gb`): `mem1 data webshop` into a shop directory, the shop's search
index built from it (the first search) and loaded again (every later one). Prints wall time,
peak RSS and sizes (MiB). The files are deleted at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 30_000
SYLLABLES = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "an", "or", "el", "ib", "us")
GROUPS = ("color", "size", "style", "pattern name", "flavor name", "material")
CATEGORIES = ("beauty", "electronics", "fashion", "food", "furniture")

SEARCH = """
import itertools, json, sys, time
from pathlib import Path
from mem1_core.webshop.search import saved_search
t = time.perf_counter()
search = saved_search(sys.argv[1])
seconds = time.perf_counter() - t
with open(Path(sys.argv[1]) / "products.jsonl") as f:  # queries: the first titles' words
    queries = [" ".join(json.loads(line)["title"].split()[:3]) for line in itertools.islice(f, 100)]
t = time.perf_counter()
hits = [search.search(q) for q in queries]  # one at a time, as an environment searches
print(json.dumps({"seconds": round(seconds, 2), "queries": len(queries),
                  "search_s_per_query": round((time.perf_counter() - t) / len(queries), 4),
                  "results_per_query": sum(map(len, hits)) / len(queries)}))
"""


class Words:
    """Text of pseudo-words drawn from a Zipf vocabulary (p ~ 1 / rank), a pool at a time."""

    def __init__(self, rng: np.random.Generator):
        vocab: set[str] = set()
        while len(vocab) < VOCAB:
            n = int(rng.integers(1, 5))
            vocab.add("".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), n)))
        self.vocab = rng.permutation(np.array(sorted(vocab), dtype=object))
        p = 1.0 / np.arange(1, VOCAB + 1)
        self.cdf = np.cumsum(p / p.sum())
        self.rng, self.pool, self.at = rng, [], 0

    def __call__(self, n: int) -> str:
        if self.at + n > len(self.pool):
            draws = np.searchsorted(self.cdf, self.rng.random(1 << 20) * self.cdf[-1])
            self.pool, self.at = self.vocab[draws].tolist(), 0
        self.at += n
        return " ".join(self.pool[self.at - n : self.at])


def write_files(out: Path, n: int, seed: int = 0) -> tuple[Path, Path]:
    """items_shuffle.json and items_ins_v2.json of `n` synthetic products in `out`."""
    rng = np.random.default_rng(seed)
    text = Words(rng)
    items, ins = out / "items_shuffle.json", out / "items_ins_v2.json"
    with open(items, "w", encoding="utf-8") as fi, open(ins, "w", encoding="utf-8") as fa:
        fi.write("[")
        fa.write("{")
        for i in range(n):
            asin = f"B{i:09d}"
            if i % 2000 == 1999:  # what the loader skips: "nan", an asin seen before
                asin = "nan"
            elif i % 2000 == 999:
                asin = f"B{i - 1:09d}"
            kind = rng.random()
            pricing = (
                f"${rng.uniform(3, 300):.2f}"
                if kind < 0.87
                else f"${rng.uniform(3, 150):.2f} - ${rng.uniform(150, 400):.2f}"
                if kind < 0.97
                else ""
            )
            options = {
                GROUPS[g].title(): [
                    {"value": text(int(rng.integers(1, 3))).title(), "image": None}
                    for _ in range(int(rng.integers(2, 7)))
                ]
                for g in rng.choice(len(GROUPS), int(rng.integers(0, 4)), replace=False)
            }
            item = {
                "asin": asin,
                "name": text(10).title(),
                "full_description": text(100) if rng.random() > 0.01 else None,
                "small_description": [text(14) for _ in range(5)],
                "pricing": pricing,
                "customization_options": options or None,
                "category": CATEGORIES[i % 5],
                "query": text(2),
                "product_category": " › ".join(text(2).title() for _ in range(3)),
                "images": [f"https://m.media-amazon.com/images/I/{asin}{k}.jpg" for k in range(4)],
                "average_rating": round(float(rng.uniform(1, 5)), 1),
            }
            entry = {"attributes": [text(2) for _ in range(int(rng.integers(0, 6)))]}
            if rng.random() < 0.01:
                entry["instruction"] = f"i want {text(8)}"
                entry["instruction_attributes"] = entry["attributes"][:2] or [text(2)]
            sep = "," if i else ""
            fi.write(sep + "\n" + json.dumps(item, ensure_ascii=False))
            fa.write(f'{sep}\n"{asin}": ' + json.dumps(entry))
        fi.write("\n]\n")
        fa.write("\n}\n")
    return items, ins


def measured(cmd: list[str], max_rss: int) -> dict:
    """Run `cmd`; its wall time, peak RSS (the kernel's, for this child) and last stdout line.
    Killed, and reported so, once its RSS passes `max_rss` bytes."""
    t = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    killed = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        rss = _rss(proc.pid)
        if rss > max_rss and not killed:
            proc.send_signal(signal.SIGKILL)
            killed = True
        time.sleep(0.2)
    out = proc.stdout.read().strip().splitlines()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall_s": round(time.perf_counter() - t, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),  # KiB on Linux
        "rc": proc.returncode,
        "killed_for_rss": killed,
        "out": json.loads(out[-1]) if out and proc.returncode == 0 else None,
    }


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def main() -> None:
    from mem1_core.models.compute import cpu_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--products", type=int, default=1_180_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/webshop-scale"))
    ap.add_argument("--max-rss-gb", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true", help="keep the files")
    args = ap.parse_args()
    max_rss = int(args.max_rss_gb * 2**30)
    args.dir.mkdir(parents=True, exist_ok=True)
    shop = args.dir / "shop"
    try:
        t = time.perf_counter()
        items, ins = write_files(args.dir, args.products)
        row = {"stage": "write files", "products": args.products, "cpu": cpu_info().model,
               "seconds": round(time.perf_counter() - t, 1), "items_mib": _mib(items),
               "instructions_mib": _mib(ins)}  # fmt: skip
        print(json.dumps(row), flush=True)
        convert = [sys.executable, "-m", "mem1_core.cli.main", "data", "webshop", "--items",
                   str(items), "--instructions", str(ins), "--out", str(shop)]  # fmt: skip
        row = {"stage": "convert", **measured(convert, max_rss)}
        row["products_mib"] = (
            _mib(shop / "products.jsonl") if (shop / "products.jsonl").exists() else None
        )
        print(json.dumps(row), flush=True)
        if row["rc"] != 0:
            return
        for stage in ("search index: build", "search index: load"):
            row = {"stage": stage, **measured([sys.executable, "-c", SEARCH, str(shop)], max_rss)}
            row["index_mib"] = _mib_dir(shop / "search")
            print(json.dumps(row), flush=True)
            if row["rc"] != 0:
                return
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


def _mib(path: Path) -> float:
    return round(path.stat().st_size / 2**20, 1)


def _mib_dir(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.glob("*")) / 2**20, 1) if path.is_dir() else 0


if __name__ == "__main__":
    main()
