"""WebShop's released files -> a `Shop` (the format of `catalog.py`).

Reads the files as WebShop's loader does (`web_agent_site/engine/engine.py:load_products`,
`web_agent_site/engine/goal.py:get_goals`):

- `items_shuffle*.json`: a list of products with `asin`, `name`, `full_description`,
  `small_description` (a string or a list of bullet points), `pricing` ("$12.99", or
  "$10.99 - $20.99" for a range), `customization_options` (group -> [{"value", "image"}],
  or null), `category`, `query` and `product_category` ("a › b › c"). Like the loader, an
  asin of "nan" or longer than 10 characters, or one already seen, is skipped; option groups
  are lowercased and values stripped, lowercased, with "/" written " | ".
- `items_ins_v2*.json`: asin -> {`attributes`, `instruction`, `instruction_attributes`}: the
  products' attributes (what the reward matches) and the synthetic instructions.
- `items_human_ins.json`: asin -> a list of {`instruction`, `instruction_attributes`,
  `instruction_options`}: the human instructions.

Goals: human goals (one per human instruction with attributes) when the human file is
given, else synthetic goals (one per combination of the product's option values, the
instruction followed by " with group: value, and ..."), as goal.py builds them, in goal.py's
order (products in file order; the split's seed-233 shuffle is mem1_core.webshop.run's); both
get goal.py's price bound. Human goals need the attributes file too: WebShop reads every
product's attributes, which the reward matches, from it. A product's price is the loader's:
$100 without pricing, the price, or a uniform draw within a range; its price text is the
loader's `Price` ("$12.99", "$10.99 to $20.99", "$100.0"). A product's type is its `query`
(lowercased and stripped, as the loader does), the search that found it in WebShop's scrape.

Null fields that WebShop's loader keeps are kept (None) and fail only where they are used, as
WebShop's do: a product's `full_description` (its description page reads "None"; the reward
fails if it must search it), a human instruction's `instruction_options` (the goal fails when
scored).

Where it departs from WebShop: draws (prices, bounds) come from `seed`, where WebShop's
are unseeded; a product without attributes gets none, where WebShop gives it the
placeholder "DUMMY_ATTR" (which no goal attribute matches either); a human goal's options,
a list of values, become group -> value by the product's group holding each value ("option
N" where none does); reviews are left empty, as in WebShop's text environment.

Anything else malformed fails with one line naming the file, the item and the field.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from mem1_core.webshop.catalog import (
    Goal,
    Product,
    Shop,
    ShopFormatError,
    option_text,
    price_bound,
)

DEFAULT_PRICE = 100.0
"""The loader's price for a product without pricing."""
MAX_ASIN_LENGTH = 10


@dataclass
class ConvertReport:
    """What a conversion kept and skipped, for the command's summary line."""

    products: int = 0
    goals: int = 0
    goal_kind: str = "none"
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def _load_json(path: Path, kind: type, what: str) -> Any:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file ({what})") from None
    except json.JSONDecodeError as e:
        raise ShopFormatError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, kind):
        expected = "a list" if kind is list else "an object"
        raise ShopFormatError(f"{path}: expected {expected} of {what}, got {type(data).__name__}")
    return data


class _Fields:
    """Typed access to one JSON object, failing in one line that names file, item, field."""

    def __init__(self, path: Path, where: str, obj: Any):
        self.path, self.where, self.obj = path, where, obj
        if not isinstance(obj, dict):
            raise self.error(None, f"expected an object, got {type(obj).__name__}")

    def error(self, name: str | None, message: str) -> ShopFormatError:
        at = f"{self.path}: {self.where}"
        return ShopFormatError(f"{at}: field {name!r}: {message}" if name else f"{at}: {message}")

    def get(self, name: str) -> Any:
        if name not in self.obj:
            raise self.error(name, "missing")
        return self.obj[name]

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.error(name, f"expected a string, got {value!r:.60}")
        return value

    def str_list(self, name: str, allow_none: bool = False) -> list[str] | None:
        value = self.get(name)
        if value is None and allow_none:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, f"expected a list of strings, got {value!r:.60}")
        return value


