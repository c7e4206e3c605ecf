"""`mem1 data paper`: small files in the downloaded formats (Search-R1's wiki-18 JSON Lines,
HotpotQA's original JSON, FlashRAG's NQ JSON Lines) become an index, the tasks a run of the
`paper` profile composes, and a config file that a run reads. BM25 here, and the dense path
with a tiny encoder built from config (the real e5 needs the hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from mem1_core.cli.main import main
from mem1_core.config import load_config
from mem1_core.domains.registry import domain_of
from mem1_core.qa.tasks import ensure_tasks
from mem1_core.retrieval import load_index
from mem1_core.retrieval.corpus import format_contents
from mem1_core.runs.layout import RunPaths

PEOPLE = ["Arla Venn", "Tobin Marsh", "Iselde Crane", "Oru Pask", "Meret Dole", "Cass Ilvane"]
PLACES = ["Harrow Gate", "Lenmark Hall", "Sable Quay", "Ivel Tower", "Corran Docks", "Brill Yard"]


def hotpot(i: int) -> dict:
    place, person, year = PLACES[i], PEOPLE[i], str(1800 + 7 * i)
    return {
        "_id": f"hp{i:04d}",
        "question": f"In what year was the founder of {place} born?",
        "answer": year,
        "supporting_facts": [[place, 0], [person, 0]],
        "context": [[place, [f"{place} was founded by {person}."]], [person, [f"Born {year}."]]],
    }


def nq(i: int) -> dict:
    return {
        "id": f"nq{i}",
        "question": f"who built {PLACES[i].lower()}",
        "golden_answers": [PEOPLE[i]],
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("downloads")
    wiki = [
        {"id": str(i), "contents": format_contents(title, text)}
        for i, (title, text) in enumerate(
            [
                (p, f"{p} was founded by {PEOPLE[i]} in a harbour town.")
                for i, p in enumerate(PLACES)
            ]
            + [
                (p, f"{p} was born in {1800 + 7 * i} and lived by the sea.")
                for i, p in enumerate(PEOPLE)
            ]
        )
    ]
    (d / "wiki-18.jsonl").write_text("".join(json.dumps(r) + "\n" for r in wiki))
    (d / "hotpot_train_v1.1.json").write_text(json.dumps([hotpot(i) for i in range(4)]))
    (d / "hotpot_dev_distractor_v1.json").write_text(json.dumps([hotpot(i) for i in (4, 5)]))
    (d / "train.jsonl").write_text("".join(json.dumps(nq(i)) + "\n" for i in range(4)))
    (d / "test.jsonl").write_text("".join(json.dumps(nq(i)) + "\n" for i in (4, 5)))
    return {
        "wiki": d / "wiki-18.jsonl",
        "hotpotqa-train": d / "hotpot_train_v1.1.json",
        "hotpotqa-test": d / "hotpot_dev_distractor_v1.json",
        "nq-train": d / "train.jsonl",
        "nq-test": d / "test.jsonl",
    }


def prepare(files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    args = ["data", "paper", "--out", str(out), "--set", "data.eval_objectives=[1,2]", *extra]
    for flag, path in files.items():
        args += [f"--{flag}", str(path)]
    return args


def run_cli(args: list[str], capsys) -> dict:
    assert main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bm25_index_tasks_and_config(files, tmp_path: Path, capsys) -> None:
    out = tmp_path / "paper-data"
    summary = run_cli(prepare(files, out, "--kind", "bm25"), capsys)
    assert summary["questions"]["hotpotqa_train"] == {"questions": 4, "rows": 4, "skipped": 0}
    assert summary["questions"]["nq_test"]["questions"] == 2
    # the training N of the profile (2) and the evaluation N given
    assert summary["tasks"] == {"train_n2": 4, "test_n1": 4, "test_n2": 2}
    assert summary["index"]["documents"] == 12 and summary["index"]["built_now"]

    # the config file: the profile's, pointed at the files and the index
    cfg_path = out / "paper-data.yaml"
    assert summary["config"] == str(cfg_path)
    cfg = load_config("paper", cfg_path)
    assert cfg.data.source == "hotpotqa+nq" and cfg.data.eval_objectives == (1, 2)
    assert cfg.data.hotpotqa == str(files["hotpotqa-train"].resolve())
    assert cfg.data.nq_test == str(files["nq-test"].resolve())
    assert cfg.retrieval.kind == "bm25" and cfg.retrieval.index == str(out / "index-bm25")
    assert cfg.retrieval.corpus == str(files["wiki"].resolve())

    # a run of that config composes the same tasks, and retrieves from the prepared index
    run = RunPaths(tmp_path / "run")
    for name in summary["tasks"]:
        split, n = name.split("_n")
        ours = pq.read_table(out / "tasks" / f"{name}.parquet")
        assert ours.equals(pq.read_table(ensure_tasks(cfg, run, split, int(n))))
    hits = domain_of(cfg).retriever(cfg, run).search(["who founded Sable Quay"], 1)[0]
    assert hits[0].title == "Sable Quay"
    assert not run.indexes.exists()  # the prebuilt index is used as it is

    # again: nothing is rebuilt
    again = run_cli(prepare(files, out, "--kind", "bm25"), capsys)
    assert not again["index"]["built_now"] and again["tasks"] == summary["tasks"]


def test_dense_index_with_a_local_encoder(files, tmp_path: Path, capsys) -> None:
    from mem1_core.retrieval.tiny import build_tiny_encoder

    texts = [json.loads(line)["contents"] for line in files["wiki"].read_text().splitlines()]
    encoder = build_tiny_encoder(tmp_path / "e5-tiny", texts * 3)
    out = tmp_path / "paper-data"
    summary = run_cli(prepare(files, out, "--encoder", str(encoder), "--batch-size", "4"), capsys)
    assert summary["index"]["kind"] == "dense" and summary["index"]["documents"] == 12
    cfg = load_config("paper", out / "paper-data.yaml")
    assert cfg.retrieval.kind == "dense" and cfg.retrieval.encoder == str(encoder)
    assert len(load_index(cfg.retrieval.index).search(["Sable Quay"], 3)[0]) == 3


def test_a_missing_file_fails_before_anything_is_built(files, tmp_path: Path, capsys) -> None:
    broken = {**files, "nq-test": tmp_path / "nope.jsonl"}
    assert main(prepare(broken, tmp_path / "out", "--kind", "bm25")) == 2
    assert "nq_test: no such file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_dense_flags_are_refused_for_bm25(files, tmp_path: Path, capsys) -> None:
    assert main(prepare(files, tmp_path / "out", "--kind", "bm25", "--device", "cuda")) == 2
    assert "--kind dense" in capsys.readouterr().err
