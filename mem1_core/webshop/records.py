"""WebShop's released records, one at a time: a product from an `items_shuffle` item, its
attributes from an `items_ins_v2` entry, goals from a synthetic or a human instruction.

The rules are WebShop's loader's and goal.py's (`mem1_core.webshop.convert` says which, and
where they depart). A record that cannot be read (a missing field, a field of the wrong type,
pricing that is not dollar amounts) raises `Malformed`, which names the file, the record and
the field; the conversion skips and counts it. Every check runs before the record's draw from
the seeded generator (a ranged price, a goal's bound), so a skipped record draws nothing and
the records around it draw what they would draw without it.
"""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from mem1_core.webshop.catalog import Goal, Product, option_text, price_bound

DEFAULT_PRICE = 100.0
"""The loader's price for a product without pricing."""
MAX_ASIN_LENGTH = 10
_NO_VALUE = object()


class Malformed(Exception):
    """A record that cannot be read. `reason`: the file and what is wrong, without the
    record or its value (what the report counts by); `detail`: one line naming the file, the
    record, the field and the value."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class PricingError(ValueError):
    """Pricing that is not dollar amounts; `problem` says what was expected."""

    def __init__(self, problem: str, pricing: Any):
        super().__init__(f"{problem}, got {pricing!r:.60}")
        self.problem = problem


class Fields:
    """Typed access to one JSON object of `path`; `where` names the record ("item 3")."""

    def __init__(self, path: Path, where: str, obj: Any):
        self.path, self.where, self.obj = path, where, obj
        if not isinstance(obj, dict):
            raise self.error(None, "expected an object", obj)

    def error(self, name: str | None, problem: str, value: Any = _NO_VALUE) -> Malformed:
        what = f"field {name!r}: {problem}" if name else problem
        got = "" if value is _NO_VALUE else f", got {value!r:.60}"
        return Malformed(f"{self.path.name}: {what}", f"{self.path}: {self.where}: {what}{got}")

    def get(self, name: str) -> Any:
        if name not in self.obj:
            raise self.error(name, "missing")
        return self.obj[name]

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise self.error(name, "expected a string", value)
        return value

    def str_list(self, name: str, allow_none: bool = False) -> list[str] | None:
        value = self.get(name)
        if value is None and allow_none:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(name, "expected a list of strings", value)
        return value


def parse_pricing(pricing: Any) -> list[float]:
    """The loader's pricing: "$12.99" -> [12.99]; "$10.99 - $20.99" -> [10.99, 20.99]; empty
    or null -> [100.0]. Raises PricingError (a ValueError) on text that is not dollar amounts."""
    if not pricing:
        return [DEFAULT_PRICE]
    if not isinstance(pricing, str):
        raise PricingError("expected a string like '$12.99'", pricing)
    try:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", p))) for p in pricing.split("$")[1:]]
    except InvalidOperation:
        prices = []
    if not prices:
        raise PricingError("expected dollar amounts like '$12.99'", pricing)
    return prices[:2]


def option_value(value: str) -> str:
    """The loader's option value: stripped, lowercased, "/" written " | "."""
    return value.strip().replace("/", " | ").lower()


def _options(f: Fields) -> dict[str, tuple[str, ...]]:
    raw = f.get("customization_options")
    if not raw:
        return {}
    if not isinstance(raw, dict):
        raise f.error("customization_options", "expected an object", raw)
    options: dict[str, tuple[str, ...]] = {}
    for group, contents in raw.items():
        if contents is None:
            continue
        ok = isinstance(contents, list) and all(
            isinstance(c, dict) and isinstance(c.get("value"), str) for c in contents
        )
        if not ok:
            problem = "expected each group a list of {'value': ...} objects"
            raise f.error("customization_options", problem, {group: contents})
        options[group.lower()] = tuple(option_value(c["value"]) for c in contents)
    return options


