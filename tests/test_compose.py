"""Composition into N-objective tasks, the real row formats, and bad input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mem1_core.cli.main import main
from mem1_core.data.compose import compose
from mem1_core.data.prompts import split_answers, task_prompt
from mem1_core.data.qa_data import load_hotpotqa, load_nq, world_questions

HOTPOT_ROWS = [
    {
        "id": f"h{i}",
        "question": f"Hotpot question {i}?",
        "answer": f"ans{i}",
        "supporting_facts": {"title": [f"T{i}", f"U{i}"], "sent_id": [0, 1]},
        "context": {"title": [f"T{i}", f"U{i}"], "sentences": [[f"T{i} is a.", " b."], ["U c."]]},
        "type": "bridge",
        "level": "hard",
    }
    for i in range(5)
]
NQ_ROWS = [
    {"id": f"n{i}", "question": f"nq question {i}", "golden_answers": [f"a{i}", f"b{i}"]}
    for i in range(7)
]


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _table(source: str, n: int, split: str | None = None) -> pa.Table:
    rows = [
        {
            "id": f"{source}{i}",
            "source": source,
            "question": f"{source} q{i}?",
            "golden_answers": [f"{source}-a{i}"],
            "supporting_titles": [],
            "hops": 1,
            "plan": None,
            "split": split,
        }
        for i in range(n)
    ]
    from mem1_core.data.qa_data import QUESTIONS_SCHEMA

    return pa.Table.from_pylist(rows, schema=QUESTIONS_SCHEMA)


def test_per_source_groups_consecutive_questions_of_one_source():
    table = pa.concat_tables([_table("a", 7), _table("b", 5)])
    tasks, summary = compose(table, 3, "per_source")
    rows = tasks.to_pylist()
    assert [r["question_ids"] for r in rows] == [
        ["a0", "a1", "a2"],
        ["b0", "b1", "b2"],  # the sources in turn: a cap keeps the mix
        ["a3", "a4", "a5"],
    ]
    assert summary.leftover_dropped == 1 + 2 and summary.tasks == 3
    assert all(len(set(r["sources"])) == 1 for r in rows)
    capped, _ = compose(table, 1, "per_source", max_tasks=4)
    assert [r["question_ids"] for r in capped.to_pylist()] == [["a0"], ["b0"], ["a1"], ["b1"]]


def test_mixed_is_a_seeded_shuffle_across_sources():
    table = pa.concat_tables([_table("a", 8), _table("b", 8)])
    t1, _ = compose(table, 4, "mixed", seed=1)
    t2, _ = compose(table, 4, "mixed", seed=1)
    t3, _ = compose(table, 4, "mixed", seed=2)
    assert t1.equals(t2) and not t1.equals(t3)
    ids = [i for r in t1.to_pylist() for i in r["question_ids"]]
    assert sorted(ids) == sorted([f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)])
    assert any(len(set(r["sources"])) == 2 for r in t1.to_pylist())


def test_answers_and_questions_stay_aligned_in_order(small_world_dir):
    loaded = world_questions(pq.read_table(small_world_dir / "questions.parquet"))
    by_id = {r["id"]: r for r in loaded.table.to_pylist()}
    tasks, _ = compose(loaded.table, 4, "per_source", split="test")
    for row in tasks.to_pylist():
        assert row["n_objectives"] == 4 and row["split"] == "test"
        for qid, q, ans in zip(
            row["question_ids"], row["questions"], row["golden_answers"], strict=True
        ):
            assert by_id[qid]["question"] == q and by_id[qid]["golden_answers"] == ans
            assert by_id[qid]["split"] == "test"
        # the prompt lists the questions in order, numbered
        positions = [
            row["prompt"].index(f"Question {i}: {q}") for i, q in enumerate(row["questions"], 1)
        ]
        assert positions == sorted(positions)


def test_prompt_explains_the_tags_and_answer_format():
    p = task_prompt(["Who?", "When?"])
    for tag in ("<IS>", "<query>", "<info>", "<answer>"):
        assert tag in p
    assert "Question 1: Who?" in p and "Question 2: When?" in p
    assert split_answers("x ; y;z") == ["x", "y", "z"]


def test_hotpotqa_row_format(tmp_path):
    loaded = load_hotpotqa(str(_jsonl(tmp_path / "h.jsonl", HOTPOT_ROWS)))
    rows = loaded.table.to_pylist()
    assert [r["id"] for r in rows] == [f"h{i}" for i in range(5)]
    assert rows[2]["golden_answers"] == ["ans2"] and rows[2]["supporting_titles"] == ["T2", "U2"]
    assert {r["source"] for r in rows} == {"hotpotqa"}


def test_hotpotqa_parquet_and_json_array(tmp_path):
    pq.write_table(pa.Table.from_pylist(HOTPOT_ROWS), tmp_path / "h.parquet")
    (tmp_path / "h.json").write_text(json.dumps(HOTPOT_ROWS))
    a = load_hotpotqa(str(tmp_path / "h.parquet")).table
    b = load_hotpotqa(str(tmp_path / "h.json")).table
    assert a.equals(b) and a.num_rows == 5


def test_nq_flashrag_format_keeps_all_aliases(tmp_path):
    loaded = load_nq(str(_jsonl(tmp_path / "nq.jsonl", NQ_ROWS)))
    assert loaded.table.to_pylist()[3]["golden_answers"] == ["a3", "b3"]


def test_hotpotqa_context_exports_as_corpus(tmp_path):
    from mem1_core.data.qa_data import hotpotqa_corpus

    corpus = hotpotqa_corpus(str(_jsonl(tmp_path / "h.jsonl", HOTPOT_ROWS)))
    assert corpus.column_names == ["doc_id", "title", "contents"]
    assert corpus.num_rows == 10
    assert corpus.to_pylist()[0] == {
        "doc_id": "hp0000000",
        "title": "T0",
        "contents": "T0 is a. b.",
    }


# HotpotQA's original files (hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json): `_id`,
# and lists that mix types, which Arrow (datasets.Dataset.from_list) could not type.
ORIGINAL_ROWS = [
    {
        "_id": f"5a7a{i:020x}",
        "question": f"Who built tower {i}?",
        "answer": f"Builder {i}",
        "supporting_facts": [[f"Tower {i}", 0], [f"Builder {i}", 1]],
        "context": [
            [f"Tower {i}", [f"Tower {i} stands in Nisk.", f" It was built by Builder {i}."]],
            [f"Builder {i}", [f"Builder {i} was a mason.", " He lived in Nisk."]],
        ],
        "type": "bridge",
        "level": "easy",
    }
    for i in range(3)
]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_hotpotqa_original_files_load_and_export(tmp_path, suffix):
    from mem1_core.data.qa_data import hotpotqa_corpus

    path = tmp_path / f"hotpot{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(ORIGINAL_ROWS))
    else:
        _jsonl(path, ORIGINAL_ROWS)
    rows = load_hotpotqa(str(path)).table.to_pylist()
    assert [r["id"] for r in rows] == [r["_id"] for r in ORIGINAL_ROWS]
    assert rows[1]["supporting_titles"] == ["Tower 1", "Builder 1"]
    assert rows[1]["golden_answers"] == ["Builder 1"]
    corpus = hotpotqa_corpus([str(path), str(_jsonl(tmp_path / "more.jsonl", HOTPOT_ROWS))])
    titles = corpus["title"].to_pylist()
    assert titles[:2] == ["Tower 0", "Builder 0"] and len(titles) == 6 + 10
    assert corpus["contents"][0].as_py() == "Tower 0 stands in Nisk. It was built by Builder 0."


def test_a_hub_snapshot_directory_is_read_by_config_and_split(tmp_path, monkeypatch):
    """A dataset repository downloaded for a cluster without hub access (`hf download
    hotpotqa/hotpot_qa --repo-type dataset --local-dir DIR`) reads as the hub's."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    snap = tmp_path / "hotpot_qa"
    (snap / "distractor").mkdir(parents=True)
    (snap / "README.md").write_text(
        "---\nconfigs:\n- config_name: distractor\n  data_files:\n"
        "  - split: train\n    path: distractor/train-*\n"
        "  - split: validation\n    path: distractor/validation-*\n---\n"
    )
    for split, rows in (("train", HOTPOT_ROWS[:3]), ("validation", HOTPOT_ROWS[3:])):
        pq.write_table(pa.Table.from_pylist(rows), snap / "distractor" / f"{split}-0.parquet")
    train = load_hotpotqa(str(snap), "distractor", "train").table
    test = load_hotpotqa(str(snap), "distractor", "validation").table
    assert train["id"].to_pylist() == ["h0", "h1", "h2"] and test["id"].to_pylist() == ["h3", "h4"]


