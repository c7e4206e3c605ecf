"""The generated world's vocabulary and entity types: the word lists (`data/world/words.yaml`),
entity kinds, entities, questions, and the invented-name generator."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import yaml

WORDS_FILE = Path(__file__).resolve().parents[2] / "data" / "world" / "words.yaml"
"""The repository's word lists of the world (syllables, work titles, kinds, professions)."""

_WORDS = yaml.safe_load(WORDS_FILE.read_text())
# Consonant-vowel syllables: a name is 2-3 of them, so a tokenizer that learns syllables
# copies unseen names with a few tokens (docs/design.md §7).
ONSETS: list[str] = _WORDS["onsets"]
VOWELS: list[str] = _WORDS["vowels"]
CODAS: list[str] = _WORDS["codas"]
WORK_ADJECTIVES: list[str] = _WORDS["work_adjectives"]
WORK_NOUNS: list[str] = _WORDS["work_nouns"]
WORK_KINDS: list[str] = _WORDS["work_kinds"]
WORK_VERB: dict[str, str] = _WORDS["work_verb"]
ORG_KINDS: list[str] = _WORDS["org_kinds"]
PROFESSIONS: list[str] = _WORDS["professions"]


class Kind(StrEnum):
    COUNTRY = "country"
    CITY = "city"
    PERSON = "person"
    ORG = "organisation"
    WORK = "work"


@dataclass
class Entity:
    kind: Kind
    name: str
    attrs: dict = field(default_factory=dict)
    split: str = "train"
    aliases: tuple[str, ...] = ()


@dataclass
class Question:
    question: str
    answers: list[str]
    supporting: list[str]
    hops: int
    qtype: str
    mentions: list[str]
    plan: list[dict]


class Names:
    """Unique invented names; `near` makes a distractor that differs in one syllable."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def syllable(self) -> str:
        r = self.rng
        return r.choice(ONSETS) + r.choice(VOWELS) + r.choice(CODAS)

    def word(self, n_syll: int) -> list[str]:
        return [self.syllable() for _ in range(n_syll)]

    @staticmethod
    def render(parts: list[list[str]]) -> str:
        return " ".join("".join(p).capitalize() for p in parts)

    def fresh(self, shape: tuple[int, ...]) -> tuple[str, list[list[str]]]:
        while True:
            parts = [self.word(n) for n in shape]
            name = self.render(parts)
            if name not in self.used:
                self.used.add(name)
                return name, parts

    def near(self, parts: list[list[str]]) -> tuple[str, list[list[str]]] | None:
        for _ in range(20):
            new = [list(p) for p in parts]
            w = self.rng.randrange(len(new))
            s = self.rng.randrange(len(new[w]))
            new[w][s] = self.syllable()
            name = self.render(new)
            if name not in self.used:
                self.used.add(name)
                return name, new
        return None
