"""The embedded world: determinism, the entity split, and that answers are in the corpus."""

from __future__ import annotations

import dataclasses
import json
import re

import pyarrow.parquet as pq
import pytest

from mem1_core.config import WorldConfig
from mem1_core.data.world import generate_world, write_world


def test_same_seed_gives_identical_bytes(tmp_path, small_world_config):
    a, b = tmp_path / "a", tmp_path / "b"
    write_world(generate_world(small_world_config), a)
    write_world(generate_world(small_world_config), b)
    for name in ("corpus.parquet", "questions.parquet"):
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_other_seed_gives_another_world(small_world, small_world_config):
    other = generate_world(dataclasses.replace(small_world_config, seed=1))
    assert other.corpus["title"].to_pylist() != small_world.corpus["title"].to_pylist()


def test_files_have_the_documented_columns(small_world_dir):
    corpus = pq.read_table(small_world_dir / "corpus.parquet")
    questions = pq.read_table(small_world_dir / "questions.parquet")
    assert corpus.column_names == ["doc_id", "title", "contents"]
    assert {"id", "question", "golden_answers", "supporting_titles", "hops", "split"} <= set(
        questions.column_names
    )
    assert len(set(corpus["doc_id"].to_pylist())) == corpus.num_rows
    assert len(set(corpus["title"].to_pylist())) == corpus.num_rows  # titles are unique


def _mentions(question: str, titles: list[str]) -> set[str]:
    return {t for t in titles if re.search(rf"(?<![\w]){re.escape(t)}(?![\w])", question)}


def test_test_questions_mention_no_entity_of_a_training_question(small_world):
    titles = small_world.corpus["title"].to_pylist()
    q = small_world.questions.to_pydict()
    train_mentions: set[str] = set()
    test_mentions: set[str] = set()
    for text, split in zip(q["question"], q["split"], strict=True):
        m = _mentions(text, titles)
        assert m, f"question mentions no entity: {text}"
        (train_mentions if split == "train" else test_mentions).update(m)
    assert test_mentions and train_mentions
    assert not (train_mentions & test_mentions)


def test_supporting_documents_state_each_step_of_the_plan(small_world):
    docs = dict(
        zip(
            small_world.corpus["title"].to_pylist(),
            small_world.corpus["contents"].to_pylist(),
            strict=True,
        )
    )
    q = small_world.questions.to_pydict()
    for i in range(len(q["id"])):
        plan = json.loads(q["plan"][i])
        assert len(plan) == q["hops"][i]
        assert set(q["supporting_titles"][i]) == {s["title"] for s in plan}
        for step in plan:
            assert step["answer"] in docs[step["title"]], (q["question"][i], step)
        if q["type"][i] != "comparison":  # the last hop's answer is the gold answer
            assert plan[-1]["answer"] == q["golden_answers"][i][0]


def test_comparison_answers_follow_the_years(small_world):
    q = small_world.questions.to_pydict()
    n = 0
    for i in range(len(q["id"])):
        if q["type"][i] != "comparison":
            continue
        n += 1
        (a, b) = json.loads(q["plan"][i])
        first = a if int(a["answer"]) < int(b["answer"]) else b
        assert q["golden_answers"][i] == [first["title"]]
    assert n > 0


def test_question_types_and_near_duplicates_exist(small_world):
    types = set(small_world.questions["type"].to_pylist())
    assert types == {"single", "bridge", "comparison"}
    hops = set(small_world.questions["hops"].to_pylist())
    assert hops == {1, 2}
    # distractors: some pairs of titles differ in exactly one short stretch
    titles = [t for t in small_world.corpus["title"].to_pylist() if " " in t]
    surnames = [t.split()[-1] for t in titles]
    assert len(set(surnames)) < len(surnames)


@pytest.mark.parametrize(
    "bad", [{"n_people": 0}, {"test_fraction": 1.0}, {"n_cities": 2, "n_countries": 5}]
)
def test_bad_world_config_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        WorldConfig(**bad)
