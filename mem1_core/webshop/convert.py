"""WebShop's released files -> a shop (the format of `catalog.py`), streamed.

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
Draws come from one generator of `seed`: every product's price in file order, then the goals'
bounds in product order.

Null fields that WebShop's loader keeps are kept (None) and fail only where they are used, as
WebShop's do: a product's `full_description` (its description page reads "None"; the reward
fails if it must search it), a human instruction's `instruction_options` (the goal fails when
scored).

Memory: the items file (WebShop's full one: 1.18M products, several GB) is read one product
at a time (`mem1_core.webshop.stream`) and each product written to `products.jsonl` as it is
read, each goal to `goals.jsonl` as it is made (`write_webshop`); what stays in memory is the
attributes of the instructions file (each phrase held once), the asins seen, and the products
that have instructions, from which the goals are made at the end. `convert_webshop` keeps
every product and goal instead and returns the shop, for small files.

Malformed records (a field missing or of the wrong type, pricing that is not dollar amounts:
`mem1_core.webshop.records`) are skipped and counted by reason, items and instructions each;
the conversion fails in one line when either share skipped exceeds `max_malformed`. A file
that is not JSON, or not the JSON kind expected, fails at once.

Where it departs from WebShop: draws (prices, bounds) come from `seed`, where WebShop's
are unseeded; a product without attributes gets none, where WebShop gives it the
placeholder "DUMMY_ATTR" (which no goal attribute matches either); a human goal's options,
a list of values, become group -> value by the product's group holding each value ("option
N" where none does); reviews are left empty, as in WebShop's text environment; a malformed
record is skipped, where WebShop's loader stops on it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mem1_core.runs.atomic import atomic_path
from mem1_core.webshop.catalog import (
    GOALS_FILE,
    MANIFEST_FILE,
    PRODUCTS_FILE,
    Goal,
    Product,
    Shop,
    ShopFormatError,
    jsonl_line,
    write_manifest,
)
from mem1_core.webshop.records import (
    Fields,
    Malformed,
    asin_skip,
    human_entries,
    human_goal,
    parse_pricing,
    read_attributes,
    read_human,
    read_product,
    read_synthetic,
    synthetic_goals,
)
from mem1_core.webshop.stream import NotJSONError, iter_array, iter_object

__all__ = [
    "Conversion",
    "ConvertReport",
    "Tally",
    "convert_webshop",
    "parse_pricing",
    "write_webshop",
]

DEFAULT_MAX_MALFORMED = 0.01
"""The share of items, or of instructions, that may be malformed and skipped (1 %)."""
PROGRESS_EVERY = 2000
"""Items read between two calls of a conversion's `progress`."""
GOAL_KINDS = ("human", "synthetic", "none")


@dataclass
class Tally:
    """Records of one kind read, and those skipped as malformed, by reason."""

    what: str
    read: int = 0
    malformed: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    """Reason -> the first record skipped for it (file, record, field, value)."""

    def count(self, m: Malformed) -> None:
        self.malformed[m.reason] = self.malformed.get(m.reason, 0) + 1
        self.examples.setdefault(m.reason, m.detail)

    @property
    def skipped(self) -> int:
        return sum(self.malformed.values())

    def check(self, limit: float) -> None:
        """Raise ShopFormatError, in one line, where the share skipped exceeds `limit`."""
        if not self.read or self.skipped / self.read <= limit:
            return
        reason, n = max(self.malformed.items(), key=lambda kv: kv[1])
        raise ShopFormatError(
            f"{self.skipped} of {self.read} {self.what} malformed "
            f"({self.skipped / self.read:.2%}), above the limit of {limit:.2%} "
            f"(--max-malformed {limit:g}); most common: {reason} ({n}), e.g. "
            f"{self.examples[reason]}"
        )


@dataclass
class ConvertReport:
    """What a conversion read, kept and skipped, for the command's summary line."""

    products: int = 0
    goals: int = 0
    goal_kind: str = "none"
    skipped: dict[str, int] = field(default_factory=dict)
    """Records WebShop's loader and goal.py skip too (bad or repeated asins, human
    instructions without attributes), by reason."""
    items: Tally = field(default_factory=lambda: Tally("items"))
    instructions: Tally = field(default_factory=lambda: Tally("instructions"))

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def malformed(self) -> dict[str, dict[str, int]]:
        """{"items": {reason: n}, "instructions": {...}}, the kinds with any skipped."""
        return {t.what: dict(t.malformed) for t in (self.items, self.instructions) if t.malformed}


