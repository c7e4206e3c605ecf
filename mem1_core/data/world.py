"""The embedded task world: a procedurally generated encyclopedia and its multi-hop questions.

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
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pyarrow as pa

from mem1_core.config import WorldConfig
from mem1_core.runs import atomic

GENERATOR_VERSION = "world-1"

# Consonant-vowel syllables: a name is 2-3 of them, so a tokenizer that learns syllables
# copies unseen names with a few tokens (docs/design.md §7).
ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "sh"]
VOWELS = ["a", "e", "i", "o", "u"]
CODAS = ["", "", "", "n", "r", "l", "s"]

WORK_ADJECTIVES = [
    "Silent",
    "Crimson",
    "Hidden",
    "Broken",
    "Golden",
    "Distant",
    "Winter",
    "Burning",
    "Quiet",
    "Hollow",
    "Wandering",
    "Last",
    "Northern",
    "Endless",
    "Pale",
    "Secret",
]
WORK_NOUNS = [
    "River",
    "Garden",
    "Tower",
    "Harbor",
    "Mirror",
    "Voyage",
    "Orchard",
    "Lantern",
    "Meadow",
    "Kingdom",
    "Letter",
    "Bridge",
    "Island",
    "Season",
    "Crown",
    "Forest",
]
WORK_KINDS = ["film", "novel", "opera", "painting"]
WORK_VERB = {"film": "directed", "novel": "written", "opera": "composed", "painting": "painted"}
ORG_KINDS = ["Institute", "Company", "Society", "Academy", "Bank", "Observatory"]
PROFESSIONS = ["physicist", "painter", "merchant", "poet", "engineer", "composer", "historian"]


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


class _Names:
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


def _make_entities(cfg: WorldConfig, rng: random.Random) -> dict[Kind, list[Entity]]:
    names = _Names(rng)

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


def _doc(e: Entity, rng: random.Random) -> str:
    a = e.attrs
    if e.kind is Kind.COUNTRY:
        s = [
            rng.choice(
                [
                    f"{e.name} is a country whose capital is {a['capital']}.",
                    f"The capital of {e.name} is {a['capital']}.",
                ]
            ),
            rng.choice(
                [
                    f"{e.name} was founded in {a['founded']}.",
                    f"The state of {e.name} dates from {a['founded']}.",
                ]
            ),
        ]
        if e.aliases:
            s.append(f"It is officially known as the {e.aliases[0]}.")
    elif e.kind is Kind.CITY:
        s = [
            rng.choice(
                [
                    f"{e.name} is a city in {a['country']}.",
                    f"{e.name} is located in {a['country']}.",
                ]
            ),
            rng.choice(
                [
                    f"It was founded in {a['founded']}.",
                    f"The city was established in {a['founded']}.",
                ]
            ),
        ]
    elif e.kind is Kind.PERSON:
        s = [
            rng.choice(
                [
                    f"{e.name} was a {a['profession']} born in {a['born_city']} in {a['born_year']}.",
                    f"{e.name} (born {a['born_year']}) was a {a['profession']} from {a['born_city']}.",
                    f"Born in {a['born_year']} in {a['born_city']}, {e.name} became a {a['profession']}.",
                ]
            )
        ]
        for org in a.get("founded_orgs", [])[:2]:
            s.append(f"{e.name.split()[-1]} founded the {org}.")
        for work in a.get("works", [])[:2]:
            s.append(f"{e.name.split()[-1]} is known for {work}.")
    elif e.kind is Kind.ORG:
        s = [
            rng.choice(
                [
                    f"The {e.name} was founded by {a['founder']} in {a['founded']}.",
                    f"{a['founder']} founded the {e.name} in {a['founded']}.",
                ]
            ),
            rng.choice(
                [
                    f"It is based in {a['city']}.",
                    f"Its headquarters are in {a['city']}.",
                ]
            ),
        ]
    else:
        verb = WORK_VERB[a["kind"]]
        s = [
            rng.choice(
                [
                    f"{e.name} is a {a['year']} {a['kind']} {verb} by {a['creator']}.",
                    f"{e.name} is a {a['kind']} {verb} by {a['creator']} in {a['year']}.",
                ]
            )
        ]
    return " ".join(s)


# ---- questions ----------------------------------------------------------------------------


def _step(query: str, title: str, answer: str) -> dict:
    return {"query": query, "title": title, "answer": answer}


def _questions(ents: dict[Kind, list[Entity]], rng: random.Random) -> list[Question]:
    by_name = {e.name: e for kind in ents.values() for e in kind}
    qs: list[Question] = []

    def add(q, ans, support, hops, qtype, mentions, plan):
        qs.append(Question(q, ans, support, hops, qtype, mentions, plan))

    def answers(name: str) -> list[str]:
        e = by_name.get(name)
        return [name, *(e.aliases if e else ())]

    for p in ents[Kind.PERSON]:
        a = p.attrs
        city = by_name[a["born_city"]]
        add(
            f"In which city was {p.name} born?",
            answers(city.name),
            [p.name],
            1,
            "single",
            [p.name],
            [_step(p.name, p.name, city.name)],
        )
        add(
            f"In what year was {p.name} born?",
            [str(a["born_year"])],
            [p.name],
            1,
            "single",
            [p.name],
            [_step(p.name, p.name, str(a["born_year"]))],
        )
        country = city.attrs["country"]
        add(
            f"In which country was {p.name} born?",
            answers(country),
            [p.name, city.name],
            2,
            "bridge",
            [p.name],
            [_step(p.name, p.name, city.name), _step(city.name, city.name, country)],
        )
    for o in ents[Kind.ORG]:
        a = o.attrs
        add(
            f"Who founded the {o.name}?",
            answers(a["founder"]),
            [o.name],
            1,
            "single",
            [o.name],
            [_step(o.name, o.name, a["founder"])],
        )
        add(
            f"In what year was the founder of the {o.name} born?",
            [str(by_name[a["founder"]].attrs["born_year"])],
            [o.name, a["founder"]],
            2,
            "bridge",
            [o.name],
            [
                _step(o.name, o.name, a["founder"]),
                _step(a["founder"], a["founder"], str(by_name[a["founder"]].attrs["born_year"])),
            ],
        )
        add(
            f"In which city is the {o.name} based?",
            answers(a["city"]),
            [o.name],
            1,
            "single",
            [o.name],
            [_step(o.name, o.name, a["city"])],
        )
    for w in ents[Kind.WORK]:
        a = w.attrs
        verb = WORK_VERB[a["kind"]]
        creator = by_name[a["creator"]]
        add(
            f"Who {verb} {w.name}?",
            answers(creator.name),
            [w.name],
            1,
            "single",
            [w.name],
            [_step(w.name, w.name, creator.name)],
        )
        add(
            f"In which city was the person who {verb} {w.name} born?",
            answers(creator.attrs["born_city"]),
            [w.name, creator.name],
            2,
            "bridge",
            [w.name],
            [
                _step(w.name, w.name, creator.name),
                _step(creator.name, creator.name, creator.attrs["born_city"]),
            ],
        )
    for c in ents[Kind.CITY]:
        add(
            f"In which country is {c.name}?",
            answers(c.attrs["country"]),
            [c.name],
            1,
            "single",
            [c.name],
            [_step(c.name, c.name, c.attrs["country"])],
        )
    for k in ents[Kind.COUNTRY]:
        cap = k.attrs["capital"]
        add(
            f"What is the capital of {k.name}?",
            answers(cap),
            [k.name],
            1,
            "single",
            [k.name],
            [_step(k.name, k.name, cap)],
        )
    # comparisons: pairs of people of the same split, asked who was born first
    for split in ("train", "test"):
        people = [p for p in ents[Kind.PERSON] if p.split == split]
        rng.shuffle(people)
        for x, y in zip(people[0::2], people[1::2], strict=False):
            if x.attrs["born_year"] == y.attrs["born_year"]:
                continue
            first = x if x.attrs["born_year"] < y.attrs["born_year"] else y
            add(
                f"Who was born first, {x.name} or {y.name}?",
                [first.name],
                [x.name, y.name],
                2,
                "comparison",
                [x.name, y.name],
                [
                    _step(x.name, x.name, str(x.attrs["born_year"])),
                    _step(y.name, y.name, str(y.attrs["born_year"])),
                ],
            )
    return qs


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
            "contents": [_doc(e, doc_rng) for e in docs],
        },
        schema=CORPUS_SCHEMA,
    )
    rows = []
    for q in _questions(ents, rng):
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


def mentioned_entities(question_table: pa.Table, world_titles: set[str]) -> list[set[str]]:
    """Entity titles that occur in each question's text (for checking the split)."""
    return [{t for t in world_titles if t in q} for q in question_table["question"].to_pylist()]


def write_world(world: World, out_dir: str | Path) -> tuple[Path, Path]:
    """Write `corpus.parquet` and `questions.parquet` atomically into `out_dir`."""
    out = Path(out_dir)
    return (
        atomic.write_parquet(world.corpus, out / "corpus.parquet"),
        atomic.write_parquet(world.questions, out / "questions.parquet"),
    )
