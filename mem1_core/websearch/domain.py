"""The web-search QA domain: the QA domain (mem1_core.qa.domain) with a web search API as the
agent's search tool in place of the run's index, as in MEM1's transfer experiment (an agent
trained on Wikipedia retrieval answering through a search engine, zero-shot).

Everything else is QA's: the tasks and splits, the prompt and format, EM per objective, the
teacher, the tokenizer's texts. A run with `env.kind: websearch` builds no index; its rollouts
ask the API at `retrieval.web_endpoint` (mem1_core.websearch.client), every answer kept in an
on-disk cache so that a rerun is free and reproducible."""

from __future__ import annotations

from mem1_core.qa.domain import QADomain


class WebSearchDomain(QADomain):
    name = "websearch"

    def check(self, cfg) -> None:
        if cfg.retrieval.url is not None:
            raise ValueError(
                "env.kind=websearch searches the web API at retrieval.web_endpoint; "
                f"retrieval.url={cfg.retrieval.url} is a retrieval server: unset it"
            )

    def uses_index(self, cfg) -> bool:
        return False

    def retriever(self, cfg, paths):
        """The web search API `retrieval.web_*` names, its cache `retrieval.web_cache` (default:
        `web_cache/` under the run directory)."""
        from mem1_core.websearch.client import WebSearchRetriever, settings_from_config

        return WebSearchRetriever(settings_from_config(cfg.retrieval, paths.root))