def parse_pricing(pricing: Any) -> list[float]:
    """The loader's pricing: "$12.99" -> [12.99]; "$10.99 - $20.99" -> [10.99, 20.99]; empty
    or null -> [100.0]. Raises ValueError on text that is not dollar amounts."""
    if not pricing:
        return [DEFAULT_PRICE]
    if not isinstance(pricing, str):
        raise ValueError(f"expected a string like '$12.99', got {pricing!r:.60}")
    try:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    except InvalidOperation:
        raise ValueError(f"expected dollar amounts like '$12.99', got {pricing!r:.60}") from None
    if not prices:
        raise ValueError(f"expected dollar amounts like '$12.99', got {pricing!r:.60}")
    return prices[:2]


def _option_value(value: str) -> str:
    return value.strip().replace("/", " | ").lower()


def _options(f: _Fields) -> dict[str, tuple[str, ...]]:
    raw = f.get("customization_options")
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise f.error("customization_options", f"expected an object, got {raw!r:.60}")
    options: dict[str, tuple[str, ...]] = {}
    for group, contents in raw.items():
        if contents is None:
            continue
        ok = isinstance(contents, list) and all(
            isinstance(c, dict) and isinstance(c.get("value"), str) for c in contents
        )
        if not ok:
            raise f.error(
                "customization_options",
                f"group {group!r}: expected a list of {{'value': ...}} objects",
            )
        options[group.lower()] = tuple(_option_value(c["value"]) for c in contents)
    return options


def _product(f: _Fields, attributes: list[str], rng: random.Random) -> Product:
    bullets = f.get("small_description")
    if isinstance(bullets, str):
        bullets = [bullets]
    elif not isinstance(bullets, list) or not all(isinstance(b, str) for b in bullets):
        raise f.error(
            "small_description", f"expected a string or list of strings, got {bullets!r:.60}"
        )
    try:
        pricing = parse_pricing(f.get("pricing") if "pricing" in f.obj else None)
    except ValueError as e:
        raise f.error("pricing", str(e)) from None
    # generate_product_prices: one price, or a uniform draw within the range
    price = pricing[0] if len(pricing) == 1 else rng.uniform(pricing[0], pricing[1])
    shown = f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"
    description = f.get("full_description")
    if description is not None and not isinstance(description, str):
        raise f.error("full_description", f"expected a string or null, got {description!r:.60}")
    query = f.text("query").lower().strip()
    return Product(
        asin=f.text("asin"),
        category=f.text("category"),
        product_type=query,
        title=f.text("name"),
        price=round(price, 2),
        attributes=tuple(attributes),
        options=_options(f),
        description=description,
        features=tuple(bullets),
        reviews=(),
        query=query,
        product_category=f.text("product_category"),
        price_text=shown,
    )


def _grouped(product: Product, values: list[str]) -> dict[str, str]:
    """A human goal's option values keyed by the product's group holding each value."""
    out: dict[str, str] = {}
    for value in values:
        group = next(
            (g for g, vs in product.options.items() if _option_value(value) in vs and g not in out),
            None,
        )
        out[group or f"option {len(out) + 1}"] = value
    return out


