"""The shop: products, goals and their files.

A `Product` is what an item page shows (title, price, option groups, description,
features, reviews) plus what WebShop's reward reads (attributes, the search query it was
listed under, its category breadcrumb). A `Goal` is one shopping instruction with the
target product, the attributes and options it asks for and a price bound: WebShop's goal
dictionary (`web_agent_site/engine/goal.py`) with typed fields.

Shops come from two places: `mem1_core.webshop.generate` invents one from a seed (the
embedded shop), `mem1_core.webshop.convert` reads WebShop's released files. goal.py's rules
for a goal's text live here, shared by both: the price bound (two of the first four
multiples of $10 above the price drawn, the larger kept) and the option clause ("with
<group>: <value>, and ...").

A product's price is two things, as in WebShop's loader: the price the reward checks (one
number, drawn from a listed range) and the price text the pages show ("$10.99 to $20.99").
A field that WebShop's files leave null (a product's `full_description`, a human
instruction's `instruction_options`) is kept as None, and fails only where it is used, as in
WebShop (mem1_core.webshop.reward).

Files: `products.jsonl` and `goals.jsonl` (one JSON object a line, the dataclasses' fields)
and `manifest.json` (format, source, seed, sizes), each written atomically, the manifest
last, so a directory with a manifest is complete.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mem1_core.runs import atomic

SHOP_FORMAT = "mem1-shop-1"
"""Version of the on-disk layout; a directory of another version is refused."""
PRODUCTS_FILE = "products.jsonl"
GOALS_FILE = "goals.jsonl"
MANIFEST_FILE = "manifest.json"

PRICE_RANGE = tuple(10.0 * i for i in range(1, 100))
"""goal.py's candidate price bounds: $10, $20, ..., $990."""
NO_PRICE_BOUND = 1_000_000.0
"""goal.py's bound where fewer than two candidates lie above the price (no price text)."""
BREADCRUMB_SEPARATOR = " › "
GOAL_SOURCES = ("synthetic", "human")


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
    """The price in dollars the reward checks (WebShop's `product_prices`: one number, drawn
    within a listed range)."""
    attributes: tuple[str, ...]
    """Attribute phrases the reward matches goal attributes against (WebShop's `Attributes`)."""
    options: dict[str, tuple[str, ...]]
    """Option group -> its clickable values, e.g. {"size": ("small", "large")}."""
    description: str | None
    """The `[Description]` page's text; None where WebShop's file has none (its page then
    shows "None", and a reward that must search it fails, as goal.py's does)."""
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
    price_text: str = ""
    """The price as the results and item pages show it (WebShop's `Price`: "$12.99", or
    "$10.99 to $20.99" for a range); empty: WebShop's text of `price` alone."""

    def __post_init__(self) -> None:
        if not self.asin:
            raise ShopFormatError("a product needs a non-empty asin")
        if not self.price >= 0:
            raise ShopFormatError(f"product {self.asin}: price must be >= 0, got {self.price}")

    @property
    def shown_price(self) -> str:
        """The price text of the pages: `price_text`, or WebShop's loader's text of one
        price, "$" and the number as Python writes a float ("$42.5", "$100.0")."""
        return self.price_text or f"${float(self.price)}"

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
    options: dict[str, str] | None
    """Option group -> the value asked for (WebShop's `goal_options`); a human goal's values
    are keyed by the target's group that holds each ("option N" where none does). None where
    WebShop's file has a null `instruction_options`: the goal can be played, and its reward
    fails, as goal.py's does."""
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
    source: str = "synthetic"
    """How goal.py made it: `synthetic` (from the product's instruction, one goal per
    combination of its option values; goal.py hands the reward these options as (group,
    value) pairs) or `human` (a human instruction; its options a list of values)."""

    def __post_init__(self) -> None:
        if not self.asin:
            raise ShopFormatError("a goal needs the asin of its target product")
        if not self.price_upper > 0:
            raise ShopFormatError(f"goal for {self.asin}: price_upper must be > 0")
        if self.source not in GOAL_SOURCES:
            raise ShopFormatError(
                f"goal for {self.asin}: source must be one of {GOAL_SOURCES}, got {self.source!r}"
            )

    @classmethod
    def of(
        cls,
        product: Product,
        instruction: str,
        attributes: list[str] | tuple[str, ...],
        options: dict[str, str] | None,
        price_upper: float,
        source: str = "synthetic",
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
            source=source,
        )

    @property
    def wanted(self) -> dict[str, str]:
        """The options asked for ({} where WebShop's file left them null)."""
        return self.options or {}

    @property
    def difficulty(self) -> int:
        """Requirements to meet besides the price: attributes plus options (the domain's N)."""
        return len(self.attributes) + len(self.wanted)

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

    if annotation.endswith(" | None"):
        return None if value is None else _convert(name, annotation.removesuffix(" | None"), value)
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
    directory: Path | None = field(default=None, compare=False, repr=False)
    """The directory `load` read it from (where its search index is kept), else None."""
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
        write_jsonl((p.to_dict() for p in self.products), out / PRODUCTS_FILE)
        write_jsonl((g.to_dict() for g in self.goals), out / GOALS_FILE)
        write_manifest(out, self.manifest, len(self.products), len(self.goals))
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
        products = tuple(read_jsonl(src / PRODUCTS_FILE, Product.from_dict))
        goals = tuple(read_jsonl(src / GOALS_FILE, Goal.from_dict))
        for name, rows in (("products", products), ("goals", goals)):
            if manifest.get(name) != len(rows):
                raise ShopFormatError(
                    f"{manifest_path}: field {name!r} says {manifest.get(name)}, the file has "
                    f"{len(rows)}"
                )
        return cls(products, goals, manifest, directory=src)


def write_jsonl(rows: Iterable[Mapping[str, Any]], path: Path) -> None:
    """`rows` as the lines of a `.jsonl` file, written atomically, one row at a time."""
    with atomic.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(jsonl_line(row))


def write_manifest(out: Path, manifest: Mapping[str, Any], products: int, goals: int) -> None:
    """The last file of a save, once the products and goals are in place: `manifest` with the
    format and both sizes."""
    sizes = {"format": SHOP_FORMAT, "products": products, "goals": goals}
    atomic.write_json({**manifest, **sizes}, out / MANIFEST_FILE)


def shop_size(shop_dir: str | Path) -> dict[str, int]:
    """{"products": n, "goals": n} of a saved shop, from its manifest alone (no file read)."""
    manifest = Path(shop_dir) / MANIFEST_FILE
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest} not found: not a shop directory")
    m = json.loads(manifest.read_text())
    return {"products": int(m["products"]), "goals": int(m["goals"])}


def jsonl_line(row: Mapping[str, Any]) -> str:
    """One line of `products.jsonl` or `goals.jsonl`."""
    return json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n"


def read_jsonl(path: Path, parse: Callable[[Any], Any]) -> Iterator[Any]:
    """`parse` of each line of a `.jsonl` file, one at a time; a line that is not JSON or that
    `parse` refuses fails naming the file and the line."""
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
