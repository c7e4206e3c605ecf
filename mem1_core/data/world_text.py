"""The generated world's text: one encyclopedia document per entity, in varied sentence
templates, and the single-hop, bridge and comparison questions with their plans (the lookups
a perfect agent makes, which the scripted teacher follows)."""

from __future__ import annotations

import random

from mem1_core.data.world_model import WORK_VERB, Entity, Kind, Question


def entity_document(e: Entity, rng: random.Random) -> str:
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


def plan_step(query: str, title: str, answer: str) -> dict:
    return {"query": query, "title": title, "answer": answer}


def world_question_list(ents: dict[Kind, list[Entity]], rng: random.Random) -> list[Question]:
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
            [plan_step(p.name, p.name, city.name)],
        )
        add(
            f"In what year was {p.name} born?",
            [str(a["born_year"])],
            [p.name],
            1,
            "single",
            [p.name],
            [plan_step(p.name, p.name, str(a["born_year"]))],
        )
        country = city.attrs["country"]
        add(
            f"In which country was {p.name} born?",
            answers(country),
            [p.name, city.name],
            2,
            "bridge",
            [p.name],
            [plan_step(p.name, p.name, city.name), plan_step(city.name, city.name, country)],
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
            [plan_step(o.name, o.name, a["founder"])],
        )
        add(
            f"In what year was the founder of the {o.name} born?",
            [str(by_name[a["founder"]].attrs["born_year"])],
            [o.name, a["founder"]],
            2,
            "bridge",
            [o.name],
            [
                plan_step(o.name, o.name, a["founder"]),
                plan_step(
                    a["founder"], a["founder"], str(by_name[a["founder"]].attrs["born_year"])
                ),
            ],
        )
        add(
            f"In which city is the {o.name} based?",
            answers(a["city"]),
            [o.name],
            1,
            "single",
            [o.name],
            [plan_step(o.name, o.name, a["city"])],
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
            [plan_step(w.name, w.name, creator.name)],
        )
        add(
            f"In which city was the person who {verb} {w.name} born?",
            answers(creator.attrs["born_city"]),
            [w.name, creator.name],
            2,
            "bridge",
            [w.name],
            [
                plan_step(w.name, w.name, creator.name),
                plan_step(creator.name, creator.name, creator.attrs["born_city"]),
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
            [plan_step(c.name, c.name, c.attrs["country"])],
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
            [plan_step(k.name, k.name, cap)],
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
                    plan_step(x.name, x.name, str(x.attrs["born_year"])),
                    plan_step(y.name, y.name, str(y.attrs["born_year"])),
                ],
            )
    return qs
