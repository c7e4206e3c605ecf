"""The shop: products, goals, their files, and the embedded shop's generator.

A `Product` is what an item page shows (title, price, option groups, description,
features, reviews) plus what WebShop's reward reads (attributes, the search query it was
listed under, its category breadcrumb). A `Goal` is one shopping instruction with the
target product, the attributes and options it asks for and a price bound: WebShop's goal
dictionary (`web_agent_site/engine/goal.py`) with typed fields.

`generate_shop(seed, n_products, n_goals)` invents a shop from a seed, as the task world
invents an encyclopedia: products over WebShop's five categories (`vocab.py`), each with a
type, attributes, option groups, a price and template text; goals built as WebShop's
synthetic goals are: attributes of a target product, one value per option group, and a
price bound drawn as goal.py draws it (two of the first four multiples of $10 above the
price, the larger kept), the text "<instruction> with <group>: <value>, and ... , and price
lower than X dollars". A held-out shop is another seed.

Where it departs from WebShop: the product text is template text, not scraped pages; a
product has one price, where WebShop's loader draws a price from a listed range; a goal asks
for one set of option values, where WebShop makes a goal for every combination of them.

Files: `products.jsonl` and `goals.jsonl` (one JSON object a line, the dataclasses' fields)
and `manifest.json` (format, source, seed, sizes), each written atomically, the manifest
last, so a directory with a manifest is complete.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mem1_core.data.world_model import Names
from mem1_core.runs import atomic
from mem1_core.webshop import vocab

SHOP_FORMAT = "mem1-shop-1"
"""Version of the on-disk layout; a directory of another version is refused."""
GENERATOR_VERSION = "shop-1"
"""Bumped when `generate_shop` would make a different shop from the same seed."""
PRODUCTS_FILE = "products.jsonl"
GOALS_FILE = "goals.jsonl"
MANIFEST_FILE = "manifest.json"

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
"""goal.py's candidate price bounds: $10, $20, ..., $990."""
NO_PRICE_BOUND = 1_000_000.0
"""goal.py's bound where fewer than two candidates lie above the price (no price text)."""
BREADCRUMB_SEPARATOR = " › "


class ShopFormatError(ValueError):
    """A shop or WebShop file that does not have the expected fields; says which."""