def test_a_question_file_needs_a_held_out_file(tmp_path):
    from mem1_core.config import DataConfig

    with pytest.raises(ValueError, match="set data.nq_test"):
        DataConfig(source="hotpotqa+nq", nq="/data/nq/train.jsonl")
    DataConfig(source="hotpotqa", nq="/data/nq/train.jsonl")  # NQ unused: no check
    cfg = DataConfig(source="nq", nq="/data/nq/train.jsonl", nq_test="/data/nq/test.jsonl")
    assert cfg.question_source("nq", "train") == ("/data/nq/train.jsonl", "train")
    assert cfg.question_source("nq", "test") == ("/data/nq/test.jsonl", "validation")
    hub = DataConfig(source="hotpotqa+nq")  # hub names (or snapshots): their splits
    assert hub.question_source("hotpotqa", "test") == ("hotpotqa/hotpot_qa", "validation")


def test_cli_compose_nq_writes_the_schema(tmp_path, capsys):
    src = _jsonl(tmp_path / "nq.jsonl", NQ_ROWS)
    out = tmp_path / "t.parquet"
    assert (
        main(["compose", "--input", str(src), "--format", "nq", "-n", "2", "--out", str(out)]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["tasks"] == 3 and report["leftover_dropped"] == 1
    t = pq.read_table(out)
    assert t.column_names[:3] == ["task_id", "sources", "n_objectives"]
    assert b"generator" in t.schema.metadata
    assert t.to_pylist()[1]["golden_answers"] == [["a2", "b2"], ["a3", "b3"]]


# ---- bad input --------------------------------------------------------------------------


def test_malformed_json_line_is_reported_with_its_number(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(NQ_ROWS[0]) + "\n" + json.dumps(NQ_ROWS[1]) + "\n{oops\n")
    out = tmp_path / "t.parquet"
    assert (
        main(["compose", "--input", str(src), "--format", "nq", "-n", "1", "--out", str(out)]) == 2
    )
    assert "line 3" in capsys.readouterr().err
    assert not out.exists()


def test_rows_without_question_or_answer_are_skipped_and_counted(tmp_path, capsys):
    rows = NQ_ROWS[:4] + [
        {"id": "e", "question": " ", "golden_answers": ["x"]},
        {"id": "f", "question": "q?", "golden_answers": []},
        {"id": "g", "question": "q?"},
    ]
    loaded = load_nq(str(_jsonl(tmp_path / "nq.jsonl", rows)))
    assert loaded.table.num_rows == 4
    assert loaded.skipped == {"empty_question": 1, "no_answer": 2}


@pytest.mark.parametrize(
    ("rows", "n", "message"),
    [([], 1, "empty"), (NQ_ROWS[:2], 3, "fewer than objectives"), (NQ_ROWS, 0, ">= 1")],
)
def test_clear_errors_and_nothing_written(tmp_path, capsys, rows, n, message):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "t.parquet"
    rc = main(["compose", "--input", str(src), "--format", "nq", "-n", str(n), "--out", str(out)])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.glob(".t.parquet*"))


def test_a_failed_write_leaves_the_old_file_intact(tmp_path):
    from mem1_core.runs import atomic

    target = tmp_path / "x.parquet"
    atomic.write_parquet(_table("a", 2), target)
    before = target.read_bytes()
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        tmp.write_bytes(b"partial")
        raise RuntimeError("killed half-way")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]


def test_cli_world_then_compose_every_n(tmp_path, capsys):
    assert main(["world", "--profile", "smoke", "--seed", "3", "--out", str(tmp_path / "w")]) == 0
    for n in (1, 2, 4, 8, 16):
        out = tmp_path / f"t{n}.parquet"
        assert (
            main(
                [
                    "compose",
                    "--world",
                    str(tmp_path / "w"),
                    "-n",
                    str(n),
                    "--split",
                    "train",
                    "--mode",
                    "mixed",
                    "--seed",
                    "1",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        t = pq.read_table(out)
        assert set(t["n_objectives"].to_pylist()) == {n}
        assert all(len(a) == n for a in t["golden_answers"].to_pylist())