def read_product(f: Fields, attributes: tuple[str, ...], rng: random.Random) -> Product:
    """The product of item `f`, with `attributes` from the instructions file. Draws a ranged
    price from `rng` once every field has been read."""
    bullets = f.get("small_description")
    if isinstance(bullets, str):
        bullets = [bullets]
    elif not isinstance(bullets, list) or not all(isinstance(b, str) for b in bullets):
        raise f.error("small_description", "expected a string or a list of strings", bullets)
    try:
        pricing = parse_pricing(f.obj.get("pricing"))
    except PricingError as e:
        raise f.error("pricing", e.problem, f.obj["pricing"]) from None
    description = f.get("full_description")
    if description is not None and not isinstance(description, str):
        raise f.error("full_description", "expected a string or null", description)
    query = f.text("query").lower().strip()
    asin, category, title = f.text("asin"), f.text("category"), f.text("name")
    product_category, options = f.text("product_category"), _options(f)
    if not asin:
        raise f.error("asin", "empty")
    # generate_product_prices: one price, or a uniform draw within the range
    price = pricing[0] if len(pricing) == 1 else rng.uniform(pricing[0], pricing[1])
    shown = f"${pricing[0]}" if len(pricing) == 1 else f"${pricing[0]} to ${pricing[1]}"
    return Product(
        asin=asin,
        category=category,
        product_type=query,
        title=title,
        price=round(price, 2),
        attributes=attributes,
        options=options,
        description=description,
        features=tuple(bullets),
        reviews=(),
        query=query,
        product_category=product_category,
        price_text=shown,
    )


def read_attributes(path: Path, asin: str, entry: Any) -> tuple[str, ...]:
    """The attributes of an `items_ins_v2` entry (none where it has no `attributes`)."""
    e = Fields(path, f"asin {asin}", entry)
    return tuple(e.str_list("attributes")) if "attributes" in e.obj else ()


def read_synthetic(path: Path, asin: str, entry: dict[str, Any]) -> tuple[str, list[str]]:
    """An `items_ins_v2` entry's instruction and its attributes, checked."""
    e = Fields(path, f"asin {asin}", entry)
    text, wanted = e.text("instruction"), e.str_list("instruction_attributes")
    if not wanted:
        raise e.error("instruction_attributes", "empty (goal.py requires some)")
    return text, wanted


def synthetic_goals(
    p: Product, instruction: str, attributes: list[str], rng: random.Random
) -> list[Goal]:
    """goal.py's synthetic goals of `p`: one per combination of its option values (groups
    sorted), all with one price bound drawn from `rng`."""
    upper, price_text = price_bound(p.price, rng)
    names = sorted(p.options)
    goals = []
    for combination in itertools.product(*(p.options[n] for n in names)):
        options = dict(zip(names, combination, strict=True))
        text = f"{instruction}{option_text(options)}{price_text}"
        goals.append(Goal.of(p, text, attributes, options, upper))
    return goals


def human_entries(path: Path, asin: str, entries: Any) -> list[Any]:
    """A product's human instructions: the list `items_human_ins` holds for its asin."""
    if not isinstance(entries, list):
        problem = "expected a list of instructions"
        detail = f"{path}: asin {asin}: {problem}, got {entries!r:.60}"
        raise Malformed(f"{path.name}: {problem}", detail)
    return entries


def read_human(path: Path, asin: str, j: int, raw: Any) -> tuple[str, list[str], list | None]:
    """A human instruction's text, attributes and option values (None where null), checked;
    one without attributes, which goal.py skips, is returned with none and not read further."""
    e = Fields(path, f"asin {asin} instruction {j}", raw)
    attributes = e.str_list("instruction_attributes")
    if not attributes:
        return "", [], None
    values = e.str_list("instruction_options", allow_none=True)
    return e.text("instruction"), attributes, values


def human_goal(
    p: Product, text: str, attributes: list[str], values: list | None, rng: random.Random
) -> Goal:
    """goal.py's human goal: the instruction without its final "." and a price bound drawn
    from `rng`; the option values keyed by the product's group holding each."""
    options = None if values is None else _grouped(p, values)
    upper, price_text = price_bound(p.price, rng)
    return Goal.of(p, text.strip(".") + price_text, attributes, options, upper, source="human")


def _grouped(product: Product, values: list[str]) -> dict[str, str]:
    """A human goal's option values keyed by the product's group holding each value."""
    out: dict[str, str] = {}
    for value in values:
        group = next(
            (g for g, vs in product.options.items() if option_value(value) in vs and g not in out),
            None,
        )
        out[group or f"option {len(out) + 1}"] = value
    return out


def asin_skip(asin: str) -> str | None:
    """Why WebShop's loader skips an item of this asin ("nan", or longer than 10), or None."""
    return "bad asin" if asin == "nan" or len(asin) > MAX_ASIN_LENGTH else None