@dataclass(frozen=True)
class Product:
    """One product, as its item page shows it and as the reward reads it."""

    asin: str
    """Product id (WebShop's Amazon id; an invented 10-character id in the embedded shop)."""
    category: str
    """Top category (WebShop's `category`: beauty, electronics, fashion, food, furniture)."""
    product_type: str
    """What the product is, as a noun phrase ("running shoes")."""
    title: str
    """The title on the results and item pages (WebShop's `name`/`Title`)."""
    price: float
    """The price in dollars the item page shows and the reward checks."""
    attributes: tuple[str, ...]
    """Attribute phrases the reward matches goal attributes against (WebShop's `Attributes`)."""
    options: dict[str, tuple[str, ...]]
    """Option group -> its clickable values, e.g. {"size": ("small", "large")}."""
    description: str
    """The `[Description]` page's text."""
    features: tuple[str, ...]
    """The `[Features]` page's bullet points (WebShop's `BulletPoints`)."""
    reviews: tuple[str, ...]
    """The `[Reviews]` page's reviews."""
    query: str = ""
    """The search query the product was listed under (WebShop's `query`); the type reward
    compares it with the goal's."""
    product_category: str = ""
    """Category breadcrumb, "a › b › c" (WebShop's `product_category`); the type reward counts
    the levels two products share."""

    def __post_init__(self) -> None:
        if not self.asin:
            raise ShopFormatError("a product needs a non-empty asin")
        if not self.price >= 0:
            raise ShopFormatError(f"product {self.asin}: price must be >= 0, got {self.price}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["options"] = {k: list(v) for k, v in self.options.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Product:
        return cls(**_typed(cls, d))


@dataclass(frozen=True)
class Goal:
    """One shopping instruction and what it asks for (WebShop's goal dictionary)."""

    asin: str
    """The target product: a product meeting every requirement below."""
    instruction: str
    """The instruction text the agent reads."""
    attributes: tuple[str, ...]
    """Attributes asked for (WebShop's `attributes`, from `instruction_attributes`)."""
    options: dict[str, str]
    """Option group -> the value asked for (WebShop's `goal_options`)."""
    price_upper: float
    """Price bound in dollars; `NO_PRICE_BOUND` where the instruction states none."""
    product_type: str
    """The target's type."""
    category: str
    """The target's top category."""
    query: str
    """The target's search query (the type reward's query match)."""
    name: str = ""
    """The target's title, whose nouns the type reward compares with the bought title's
    (WebShop's goal `name`); empty gives WebShop's title score for a nounless name, 0.2."""
    product_category: str = ""
    """The target's category breadcrumb (the type reward's category match)."""

    def __post_init__(self) -> None:
        if not self.asin:
            raise ShopFormatError("a goal needs the asin of its target product")
        if not self.price_upper > 0:
            raise ShopFormatError(f"goal for {self.asin}: price_upper must be > 0")

    @classmethod
    def of(
        cls,
        product: Product,
        instruction: str,
        attributes: list[str] | tuple[str, ...],
        options: dict[str, str],
        price_upper: float,
    ) -> Goal:
        """A goal whose target is `product`: its type, category, query and name are the
        product's (what WebShop's type reward compares)."""
        return cls(
            asin=product.asin,
            instruction=instruction,
            attributes=tuple(attributes),
            options=options,
            price_upper=price_upper,
            product_type=product.product_type,
            category=product.category,
            query=product.query,
            name=product.title,
            product_category=product.product_category,
        )

    @property
    def difficulty(self) -> int:
        """Requirements to meet besides the price: attributes plus options (the domain's N)."""
        return len(self.attributes) + len(self.options)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Goal:
        return cls(**_typed(cls, d))


def _typed(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """`d`'s values checked against `cls`'s fields and converted (lists to tuples); raises
    ShopFormatError naming the field that is missing, unknown or of the wrong type."""
    if not isinstance(d, Mapping):
        raise ShopFormatError(f"expected a JSON object, got {type(d).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ShopFormatError(f"unknown field {unknown[0]!r}")
    out: dict[str, Any] = {}
    for name, f in known.items():
        if name not in d:
            if f.default is not MISSING:
                continue
            raise ShopFormatError(f"missing field {name!r}")
        out[name] = _convert(name, str(f.type), d[name])
    return out


def _convert(name: str, annotation: str, value: Any) -> Any:
    def bad(expected: str) -> ShopFormatError:
        return ShopFormatError(f"field {name!r}: expected {expected}, got {value!r:.60}")

    if annotation == "str":
        if not isinstance(value, str):
            raise bad("a string")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("a number")
        return float(value)
    if annotation == "tuple[str, ...]":
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise bad("a list of strings")
        return tuple(value)
    if annotation == "dict[str, str]":
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise bad("an object of strings")
        return dict(value)
    if annotation == "dict[str, tuple[str, ...]]":
        ok = isinstance(value, dict) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in value.values()
        )
        if not ok:
            raise bad("an object of lists of strings")
        return {k: tuple(v) for k, v in value.items()}
    raise AssertionError(f"no conversion for {annotation}")  # a field added without one


@dataclass(frozen=True)
class Shop:
    """Products, goals, and a product-by-asin lookup."""

    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    manifest: dict[str, Any] = field(default_factory=dict)
    """What the shop was made from: source (generated | webshop), seed, goal kind, sizes."""
    by_asin: dict[str, Product] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_asin: dict[str, Product] = {}
        for p in self.products:
            if p.asin in by_asin:
                raise ShopFormatError(f"two products have asin {p.asin!r}")
            by_asin[p.asin] = p
        for i, g in enumerate(self.goals):
            if g.asin not in by_asin:
                raise ShopFormatError(f"goal {i} targets asin {g.asin!r}, which no product has")
        object.__setattr__(self, "by_asin", by_asin)

    def product(self, asin: str) -> Product:
        try:
            return self.by_asin[asin]
        except KeyError:
            raise KeyError(f"no product with asin {asin!r} in this shop") from None

    def target(self, goal: Goal) -> Product:
        """The product a goal was made from."""
        return self.product(goal.asin)

    def save(self, out_dir: str | Path) -> Path:
        """Write the three files into `out_dir` atomically, the manifest last (an older
        manifest goes first, so a save that dies midway leaves no directory that reads as
        complete)."""
        out = Path(out_dir)
        (out / MANIFEST_FILE).unlink(missing_ok=True)
        atomic.write_text(_jsonl(p.to_dict() for p in self.products), out / PRODUCTS_FILE)
        atomic.write_text(_jsonl(g.to_dict() for g in self.goals), out / GOALS_FILE)
        manifest = {
            **self.manifest,
            "format": SHOP_FORMAT,
            "products": len(self.products),
            "goals": len(self.goals),
        }
        atomic.write_json(manifest, out / MANIFEST_FILE)
        return out

    @classmethod
    def load(cls, shop_dir: str | Path) -> Shop:
        """Read a directory written by `save`; a malformed line fails naming file, line and
        field."""
        src = Path(shop_dir)
        manifest_path = src / MANIFEST_FILE
        if not manifest_path.is_file():
            raise FileNotFoundError(
                f"{manifest_path} not found: not a shop directory, or one whose writing did "
                "not finish (write it with `mem1 data webshop` or Shop.save)"
            )
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("format") != SHOP_FORMAT:
            raise ShopFormatError(
                f"{manifest_path}: field 'format' is {manifest.get('format')!r}, this version "
                f"reads {SHOP_FORMAT!r}"
            )
        products = tuple(_read_jsonl(src / PRODUCTS_FILE, Product.from_dict))
        goals = tuple(_read_jsonl(src / GOALS_FILE, Goal.from_dict))
        for name, rows in (("products", products), ("goals", goals)):
            if manifest.get(name) != len(rows):
                raise ShopFormatError(
                    f"{manifest_path}: field {name!r} says {manifest.get(name)}, the file has "
                    f"{len(rows)}"
                )
        return cls(products, goals, manifest)


def _jsonl(rows: Iterator[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)


def _read_jsonl(path: Path, parse) -> Iterator[Any]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield parse(json.loads(line))
            except json.JSONDecodeError as e:
                raise ShopFormatError(f"{path}:{n}: not JSON ({e.msg})") from None
            except ShopFormatError as e:
                raise ShopFormatError(f"{path}:{n}: {e}") from None


# ---- the price bound and the instruction text, as goal.py builds them ---------------------


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """goal.py's price bound for a target priced `price`: of the first four $10 steps above
    it, two are drawn and the larger kept, with the text ", and price lower than X.XX
    dollars"; with fewer than two steps above it, `NO_PRICE_BOUND` and no text."""
    above = [p for p in PRICE_RANGE if p > price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(rng.sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def option_text(options: Mapping[str, str]) -> str:
    """goal.py's option clause: " with color: red, and size: large" ("" for none)."""
    text = ", and ".join(f"{k}: {v}" for k, v in options.items())
    return f" with {text}" if text else ""


# ---- the embedded shop ---------------------------------------------------------------------

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
