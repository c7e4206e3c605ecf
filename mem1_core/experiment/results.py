"""Results that live with the code: an experiment's committed records and the figures the docs
state from them.

`results/<experiment>/<part>/` holds each finished part's records (mem1_core.experiment.records:
a few hundred kB, no weights). `mem1 experiment report results/<experiment> --update-docs`
merges them and rewrites, in README.md and docs/results.md, every block between
`<!-- results:<experiment> -->` and `<!-- /results:<experiment> -->` with `results_markdown` of
the merged headline, and its EM-against-N plot as docs/<experiment>_scaling.png. A test
recomputes each block from the records and checks the pages against it, so every figure a page
states for the experiment is the records' (tests/test_results.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mem1_core.experiment.headline import POOLED
from mem1_core.experiment.plan import ROOT
from mem1_core.experiment.records import MANIFEST

RESULTS_DIR = ROOT / "results"
DOC_PAGES = (ROOT / "README.md", ROOT / "docs" / "results.md")
"""The pages whose `<!-- results:NAME -->` blocks are generated from the records."""


def expand_sources(sources: list[str]) -> list[str]:
    """Each source as it is, except a local directory that is neither records nor a run but
    holds records in its subdirectories (`results/horizon`): those, in name order."""
    out = []
    for s in sources:
        p = Path(s)
        if "://" in s or (p / MANIFEST).is_file() or (p / "experiment.json").is_file():
            out.append(s)
            continue
        found = (
            sorted(str(c) for c in p.iterdir() if (c / MANIFEST).is_file()) if p.is_dir() else []
        )
        out += found or [s]
    return out


KINDS = ("", ":claims")
"""A page's block for an experiment: `<!-- results:NAME -->` (results_markdown: everything) or
`<!-- results:NAME:claims -->` (claims_block: the claims table alone, for the README)."""


def _block_re(name: str, kind: str) -> re.Pattern:
    tag = re.escape(name + kind)
    return re.compile(rf"(<!-- results:{tag} -->\n)(.*?)(<!-- /results:{tag} -->)", re.S)


def render(h: dict[str, Any], kind: str) -> str:
    return claims_block(h) if kind == ":claims" else results_markdown(h)


def doc_blocks(name: str, pages=DOC_PAGES) -> dict[tuple[Path, str], str]:
    """(page, kind) -> the text of its generated block of that kind for experiment `name`."""
    out = {}
    for page in pages:
        text = page.read_text() if page.is_file() else ""
        for kind in KINDS:
            if m := _block_re(name, kind).search(text):
                out[(page, kind)] = m.group(2)
    return out


def update_docs(name: str, h: dict[str, Any], scaling: str | None, pages=DOC_PAGES) -> list[Path]:
    """Rewrite each page's blocks for `name` from `h`; copy the scaling plot to
    docs/<name>_scaling.png -> the pages rewritten."""
    import shutil

    done = []
    for page, kind in doc_blocks(name, pages):
        text = render(h, kind)
        page.write_text(_block_re(name, kind).sub(lambda m, t=text: m.group(1) + t + m.group(3),
                                                  page.read_text()))  # fmt: skip
        done.append(page)
    if scaling and Path(scaling).is_file():
        shutil.copyfile(scaling, ROOT / "docs" / f"{name}_scaling.png")
    return sorted(set(done))


def claims_block(h: dict[str, Any]) -> str:
    """The claims table with its bar, alone."""
    from mem1_core.experiment.report import claims_heading, claims_markdown

    status = f"**Not finished:** {'; '.join(h['pending'])}.\n\n" if h.get("pending") else ""
    return f"{status}Claims ({claims_heading(h)}):\n\n{claims_markdown(h).rstrip()}\n"


def _f(v: float | None, se: float | None = None, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" + ("" if se is None else f" ± {se:.{digits}f}")


def results_markdown(h: dict[str, Any]) -> str:
    """The figures a page states for an experiment: its claims (Holm-corrected), its measured
    effects, EM ± SE and peak tokens against N pooled over seeds on each world, the behaviour
    rows pooled on the held-out worlds, and each part's run, commit, minutes and CPU."""
    from mem1_core.experiment.report import claims_heading, claims_markdown, parts_markdown

    out = []
    if h.get("pending"):
        out += [f"**Not finished:** {'; '.join(h['pending'])}.", ""]
    out += [f"Claims ({claims_heading(h)}):", "", claims_markdown(h).rstrip(), ""]
    if h.get("effects"):
        out += ["Effects (measured, not claimed; paired against the paper's arm, per seed and "
                "pooled):", "", claims_markdown(h, "effects").rstrip(), ""]  # fmt: skip
    for w, world in h["worlds"].items():
        if not world["cells"]:
            continue
        ns = world["objectives"]
        tag = "the training world's test split" if world["own"] else "held out"
        out += [f"World {w} ({tag}): EM fraction ± SE (mean peak tokens), pooled over seeds.", "",
                "| agent | seeds | " + " | ".join(f"N={n}" for n in ns) + " |",
                "|---" * (len(ns) + 2) + "|"]  # fmt: skip
        by = {(c["agent"], c["N"]): c for c in world["cells"] if c["seed"] == POOLED}
        for agent, seeds in world["seeds"].items():
            s = ", ".join(str(x) for x in seeds if x is not None) or "–"
            cols = [f"{_f(c['em_frac'], c['em_frac_se'])} ({c['peak_tokens']:,.0f})"
                    if (c := by.get((agent, n))) else "" for n in ns]  # fmt: skip
            out.append(f"| {agent} | {s} | " + " | ".join(cols) + " |")
        out.append("")
        if world["own"]:
            continue
        out += [f"World {w}: behaviour per task, pooled over seeds (answered of N, distinct "
                "queries, turns, found, retention).", "",
                "| agent | N | answered | distinct queries | turns | found | retention |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for agent in world["seeds"]:
            for n in ns:
                b = (by.get((agent, n)) or {}).get("behaviour")
                if not b:
                    continue
                out.append(
                    f"| {agent} | {n} | {_f(b['answered'], digits=2)} | "
                    f"{_f(b['distinct_queries'], digits=1)} | {_f(b['turns'], digits=1)} | "
                    f"{_f(b['found'], b.get('found_se'), 2)} | "
                    f"{_f(b['retention'], b.get('retention_se'), 2)} |"
                )
        out.append("")
    out += [parts_markdown(h).replace("## Parts\n\n", "Parts (each its own run):\n\n").rstrip(), ""]
    return "\n".join(out)
