"""The results the docs state are the committed records' (results/<experiment>/<part>/).

For every experiment with records under results/, the records are merged and the headline
recomputed from them; every generated block of that experiment in README.md and
docs/results.md must be the block the records give, so no figure on those pages can drift from
its records. Each part's records stay small."""

from __future__ import annotations

from pathlib import Path

import pytest

from mem1_core.experiment.merge import headline_of, merge_records
from mem1_core.experiment.records import MANIFEST, read_records
from mem1_core.experiment.results import (
    DOC_PAGES,
    RESULTS_DIR,
    doc_blocks,
    expand_sources,
    render,
    results_markdown,
    update_docs,
)

EXPERIMENTS = sorted(p for p in RESULTS_DIR.iterdir() if p.is_dir()) if RESULTS_DIR.is_dir() else []
RECORDED = [p for p in EXPERIMENTS if any((c / MANIFEST).is_file() for c in p.iterdir())]


def test_the_horizon_experiment_has_committed_records():
    assert RESULTS_DIR / "horizon" in RECORDED


@pytest.mark.parametrize("exp", RECORDED, ids=[p.name for p in RECORDED])
def test_every_figure_the_docs_state_is_the_records(exp: Path):
    parts = expand_sources([str(exp)])
    h = headline_of(merge_records([read_records(p) for p in parts]))
    blocks = doc_blocks(h["experiment"])
    assert blocks, f"no page has a generated block for {exp.name} (<!-- results:{exp.name} -->)"
    for (page, kind), text in blocks.items():
        assert text == render(h, kind), (
            f"{page}: the {exp.name} block differs from its records; run "
            f"`mem1 experiment report results/{exp.name} --out /tmp/{exp.name} --update-docs`"
        )
    for p in parts:
        size = sum(f.stat().st_size for f in Path(p).iterdir())
        assert size <= 1_000_000, f"{p}: {size} bytes of records (more than 1 MB)"


def test_a_block_is_rewritten_in_place_and_read_back(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- results:demo -->\nold figures\n<!-- /results:demo -->\nafter\n")
    h = {"claims": [], "effects": [], "worlds": {}, "parts": [],
         "bars": {"se": 2.0, "peak_ratio": 0.3, "alpha": 0.023, "tests": 0}}  # fmt: skip
    assert update_docs("demo", h, None, pages=[page]) == [page]
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("<!-- /results:demo -->\nafter\n")
    assert doc_blocks("demo", [page]) == {(page, ""): results_markdown(h)}
    assert all(p.is_file() for p in DOC_PAGES)