@dataclass(frozen=True)
class Conversion:
    """What a conversion reads and how: WebShop's files and the command's flags."""

    items: Path
    """`items_shuffle*.json`: the products."""
    instructions: Path | None = None
    """`items_ins_v2*.json`: the products' attributes and the synthetic instructions."""
    human_instructions: Path | None = None
    """`items_human_ins.json`: the human instructions (needs `instructions` too)."""
    goals: str | None = None
    """human, synthetic or none; None: human where `human_instructions` is given, else
    synthetic where `instructions` is, else none."""
    seed: int = 0
    """Seed of the draws: ranged prices, the goals' price bounds."""
    max_products: int | None = None
    """Keep the first N items, as WebShop's `num_products` does."""
    max_malformed: float = DEFAULT_MAX_MALFORMED
    """The share of items, or of instructions, that may be skipped as malformed before the
    conversion fails."""

    def __post_init__(self) -> None:
        for name in ("items", "instructions", "human_instructions"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.max_products is not None and self.max_products < 1:
            raise ValueError(f"max_products must be >= 1, got {self.max_products}")
        if not 0 <= self.max_malformed <= 1:
            raise ValueError(
                f"max_malformed is a share, 0 to 1 (0.01: 1 %), got {self.max_malformed}"
            )
        if self.goals is not None and self.goals not in GOAL_KINDS:
            raise ValueError(f"goals must be human, synthetic or None, got {self.goals!r}")
        if self.goals == "human" and not self.human_instructions:
            raise ValueError("human goals need --human-instructions FILE (items_human_ins.json)")
        if self.goals == "synthetic" and not self.instructions:
            raise ValueError("synthetic goals need --instructions FILE (items_ins_v2.json)")
        if self.goals not in (None, "human") and self.human_instructions:
            raise ValueError(
                f"--goals {self.goals} does not read --human-instructions: leave out one of the two"
            )
        if self.human_instructions and not self.instructions:
            raise ValueError(
                "--human-instructions needs --instructions (items_ins_v2.json) too: WebShop "
                "reads every product's attributes, which the reward matches, from it"
            )

    @property
    def kind(self) -> str:
        """The kind of goals built."""
        if self.goals is not None:
            return self.goals
        return "human" if self.human_instructions else "synthetic" if self.instructions else "none"


def _records(it: Iterable[Any]) -> Iterator[Any]:
    """`it`, with a file that is not JSON failing as a ShopFormatError."""
    try:
        yield from it
    except NotJSONError as e:
        raise ShopFormatError(str(e)) from None


def _instructions(
    path: Path | None, kind: str
) -> tuple[dict[str, tuple[str, ...] | Malformed], dict[str, dict[str, Any]]]:
    """The instructions file reduced to what a conversion reads: asin -> attributes (or the
    Malformed that skips its product), and asin -> its synthetic instruction's two fields
    (synthetic goals only; entries with a null instruction make no goal)."""
    attributes: dict[str, tuple[str, ...] | Malformed] = {}
    synthetic: dict[str, dict[str, Any]] = {}
    if path is None:
        return attributes, synthetic
    interned: dict[str, str] = {}  # WebShop's attribute phrases repeat across products
    for asin, entry in _records(iter_object(path, "asin -> attributes")):
        attributes.pop(asin, None)  # a repeated asin: the last entry counts, as in a dict
        synthetic.pop(asin, None)
        try:
            found = read_attributes(path, asin, entry)
        except Malformed as m:
            attributes[asin] = m
            continue
        if found:
            attributes[asin] = tuple(interned.setdefault(a, a) for a in found)
        if kind == "synthetic" and entry.get("instruction") is not None:
            keys = ("instruction", "instruction_attributes")
            synthetic[asin] = {k: entry[k] for k in keys if k in entry}
    return attributes, synthetic


def _human(path: Path | None) -> dict[str, Any]:
    return dict(_records(iter_object(path, "asin -> instructions"))) if path else {}


def _goals(
    targets: Iterable[Product],
    kind: str,
    synthetic: dict[str, dict[str, Any]],
    human: dict[str, Any],
    paths: dict[str, Path | None],
    rng: random.Random,
    report: ConvertReport,
    keep: Callable[[Goal], None],
) -> None:
    """goal.py's goals of the products that have instructions, to `keep` in product order; a
    malformed instruction is skipped and counted."""
    tally = report.instructions
    for p in targets:
        if kind == "synthetic" and p.asin in synthetic:
            tally.read += 1
            try:
                text, attributes = read_synthetic(paths["instructions"], p.asin, synthetic[p.asin])
            except Malformed as m:
                tally.count(m)
                continue
            for goal in synthetic_goals(p, text, attributes, rng):
                keep(goal)
                report.goals += 1
        elif kind == "human" and p.asin in human:
            path = paths["human"]
            try:
                entries = human_entries(path, p.asin, human[p.asin])
            except Malformed as m:
                tally.read += 1
                tally.count(m)
                continue
            for j, raw in enumerate(entries):
                tally.read += 1
                try:
                    text, attributes, values = read_human(path, p.asin, j, raw)
                except Malformed as m:
                    tally.count(m)
                    continue
                if not attributes:  # goal.py skips these
                    report.skip("human instruction without attributes")
                    continue
                keep(human_goal(p, text, attributes, values, rng))
                report.goals += 1


def _existing(path: str | Path | None, what: str) -> Path | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file ({what})")
    return Path(path)


def _read_items(
    items: Path,
    attributes: dict[str, tuple[str, ...] | Malformed],
    instructed: set[str],
    rng: random.Random,
    report: ConvertReport,
    max_products: int | None,
    keep: Callable[[Product], None],
    progress: Callable[[ConvertReport, int], None] | None,
) -> list[Product]:
    """Each product of the items file to `keep`, in file order; returns those whose asin is
    in `instructed` (the products that make goals), the only ones held."""
    targets: list[Product] = []
    seen: set[str] = set()
    bytes_read = 0
    for i, (obj, bytes_read) in enumerate(_records(iter_array(items, "products"))):
        if max_products is not None and i >= max_products:
            break
        report.items.read += 1
        if progress is not None and report.items.read % PROGRESS_EVERY == 0:
            progress(report, bytes_read)
        try:
            f = Fields(items, f"item {i}", obj)
            asin = f.text("asin")
            f.where = f"item {i} (asin {asin})"
            if why := asin_skip(asin) or ("duplicate asin" if asin in seen else None):
                report.skip(why)
                continue
            seen.add(asin)
            found = attributes.get(asin, ())
            if isinstance(found, Malformed):
                raise found
            product = read_product(f, found, rng)
        except Malformed as m:
            report.items.count(m)
            continue
        keep(product)
        report.products += 1
        if product.asin in instructed:
            targets.append(product)
    if progress is not None:
        progress(report, bytes_read)
    return targets


def _convert(
    c: Conversion,
    keep_product: Callable[[Product], None],
    keep_goal: Callable[[Goal], None],
    progress: Callable[[ConvertReport, int], None] | None,
) -> tuple[ConvertReport, dict[str, Any]]:
    """Read the files, hand each product to `keep_product` in file order, then each goal to
    `keep_goal`, and return the report and the manifest; `progress(report, bytes of the items
    file read)` is called every `PROGRESS_EVERY` items."""
    kind = c.kind
    paths = {
        "items": _existing(c.items, "products"),
        "instructions": _existing(c.instructions, "asin -> attributes"),
        "human": _existing(c.human_instructions, "asin -> instructions"),
    }
    attributes, synthetic = _instructions(paths["instructions"], kind)
    human = _human(paths["human"]) if kind == "human" else {}
    rng = random.Random(c.seed)
    report = ConvertReport(goal_kind=kind)
    instructed = synthetic.keys() | human.keys()
    targets = _read_items(
        c.items, attributes, instructed, rng, report, c.max_products, keep_product, progress
    )
    report.items.check(c.max_malformed)
    del attributes
    _goals(targets, kind, synthetic, human, paths, rng, report, keep_goal)
    report.instructions.check(c.max_malformed)
    manifest: dict[str, Any] = {
        "source": "webshop",
        "items": c.items.name,
        "goal_kind": kind,
        "seed": c.seed,
        "skipped": dict(report.skipped),
    }
    if report.malformed():
        manifest["malformed"] = {"limit": c.max_malformed, **report.malformed()}
    return report, manifest


def convert_webshop(
    items: str | Path,
    instructions: str | Path | None = None,
    human_instructions: str | Path | None = None,
    goals: str | None = None,
    seed: int = 0,
    max_products: int | None = None,
    max_malformed: float = DEFAULT_MAX_MALFORMED,
    progress: Callable[[ConvertReport, int], None] | None = None,
) -> tuple[Shop, ConvertReport]:
    """A `Shop` from WebShop's files, held in memory (for files of thousands of products;
    `write_webshop` writes WebShop's full files in bounded memory). `goals`: "human" (needs
    `human_instructions`), "synthetic" (needs `instructions`), or None for human where that
    file is given, else synthetic where `instructions` is, else none. `max_products`: keep
    the first N items, as WebShop's `num_products` does. `max_malformed`: the share of items,
    or of instructions, that may be skipped as malformed before the conversion fails."""
    c = Conversion(
        items, instructions, human_instructions, goals, seed, max_products, max_malformed
    )
    products: list[Product] = []
    goal_list: list[Goal] = []
    report, manifest = _convert(c, products.append, goal_list.append, progress)
    return Shop(tuple(products), tuple(goal_list), manifest), report


def write_webshop(
    out_dir: str | Path,
    c: Conversion,
    progress: Callable[[ConvertReport, int], None] | None = None,
) -> ConvertReport:
    """The shop of conversion `c` written into `out_dir`: what `convert_webshop` returns, as
    `Shop.save` writes it, byte for byte, without holding the products or the goals: each is
    written to its file's temporary as it is made. The files replace those in `out_dir` only
    once every check has passed (the manifest last), so a conversion that fails leaves an
    earlier shop there as it was."""
    out = Path(out_dir)
    with (
        atomic_path(out / PRODUCTS_FILE) as products_tmp,
        atomic_path(out / GOALS_FILE) as goals_tmp,
        open(products_tmp, "w", encoding="utf-8") as products,
        open(goals_tmp, "w", encoding="utf-8") as goal_lines,
    ):
        report, manifest = _convert(c, _writer(products), _writer(goal_lines), progress)
        (out / MANIFEST_FILE).unlink(missing_ok=True)
    write_manifest(out, manifest, report.products, report.goals)
    return report


def _writer(f: TextIO) -> Callable[[Product | Goal], None]:
    """A row's line appended to `f` (`catalog.write_jsonl`'s lines, one at a time)."""
    return lambda row: f.write(jsonl_line(row.to_dict()))