def convert_webshop(
    items: str | Path,
    instructions: str | Path | None = None,
    human_instructions: str | Path | None = None,
    goals: str | None = None,
    seed: int = 0,
    max_products: int | None = None,
) -> tuple[Shop, ConvertReport]:
    """A `Shop` from WebShop's files. `goals`: "human" (needs `human_instructions`),
    "synthetic" (needs `instructions`), or None for human where that file is given, else
    synthetic where `instructions` is, else none. `max_products`: keep the first N items, as
    WebShop's `num_products` does."""
    if max_products is not None and max_products < 1:
        raise ValueError(f"max_products must be >= 1, got {max_products}")
    if goals is None:
        goals = "human" if human_instructions else "synthetic" if instructions else "none"
    needs = {"human": human_instructions, "synthetic": instructions, "none": True}
    if goals not in needs:
        raise ValueError(f"goals must be human, synthetic or None, got {goals!r}")
    if not needs[goals]:
        flag = "--human-instructions" if goals == "human" else "--instructions"
        raise ValueError(f"{goals} goals need {flag} FILE")
    if human_instructions and not instructions:
        raise ValueError(
            "--human-instructions needs --instructions (items_ins_v2.json) too: WebShop reads "
            "every product's attributes, which the reward matches, from it"
        )
    items = Path(items)
    raw_items = _load_json(items, list, "products")
    if max_products is not None:
        raw_items = raw_items[:max_products]
    ins: Mapping[str, Any] = (
        _load_json(Path(instructions), dict, "asin -> attributes") if instructions else {}
    )
    human: Mapping[str, Any] = (
        _load_json(Path(human_instructions), dict, "asin -> instructions")
        if human_instructions
        else {}
    )
    rng = random.Random(seed)
    report = ConvertReport(goal_kind=goals)
    products: list[Product] = []
    seen: set[str] = set()
    for i, obj in enumerate(raw_items):
        f = _Fields(items, f"item {i}", obj)
        asin = f.text("asin")
        f.where = f"item {i} (asin {asin})"
        if asin == "nan" or len(asin) > MAX_ASIN_LENGTH:
            report.skip("bad asin")
            continue
        if asin in seen:
            report.skip("duplicate asin")
            continue
        seen.add(asin)
        attributes: list[str] = []
        if asin in ins:
            entry = _Fields(Path(instructions), f"asin {asin}", ins[asin])
            if "attributes" in entry.obj:
                attributes = entry.str_list("attributes")
        products.append(_product(f, attributes, rng))

    goal_list: list[Goal] = []
    for p in products:
        if goals == "human" and p.asin in human:
            entries = human[p.asin]
            path = Path(human_instructions)
            if not isinstance(entries, list):
                raise ShopFormatError(f"{path}: asin {p.asin}: expected a list of instructions")
            for j, raw in enumerate(entries):
                e = _Fields(path, f"asin {p.asin} instruction {j}", raw)
                attributes = e.str_list("instruction_attributes")
                if not attributes:  # goal.py skips these
                    report.skip("human instruction without attributes")
                    continue
                values = e.str_list("instruction_options", allow_none=True)
                options = None if values is None else _grouped(p, values)
                upper, price_text = price_bound(p.price, rng)
                text = e.text("instruction").strip(".") + price_text
                goal_list.append(Goal.of(p, text, attributes, options, upper, source="human"))
        elif goals == "synthetic" and p.asin in ins:
            e = _Fields(Path(instructions), f"asin {p.asin}", ins[p.asin])
            instruction = e.obj.get("instruction")
            if instruction is None:
                continue
            instruction = e.text("instruction")
            attributes = e.str_list("instruction_attributes")
            if not attributes:
                raise e.error("instruction_attributes", "empty (goal.py requires some)")
            upper, price_text = price_bound(p.price, rng)
            names = sorted(p.options)
            for combination in itertools.product(*(p.options[n] for n in names)):
                options = dict(zip(names, combination, strict=True))
                text = f"{instruction}{option_text(options)}{price_text}"
                goal_list.append(Goal.of(p, text, attributes, options, upper))
    report.products, report.goals = len(products), len(goal_list)
    manifest = {
        "source": "webshop",
        "items": items.name,
        "goal_kind": goals,
        "seed": seed,
        "skipped": dict(report.skipped),
    }
    return Shop(tuple(products), tuple(goal_list), manifest), report
