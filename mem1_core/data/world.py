"""The generated world: a procedurally generated encyclopedia and its multi-hop questions.

Everything is invented from a seed (names from a small syllable inventory, years, relations),
so no real-world knowledge helps: an answer can only be found by retrieval. The world has
countries, cities, people, organisations and works; one document per entity states its facts
with varied sentence templates; near-duplicate names act as distractors for retrieval.

Questions are single-hop, two-hop bridge (the answer of the first hop is the subject of the
second) and comparison. Each records its supporting document titles, its hop count and a
`plan` (the lookups a perfect agent makes, used by the scripted teacher).

Train/test split is by entity: every entity a question mentions belongs to the question's
split, so test questions mention only entities that no training question mentions
(docs/design.md §7: the model must learn to copy from retrieved text, not to memorise).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from mem1_core.config import WorldConfig
from mem1_core.data.world_model import (
    ORG_KINDS,
    PROFESSIONS,
    WORK_ADJECTIVES,
    WORK_KINDS,
    WORK_NOUNS,
    Entity,
    Kind,
    Names,
)
from mem1_core.data.world_text import entity_document, world_question_list
from mem1_core.runs import atomic

GENERATOR_VERSION = "world-1"


@dataclass
class World:
    config: WorldConfig
    corpus: pa.Table  # doc_id, title, contents
    questions: pa.Table  # id, question, golden_answers, supporting_titles, hops, split, type, plan


CORPUS_SCHEMA = pa.schema(
    [("doc_id", pa.string()), ("title", pa.string()), ("contents", pa.string())]
)
QUESTION_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("supporting_titles", pa.list_(pa.string())),
        ("hops", pa.int32()),
        ("split", pa.string()),
        ("type", pa.string()),
        ("plan", pa.string()),  # JSON: [{"query", "title", "answer"}, ...] for the teacher
    ]
)


def _make_entities(cfg: WorldConfig, rng: random.Random) -> dict[Kind, list[Entity]]:
    names = Names(rng)

    def batch(kind: Kind, n: int, shape_fn) -> list[Entity]:
        out: list[Entity] = []
        while len(out) < n:
            name, parts = names.fresh(shape_fn())
            out.append(Entity(kind, name))
            if len(out) < n and rng.random() < cfg.near_duplicate_fraction:
                near = names.near(parts)
                if near is not None:
                    out.append(Entity(kind, near[0]))
        return out

    countries = batch(Kind.COUNTRY, cfg.n_countries, lambda: (rng.choice([2, 3]),))
    cities = batch(Kind.CITY, cfg.n_cities, lambda: (rng.choice([2, 3]),))
    people = batch(Kind.PERSON, cfg.n_people, lambda: (2, rng.choice([1, 2])))
    orgs = batch(Kind.ORG, cfg.n_orgs, lambda: (2,))
    for o in orgs:
        o.name = f"{o.name} {rng.choice(ORG_KINDS)}"
    works: list[Entity] = []
    titles: set[str] = set()
    while len(works) < cfg.n_works:
        if rng.random() < 0.5:
            title = f"The {rng.choice(WORK_ADJECTIVES)} {rng.choice(WORK_NOUNS)}"
        else:
            title = f"{rng.choice(WORK_NOUNS)} of {names.fresh((2,))[0]}"
        if title not in titles:
            titles.add(title)
            works.append(Entity(Kind.WORK, title))
    return {
        Kind.COUNTRY: countries,
        Kind.CITY: cities,
        Kind.PERSON: people,
        Kind.ORG: orgs,
        Kind.WORK: works,
    }


def _relate(ents: dict[Kind, list[Entity]], cfg: WorldConfig, rng: random.Random) -> None:
    countries, cities = ents[Kind.COUNTRY], ents[Kind.CITY]
    people, orgs, works = ents[Kind.PERSON], ents[Kind.ORG], ents[Kind.WORK]
    for i, city in enumerate(cities):
        # every country gets at least one city, and its first city is its capital
        country = countries[i] if i < len(countries) else rng.choice(countries)
        city.attrs["country"] = country.name
        city.attrs["founded"] = rng.randint(1100, 1800)
        country.attrs.setdefault("capital", city.name)
    for country in countries:
        country.attrs["founded"] = rng.randint(1400, 1950)
        country.aliases = (f"Republic of {country.name}",) if rng.random() < 0.5 else ()
    for p in people:
        p.attrs["born_year"] = rng.randint(1700, 1990)
        p.attrs["born_city"] = rng.choice(cities).name
        p.attrs["profession"] = rng.choice(PROFESSIONS)
    for o in orgs:
        founder = rng.choice(people)
        o.attrs["founder"] = founder.name
        o.attrs["founded"] = min(founder.attrs["born_year"] + rng.randint(20, 60), 2020)
        o.attrs["city"] = rng.choice(cities).name
    for w in works:
        kind = rng.choice(WORK_KINDS)
        creator = rng.choice(people)
        w.attrs["kind"] = kind
        w.attrs["creator"] = creator.name
        w.attrs["year"] = min(creator.attrs["born_year"] + rng.randint(18, 70), 2024)


# ---- documents ----------------------------------------------------------------------------


def generate_world(cfg: WorldConfig) -> World:
    """Build the world for `cfg`. Deterministic: the same config gives identical tables."""
    rng = random.Random(cfg.seed)
    ents = _make_entities(cfg, rng)
    _relate(ents, cfg, rng)
    by_name = {e.name: e for kind in ents.values() for e in kind}
    for o in ents[Kind.ORG]:
        by_name[o.attrs["founder"]].attrs.setdefault("founded_orgs", []).append(o.name)
    for w in ents[Kind.WORK]:
        by_name[w.attrs["creator"]].attrs.setdefault("works", []).append(w.name)
    # Split by entity: each entity that a question can mention is assigned a split.
    for kind_ents in ents.values():
        for e in kind_ents:
            e.split = "test" if rng.random() < cfg.test_fraction else "train"

    docs = [e for kind in Kind for e in ents[kind]]
    doc_rng = random.Random(cfg.seed + 1)
    corpus = pa.table(
        {
            "doc_id": [f"d{i:06d}" for i in range(len(docs))],
            "title": [e.name for e in docs],
            "contents": [entity_document(e, doc_rng) for e in docs],
        },
        schema=CORPUS_SCHEMA,
    )
    rows = []
    for q in world_question_list(ents, rng):
        splits = {by_name[m].split for m in q.mentions}
        if len(splits) != 1:  # mixes train and test entities: belongs to neither
            continue
        rows.append((q, splits.pop()))
    # Shuffle so that consecutive questions (the paper's per-source grouping) are about
    # different entities, not three questions about one person.
    rng.shuffle(rows)
    questions = pa.table(
        {
            "id": [f"w{cfg.seed}-q{i:06d}" for i in range(len(rows))],
            "question": [q.question for q, _ in rows],
            "golden_answers": [q.answers for q, _ in rows],
            "supporting_titles": [q.supporting for q, _ in rows],
            "hops": [q.hops for q, _ in rows],
            "split": [s for _, s in rows],
            "type": [q.qtype for q, _ in rows],
            "plan": [json.dumps(q.plan) for q, _ in rows],
        },
        schema=QUESTION_SCHEMA,
    )
    meta = {
        b"generator": GENERATOR_VERSION.encode(),
        b"config": json.dumps(cfg.to_dict(), sort_keys=True).encode(),
    }
    return World(cfg, corpus.replace_schema_metadata(meta), questions.replace_schema_metadata(meta))


def write_world(world: World, out_dir: str | Path) -> tuple[Path, Path]:
    """Write `corpus.parquet` and `questions.parquet` atomically into `out_dir`."""
    out = Path(out_dir)
    return (
        atomic.write_parquet(world.corpus, out / "corpus.parquet"),
        atomic.write_parquet(world.questions, out / "questions.parquet"),
    )
