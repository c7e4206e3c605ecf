"""Corpus reading: Parquet and Search-R1 JSONL into one schema, problems reported,
fingerprints that follow the content and not the file format."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mem1_core.retrieval import corpus_fingerprint, load_corpus, read_corpus
from mem1_core.retrieval.corpus import format_contents, parse_contents

DOCS = [
    ("d1", "Kalomir Vesh", "Kalomir Vesh was a painter born in Tirvane in 1847."),
    ("d2", "Tirvane", "Tirvane is a city in Osland.\nIt was founded in 1602."),
    ("d3", 'The "Quiet" Harbor', "The Quiet Harbor is a 1901 novel written by Kalomir Vesh."),
]


def write_parquet(path, rows):
    pd.DataFrame(rows, columns=["doc_id", "title", "contents"]).to_parquet(path)
    return path


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for doc_id, title, body in rows:
            f.write(json.dumps({"id": doc_id, "contents": format_contents(title, body)}) + "\n")
    return path


def test_contents_roundtrip_keeps_newlines_and_quotes():
    for _, title, body in DOCS:
        assert parse_contents(format_contents(title, body)) == (title, body)
    assert parse_contents("no title line") == ("", "no title line")
    # Search-R1's wiki-18 form, written out literally.
    assert parse_contents('"Aaron"\nAaron is a prophet.') == ("Aaron", "Aaron is a prophet.")


def test_parquet_and_jsonl_read_alike_with_one_fingerprint(tmp_path):
    a = read_corpus(write_parquet(tmp_path / "c.parquet", DOCS))
    b = read_corpus(write_jsonl(tmp_path / "c.jsonl", DOCS))
    assert list(a.columns) == ["doc_id", "title", "contents", "passage"]
    pd.testing.assert_frame_equal(a, b)
    assert corpus_fingerprint(a) == corpus_fingerprint(b)
    # Built passages are not hashed: the fingerprints from before `passage` existed stand.
    assert corpus_fingerprint(a) == corpus_fingerprint(a.drop(columns="passage"))


# Search-R1 `contents` that are not `"Title"\ntext`: each must be served as it is.
ODD_CONTENTS = [
    "Kalomir Vesh\nKalomir Vesh was a painter.",  # a title without quotes
    "A one-line passage with no title line.",  # no newline
    '  "Tirvane"  \nTirvane is a city. ',  # surrounding spaces
    '"Osland"\r\nOsland is a country.\r\nIts capital is Tirvane.',  # CRLF
    '"The "Quiet" Harbor"\n\nA novel.\n',  # inner quotes, blank line, trailing newline
]


def test_jsonl_contents_are_kept_verbatim_and_fingerprinted(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{"id": f"o{i}", "contents": c} for i, c in enumerate(ODD_CONTENTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    df = read_corpus(path)
    assert df["passage"].tolist() == ODD_CONTENTS
    assert [tuple(x) for x in df[["title", "contents"]].values] == [
        parse_contents(c) for c in ODD_CONTENTS
    ]
    # Title and body alone lose the form, so the passage is part of the fingerprint (a
    # table without it hashes as if its passages were built from title and body).
    assert corpus_fingerprint(df) != corpus_fingerprint(df.drop(columns="passage"))


def test_jsonl_with_title_and_text_keys(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": 7, "title": "T", "text": "body"}) + "\n\n")
    df = read_corpus(path)
    assert df.to_dict("records") == [
        {"doc_id": "7", "title": "T", "contents": "body", "passage": '"T"\nbody'}
    ]


def test_fingerprint_changes_with_any_field_and_with_order():
    base = pd.DataFrame(DOCS, columns=["doc_id", "title", "contents"])
    fp = corpus_fingerprint(base)
    for col in ("doc_id", "title", "contents"):
        changed = base.copy()
        changed.loc[1, col] = changed.loc[1, col] + "x"
        assert corpus_fingerprint(changed) != fp
    assert corpus_fingerprint(base.iloc[::-1].reset_index(drop=True)) != fp
    # Length prefixes: moving a character across a field boundary changes the hash.
    moved = base.copy()
    moved.loc[0, "title"], moved.loc[0, "contents"] = "Kalomir Ves", "h" + base.loc[0, "contents"]
    assert corpus_fingerprint(moved) != fp


def test_duplicates_and_empty_documents_are_reported_and_dropped(tmp_path, caplog):
    rows = DOCS + [("d2", "Other", "A second d2."), ("d4", "Blank", "  \n ")]
    path = write_parquet(tmp_path / "c.parquet", rows)
    df, report = load_corpus(path)
    assert list(df["doc_id"]) == ["d1", "d2", "d3"]
    assert df.loc[1, "title"] == "Tirvane"  # the first row of a duplicated id is kept
    assert report.duplicate_ids == ("d2",) and report.empty_ids == ("d4",)
    assert report.to_dict() == {"rows": 5, "duplicate_ids": 1, "empty_documents": 1, "dropped": 2}
    assert "1 duplicate ids ('d2')" in caplog.text and "1 empty documents ('d4')" in caplog.text
    with pytest.raises(ValueError, match="duplicate ids"):
        load_corpus(path, on_problem="error")


def test_bad_inputs_raise_user_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_corpus(tmp_path / "missing.parquet")
    (tmp_path / "c.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown corpus format"):
        read_corpus(tmp_path / "c.csv")
    pd.DataFrame({"doc_id": ["a"], "text": ["x"]}).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="lacks columns"):
        read_corpus(tmp_path / "bad.parquet")
    (tmp_path / "bad.jsonl").write_text('{"contents": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_corpus(tmp_path / "bad.jsonl")
    write_parquet(tmp_path / "empty.parquet", [("a", "A", " ")])
    with pytest.raises(ValueError, match="no usable documents"):
        read_corpus(tmp_path / "empty.parquet")
