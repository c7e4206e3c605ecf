"""The embedded shop: a shop invented from a seed, as the task world invents an encyclopedia.

`generate_shop(seed, n_products, n_goals)` makes products over WebShop's five categories
(`vocab.py`), each with a type, attributes, option groups, a price and template text, and
goals built as WebShop's synthetic goals are: attributes of a target product, one value per
option group, and goal.py's price bound, the text "<instruction> with <group>: <value>, and
... , and price lower than X dollars". A held-out shop is another seed.

Where it departs from WebShop: the product text is template text, not scraped pages; a
product has one price (its page shows it as WebShop shows a single price), where WebShop's
loader draws a price from a listed range; a goal asks for one set of option values, where
WebShop makes a goal for every combination of them.
"""

from __future__ import annotations

import random

from mem1_core.data.world_model import Names
from mem1_core.webshop import vocab
from mem1_core.webshop.catalog import (
    BREADCRUMB_SEPARATOR,
    Goal,
    Product,
    Shop,
    option_text,
    price_bound,
)

GENERATOR_VERSION = "shop-2"
"""Bumped when `generate_shop` would make a different shop from the same seed."""

_ASIN_CHARS = "0123456789ABCDEFGHJKLMNPQRSTUVWXYZ"
_INSTRUCTIONS = (
    "i am looking for {type} that {be} {attrs}",
    "i need {attrs} {type}",
    "find me {attrs} {type}",
    "i would like to buy {type} that {be} {attrs}",
)
_DESCRIPTIONS = (
    "The {brand} {type} is made to last. {Attrs}.",
    "Meet the {brand} {type}: {attrs}. Designed for everyday use.",
    "{Attrs}. This {type} from {brand} ships in a recyclable box.",
)


def _and_list(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(_ASIN_CHARS) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _brands(rng: random.Random, n: int) -> list[str]:
    """Invented brand names; none contains an attribute phrase, which would let a title
    satisfy an attribute that the product lacks (the reward searches titles for them)."""
    phrases = {a for kinds in vocab.CATEGORIES.values() for k in kinds for a in k.attributes}
    names, out = Names(rng), []
    while len(out) < n:
        name = names.fresh((rng.choice([2, 3]),))[0]
        if not any(a in name.lower() for a in phrases):
            out.append(name)
    return out


def _product(
    rng: random.Random, asin: str, category: str, kind: vocab.ProductKind, brand: str
) -> Product:
    attrs = rng.sample(kind.attributes, rng.randint(3, min(5, len(kind.attributes))))
    options = {}
    for key in kind.options:
        pool = vocab.OPTION_VALUES[key]
        chosen = set(rng.sample(pool, rng.randint(2, min(6, len(pool)))))
        options[vocab.group_name(key)] = tuple(v for v in pool if v in chosen)
    audience = rng.choice(vocab.AUDIENCES[category]).title()
    title = " ".join(x for x in (brand, attrs[0].title(), kind.name.title(), audience) if x)
    if rng.random() < 0.5:
        title += f", {attrs[1].title()}"
    listed = rng.sample(attrs, len(attrs))  # the description names them in another order
    description = rng.choice(_DESCRIPTIONS).format(
        brand=brand, type=kind.name, attrs=_and_list(listed), Attrs=_and_list(listed).capitalize()
    )
    features = tuple(f"{a.upper()}: {kind.name} with {a}." for a in attrs) + tuple(
        f"Available in {len(v)} {g} options." for g, v in options.items()
    )
    reviews = tuple(
        f"Rated {rng.randint(2, 5)} out of 5: {rng.choice(vocab.PRAISE)} {kind.name}, "
        f"{rng.choice(vocab.REVIEW_VERDICTS)}."
        for _ in range(rng.randint(1, 3))
    )
    return Product(
        asin=asin,
        category=category,
        product_type=kind.name,
        title=title,
        price=round(rng.uniform(*kind.price), 2),
        attributes=tuple(attrs),
        options=options,
        description=description,
        features=features,
        reviews=reviews,
        query=kind.name,
        product_category=BREADCRUMB_SEPARATOR.join(kind.breadcrumb),
    )


def synthetic_goal(product: Product, rng: random.Random, n_attributes: int) -> Goal:
    """A goal for `product` as WebShop's synthetic goals are made: `n_attributes` of its
    attributes, one value of each option group, goal.py's price bound."""
    attrs = rng.sample(product.attributes, min(n_attributes, len(product.attributes)))
    options = {g: rng.choice(v) for g, v in product.options.items() if v}
    upper, price_text = price_bound(product.price, rng)
    plural = product.product_type.endswith("s")
    text = rng.choice(_INSTRUCTIONS).format(
        type=product.product_type, be="are" if plural else "is", attrs=_and_list(attrs)
    )
    return Goal.of(product, f"{text}{option_text(options)}{price_text}", attrs, options, upper)


def generate_shop(seed: int, n_products: int, n_goals: int) -> Shop:
    """The embedded shop for `seed`: `n_products` products spread evenly over the product
    types of `vocab.CATEGORIES`, and `n_goals` goals on distinct targets while there are
    products left (then targets repeat). Deterministic in its arguments."""
    if n_products < 1 or n_goals < 0:
        raise ValueError(f"need n_products >= 1 and n_goals >= 0, got {n_products}, {n_goals}")
    rng = random.Random(seed)
    kinds = [(c, k) for c, ks in vocab.CATEGORIES.items() for k in ks]
    brands = _brands(rng, max(12, n_products // 20))
    used: set[str] = set()
    products = [
        _product(rng, _asin(rng, used), *kinds[i % len(kinds)], rng.choice(brands))
        for i in range(n_products)
    ]
    rng.shuffle(products)  # results pages should not cycle through the types in order
    goal_rng = random.Random(seed + 1)
    targets: list[int] = []
    while len(targets) < n_goals:
        order = list(range(n_products))
        goal_rng.shuffle(order)
        targets += order[: n_goals - len(targets)]
    goals = [synthetic_goal(products[i], goal_rng, goal_rng.choice((1, 2, 2, 3))) for i in targets]
    manifest = {"source": "generated", "generator": GENERATOR_VERSION, "seed": seed}
    return Shop(tuple(products), tuple(goals), {**manifest, "goal_kind": "synthetic"})
