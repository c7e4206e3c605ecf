"""The QA domain: multi-objective question answering with a retriever (MEM1 §4.1), on the
embedded world (mem1_core.data.world) or on real QA data (HotpotQA + NQ, mem1_core.data.qa_data),
searched through an index the run builds (mem1_core.retrieval) or a server."""

from __future__ import annotations

from pathlib import Path

from mem1_core.domains.base import Domain, Units


class QADomain(Domain):
    name = "qa"
    units = Units("EM", "objectives")

    def ensure_tasks(self, cfg, paths, split: str, n: int) -> Path:
        from mem1_core.qa.tasks import ensure_tasks

        return ensure_tasks(cfg, paths, split, n)

    def uses_index(self, cfg) -> bool:
        return cfg.retrieval.url is None

    def index_corpus(self, cfg, paths) -> Path:
        """The world's corpus (generated if missing), or `retrieval.corpus`."""
        from mem1_core.qa.tasks import corpus_path

        return corpus_path(cfg, paths)

    def retriever(self, cfg, paths):
        """The agent's search tool: the run's index (built if missing), or the retrieval server
        at `retrieval.url`."""
        from mem1_core.retrieval.run_index import index_retriever

        return index_retriever(cfg, paths, lambda: self.index_corpus(cfg, paths))

    def make_env(self, cfg, paths, tokenizer, retriever=None):
        from mem1_core.qa.env import qa_environment

        return qa_environment(cfg, tokenizer, retriever or self.retriever(cfg, paths))

    def prepare_data(self, cfg, paths) -> Path | None:
        """The embedded world (generated once per run directory); real QA data: nothing."""
        from mem1_core.qa.tasks import ensure_world

        return ensure_world(cfg, paths) if cfg.data.source == "world" else None

    def has_teacher(self, cfg) -> bool:
        """The world's tasks carry their plans; real QA data has no teacher."""
        return cfg.data.source == "world"

    def teacher_sources(self, cfg, paths, tokenizer) -> list:
        """The extra worlds of fresh names the teacher also plays (`sft.teacher_worlds`,
        mem1_core.qa.tasks.teacher_world)."""
        from mem1_core.qa.tasks import teacher_world

        if cfg.data.source != "world":
            return []
        return [teacher_world(cfg, paths, k) for k in range(cfg.sft.teacher_worlds)]

    def tokenizer_texts(self, cfg, paths) -> list[str]:
        """The world's corpus and two-question prompts."""
        import pyarrow.parquet as pq

        from mem1_core.data.prompts import task_prompt
        from mem1_core.qa.tasks import ensure_world

        world = ensure_world(cfg, paths)
        corpus = pq.read_table(world / "corpus.parquet")["contents"].to_pylist()
        questions = pq.read_table(world / "questions.parquet")["question"].to_pylist()
        return corpus + [task_prompt(questions[i : i + 2]) for i in range(0, len(questions), 2)]
