"""`mem1 index` and `mem1 search` end to end through the CLI entry point."""

from __future__ import annotations

import json

import pandas as pd

from mem1_core.cli.main import main
from mem1_core.retrieval import read_manifest
from mem1_core.retrieval.corpus import format_contents

DOCS = [
    ("d0", "Gorde To", "Gorde To was a painter born in Tirvane in 1847."),
    ("d1", "Tirvane", "Tirvane is a city in Osland."),
    ("d2", "Osland", "Osland is a country whose capital is Tirvane."),
]


def test_index_then_search_prints_json_lines(tmp_path, capsys):
    corpus = tmp_path / "wiki.jsonl"  # Search-R1 JSON Lines in, like the paper's corpus
    corpus.write_text(
        "".join(json.dumps({"id": i, "contents": format_contents(t, c)}) + "\n" for i, t, c in DOCS)
    )
    out = tmp_path / "idx"
    assert main(["index", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["documents"] == 3 and summary["size_bytes"] > 0
    assert read_manifest(out).kind == "bm25"

    rc = main(["search", "--index", str(out), "--k", "2", "Where was Gorde To born?", "Osland"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query"] for line in lines] == ["Where was Gorde To born?", "Osland"]
    first = lines[0]["hits"][0]
    assert first == {
        "doc_id": "d0",
        "title": "Gorde To",
        "text": DOCS[0][2],
        "score": first["score"],
        "passage": format_contents("Gorde To", DOCS[0][2]),  # the JSONL's contents
    }
    assert len(lines[1]["hits"]) <= 2


def test_index_options_and_user_errors(tmp_path, capsys):
    corpus = tmp_path / "c.parquet"
    pd.DataFrame(
        DOCS + [("d1", "Dup", "again")], columns=["doc_id", "title", "contents"]
    ).to_parquet(corpus)
    out = tmp_path / "idx"
    args = ["index", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out)]
    assert main([*args, "--stemmer", "english", "--stopwords", "none"]) == 0
    m = read_manifest(out)
    assert (m.options["stemmer"], m.options["stopwords"]) == ("english", None)
    assert m.corpus_report["duplicate_ids"] == 1
    assert main([*args, "--strict"]) == 2  # duplicates refused
    assert "duplicate ids" in capsys.readouterr().err
    assert main([*args, "--model", "x"]) == 2  # a dense option on a bm25 index
    assert main(["index", "--corpus", str(corpus), "--kind", "dense", "--out", str(out)]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["search", "--index", str(tmp_path / "nope"), "q"]) == 2
