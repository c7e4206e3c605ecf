"""The `paper` profile's data from files a user downloads (`mem1 data paper`).

Inputs: Search-R1's Wikipedia dump `wiki-18.jsonl` (one `{"id", "contents": "\\"Title\\"\\ntext"}`
line per passage: the retrieval corpus of Search-R1 and MEM1), HotpotQA's training and dev
files and FlashRAG's NQ training and test files (the questions). Into one folder:

- `index-{kind}/`: the corpus's index (`dense`: an encoder + FAISS, the paper's e5; `bm25`),
  as `mem1 index` writes it. A run uses it as it is (`retrieval.index`) and never reads the
  corpus again.
- `tasks/{split}_n{N}.parquet`: the N-objective tasks, composed exactly as a run of the
  profile composes them from the same files (the training N, every evaluation N).
- `paper-data.yaml`: a config file over the profile that names all of it, for `--config`.

Each step is skipped when its output is already there and complete, so an interrupted
preparation resumes; the index is the long one (hours on a GPU for wiki-18's 21 million
passages with e5).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mem1_core.config import Config, load_config, parse_overrides
from mem1_core.data.qa_data import load_hotpotqa, load_nq
from mem1_core.qa.tasks import ensure_tasks
from mem1_core.retrieval.base import index_file_problems, read_manifest
from mem1_core.retrieval.index import build_index
from mem1_core.runs import atomic
from mem1_core.runs.layout import RunPaths

CONFIG_NAME = "paper-data.yaml"
"""The config file written beside the index and the tasks."""


@dataclass(frozen=True)
class PaperFiles:
    """The downloaded files (their paths are written, absolute, into the config file)."""

    wiki: Path
    """Search-R1's `wiki-18.jsonl` (or any corpus `mem1 index` reads: JSON Lines, Parquet)."""
    hotpotqa_train: Path
    """HotpotQA's `hotpot_train_v1.1.json` (or rows of the hub's format)."""
    hotpotqa_test: Path
    """HotpotQA's `hotpot_dev_distractor_v1.json`: the test questions."""
    nq_train: Path
    """FlashRAG's `nq/train.jsonl` (`id`, `question`, `golden_answers`)."""
    nq_test: Path
    """FlashRAG's `nq/test.jsonl`: the test questions."""

    def resolved(self) -> PaperFiles:
        paths = {k: Path(v).expanduser().resolve() for k, v in vars(self).items()}
        for name, path in paths.items():
            if not path.is_file():
                raise FileNotFoundError(f"{name}: no such file: {path}")
        return PaperFiles(**paths)


def data_values(files: PaperFiles, kind: str, index_dir: Path, encoder: str | None) -> dict:
    """The config sections that point the profile at the prepared data."""
    retrieval: dict[str, Any] = {"kind": kind, "corpus": str(files.wiki), "index": str(index_dir)}
    if encoder is not None:
        retrieval["encoder"] = encoder
    return {
        "data": {
            "hotpotqa": str(files.hotpotqa_train),
            "hotpotqa_test": str(files.hotpotqa_test),
            "nq": str(files.nq_train),
            "nq_test": str(files.nq_test),
        },
        "retrieval": retrieval,
    }


def _index_ready(index_dir: Path, kind: str) -> bool:
    try:
        manifest = read_manifest(index_dir)
    except (FileNotFoundError, ValueError):
        return False
    return manifest.kind.value == kind and not index_file_problems(index_dir, manifest)


def prepare_paper_data(
    files: PaperFiles,
    out: str | Path,
    *,
    kind: str = "dense",
    index_options: dict[str, Any] | None = None,
    profile: str = "paper",
    overrides: list[str] | tuple[str, ...] = (),
    rebuild_index: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Questions -> tasks, corpus -> index, then the config file; returns a summary.
    `index_options` are `mem1 index`'s options of `kind` (dense: `model` is the encoder);
    `overrides` (`section.field=value`) go into the config file too, so that a run composes
    the same tasks."""
    files = files.resolved()
    out = Path(out).resolve()
    index_dir = out / f"index-{kind}"
    options = dict(index_options or {})
    encoder = options.get("model") if kind == "dense" else None
    values = data_values(files, kind, index_dir, encoder)
    for section, fields in parse_overrides(overrides).items():  # the run must compose alike
        if not isinstance(fields, dict):
            raise ValueError(f"override {section}=...: write section.field=value")
        values.setdefault(section, {}).update(fields)
    config_path = out / CONFIG_NAME
    header = (
        f"# The `{profile}` profile's data, written by `mem1 data paper`: use it as\n"
        f"#   --profile {profile} --config {config_path}\n"
    )
    # Built (and so checked) first: a wrong file fails here, not after hours of indexing.
    cfg = load_config(profile, None, _as_overrides(values))

    summary: dict[str, Any] = {"out": str(out), "questions": _count_questions(files)}
    summary["tasks"] = _compose(cfg, RunPaths(out))

    start = time.perf_counter()
    if rebuild_index or not _index_ready(index_dir, kind):
        build_index(files.wiki, kind, index_dir, show_progress=show_progress, **options)
        built = True
    else:
        built = False
    manifest = read_manifest(index_dir)
    summary["index"] = {
        "dir": str(index_dir),
        "kind": manifest.kind.value,
        "documents": manifest.documents,
        "built_now": built,
        "seconds": round(time.perf_counter() - start, 1) if built else manifest.build_seconds,
        "corpus_report": manifest.corpus_report,
    }
    atomic.write_text(header + yaml.safe_dump(values, sort_keys=False), config_path)
    if load_config(profile, config_path) != cfg:  # the file reads back as what was used
        raise RuntimeError(f"{config_path} does not read back as the config used")
    summary["config"] = str(config_path)
    summary["next"] = f"mem1 train ppo --profile {profile} --config {config_path} --out RUN_DIR"
    return summary


def _as_overrides(values: dict[str, dict[str, Any]]) -> list[str]:
    # JSON-quoted: a path read as YAML stays a string whatever characters it holds
    return [f"{s}.{k}={json.dumps(v)}" for s, fields in values.items() for k, v in fields.items()]


def _count_questions(files: PaperFiles) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    for name, path, load in (
        ("hotpotqa_train", files.hotpotqa_train, lambda p: load_hotpotqa(str(p))),
        ("hotpotqa_test", files.hotpotqa_test, lambda p: load_hotpotqa(str(p))),
        ("nq_train", files.nq_train, lambda p: load_nq(str(p))),
        ("nq_test", files.nq_test, lambda p: load_nq(str(p))),
    ):
        loaded = load(path)
        counts[name] = {
            "questions": loaded.table.num_rows,
            "rows": loaded.total_rows,
            "skipped": sum(loaded.skipped.values()),
        }
    return counts


def _compose(cfg: Config, paths: RunPaths) -> dict[str, int]:
    import pyarrow.parquet as pq

    wanted = [("train", cfg.data.train_objectives)]
    wanted += [("test", n) for n in cfg.data.eval_objectives]
    return {
        f"{split}_n{n}": pq.read_metadata(ensure_tasks(cfg, paths, split, n)).num_rows
        for split, n in wanted
    }
