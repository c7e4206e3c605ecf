"""The `env` section: the domain the agent acts in (`env.kind`, one of the registry's:
mem1_core.config.domains) and the WebShop domain's shop, page, reward and split settings."""

from __future__ import annotations

from dataclasses import dataclass

from mem1_core.config.domains import DOMAINS
from mem1_core.config.sections import Section

ENV_KINDS = tuple(DOMAINS)
"""The domains (mem1_core.config.domains: one line per domain)."""


@dataclass(frozen=True)
class EnvConfig(Section):
    """The domain the agent acts in: its environment (mem1_core.rollout.environment). The rest
    of the pipeline (memory, rollout, PPO, SFT, evaluation, flows) is the same for every one."""

    kind: str = "qa"
    """`qa`: multi-objective question answering with a retriever (the world or QA data;
    mem1_core.qa). `websearch`: the same tasks searched through a web search API
    (`retrieval.web_endpoint` and the other web fields; mem1_core.websearch). `webshop`: WebShop's shopping tasks
    (mem1_core.webshop), search and click in a shop."""
    shop_seed: int = 0
    """`webshop`: the seed of the embedded shop that training goals come from."""
    eval_shop_seed: int = 1
    """`webshop`: the seed of the held-out shop that evaluation goals come from (its own
    products and goals: nothing of it is seen in training)."""
    n_products: int = 2000
    """`webshop`: products in each embedded shop."""
    n_goals: int = 500
    """`webshop`: instructions (goals) in each embedded shop."""
    shop_dir: str | None = None
    """`webshop`: a shop converted from WebShop's released files (`mem1 data webshop --out
    DIR`) to use instead of the embedded ones, for training and evaluation alike."""
    results_per_page: int = 10
    """`webshop`: results shown on one results page (WebShop: 10)."""
    max_results: int = 50
    """`webshop`: results a search returns in all, over its pages (WebShop: 50)."""

    noun_parser: str = "standin"
    """`webshop`: the noun parser of the reward's title score: `standin` (content words; no
    model to install), `spacy` (goal.py's `en_core_web_sm`) or `spacy:MODEL`. A spaCy setting
    where spaCy or the model is missing stops the run (docs/webshop.md)."""
    option_match: str = "webshop"
    """`webshop`: how the reward compares a goal's options: `webshop` as goal.py does (a
    synthetic goal's as (group, value) pairs), `value` every goal's by value."""
    observation: str = "lines"
    """`webshop`: the page text: `lines` (one thing a line) or `webshop` (WebShop's " [SEP] "
    text plus MEM1's list of available actions: MEM1's setting)."""
    format_error: str = "retry"
    """`webshop`: a broken turn: `retry` (a format error; the page is shown again with a hint)
    or `end` (MEM1's setting: a broken tag format ends the episode with reward -1)."""
    goal_split: str = "webshop"
    """`webshop` with `shop_dir`: the division of the seed-233-shuffled goals: `webshop` (test
    0-499, dev 500-1,499, train the rest) or `mem1` (test 0-499, train the rest)."""

    def __post_init__(self) -> None:
        if self.kind not in ENV_KINDS:
            raise ValueError(f"env.kind={self.kind!r}: use one of {', '.join(ENV_KINDS)}")
        spacy_model = self.noun_parser.removeprefix("spacy:")
        if self.noun_parser not in ("standin", "spacy") and not (
            self.noun_parser.startswith("spacy:") and spacy_model
        ):
            raise ValueError(
                f"env.noun_parser={self.noun_parser!r}: use standin, spacy or spacy:MODEL"
            )
        for name, allowed in (
            ("option_match", ("webshop", "value")),
            ("observation", ("lines", "webshop")),
            ("format_error", ("retry", "end")),
            ("goal_split", ("webshop", "mem1")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"env.{name}={getattr(self, name)!r}: use one of {', '.join(allowed)}"
                )
        if self.n_products < 1 or self.n_goals < 1:
            raise ValueError("env.n_products and env.n_goals must be >= 1")
        if not 1 <= self.results_per_page <= self.max_results:
            raise ValueError("need 1 <= env.results_per_page <= env.max_results")
        if self.shop_seed == self.eval_shop_seed and self.shop_dir is None:
            raise ValueError(
                "env.eval_shop_seed must differ from env.shop_seed: evaluation is on a held-out "
                "shop"
            )
