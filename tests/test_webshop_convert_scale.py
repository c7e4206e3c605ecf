"""The streamed conversion of WebShop's files against a conversion written out here the plain
way (whole files through `json.loads`, every product held, prices drawn in file order, then
the goals' bounds in product order); the incremental JSON reader against `json.loads`;
malformed records skipped, counted, and failing above the limit; conflicting flags."""

from __future__ import annotations

import gc
import itertools
import json
import random
import weakref
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.webshop_convert_scale import write_files
from mem1_core.cli.main import main
from mem1_core.webshop import convert
from mem1_core.webshop.catalog import Goal, Product, Shop, price_bound
from mem1_core.webshop.convert import Conversion, convert_webshop, write_webshop
from mem1_core.webshop.stream import NotJSONError, iter_array, iter_object

SHOP_FILES = ("products.jsonl", "goals.jsonl", "manifest.json")


# ---- the incremental reader -------------------------------------------------------------------


def _random_json(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(
            [rng.randrange(-(10**9), 10**9), rng.random() * 10 ** rng.randrange(-30, 30)]
        )
    if kind == 1:
        return rng.choice([True, False, None])
    if kind in (2, 3):  # escapes, multi-byte and astral characters, control characters
        return "".join(rng.choice('ab\\"\n\t é€😀\u0001/') for _ in range(rng.randrange(12)))
    if kind == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{rng.randrange(5)}": _random_json(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_stream_reads_what_json_loads_reads(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "f.json"
    for _ in range(150):
        value = [_random_json(rng) for _ in range(rng.randrange(6))]
        obj = {f"asin{i}": _random_json(rng) for i in range(rng.randrange(6))}
        for data, read in ((value, iter_array), (obj, iter_object)):
            text = json.dumps(data, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2]))
            path.write_text(text, encoding="utf-8")
            for chunk in (1, 2, 5, 64, 1 << 20):  # values cut anywhere, or read whole
                got = list(read(path, chunk_bytes=chunk))
                expected = json.loads(text)
                if read is iter_array:
                    assert [v for v, _ in got] == expected
                    assert [n for _, n in got] == sorted(n for _, n in got)
                else:
                    assert dict(got) == expected and [k for k, _ in got] == list(expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello", r"f\.json: not JSON \(expected a list of products, found 'h', line 1\)"),
        ("", r"not JSON \(expected a list of products, found an empty file"),
        ('{"a": 1}', r"f\.json: expected a list of products, got an object"),
        ('[1,\n2,\n{"a": 1 "b"}]', r"not JSON \(Expecting ',' delimiter, line 3\)"),
        ("[1, 2", r"not JSON \(expected ',' or '\]' after a list element, found the end"),
        ("[1] [2]", r"not JSON \(extra data after the top-level value, line 1\)"),
    ],
)
def test_stream_refuses_what_is_not_a_json_list(tmp_path, text, message):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(NotJSONError, match=message):
        list(iter_array(path, "products", chunk_bytes=3))


# ---- the streamed conversion against the plain one ------------------------------------------


def plain_shop(items: Path, ins: Path | None, human: Path | None, seed: int) -> Shop:
    """WebShop's loader and goal.py written out: whole files, every product held."""
    raw_items = json.loads(items.read_text())
    attributes = json.loads(ins.read_text()) if ins else {}
    humans = json.loads(human.read_text()) if human else {}
    kind = "human" if human else "synthetic" if ins else "none"
    rng = random.Random(seed)
    products: list[Product] = []
    seen: set[str] = set()
    skipped: Counter[str] = Counter()
    for obj in raw_items:
        asin = obj["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            skipped["bad asin" if asin == "nan" or len(asin) > 10 else "duplicate asin"] += 1
            continue
        seen.add(asin)
        prices = [
            float(p.strip(" -").replace(",", "")) for p in (obj["pricing"] or "").split("$")[1:]
        ]
        prices = prices[:2] or [100.0]
        price = prices[0] if len(prices) == 1 else rng.uniform(*prices)
        shown = f"${prices[0]}" if len(prices) == 1 else f"${prices[0]} to ${prices[1]}"
        bullets = obj["small_description"]
        groups = obj["customization_options"] or {}
        products.append(Product(
            asin=asin, category=obj["category"], product_type=obj["query"].lower().strip(),
            title=obj["name"], price=round(price, 2),
            attributes=tuple(attributes.get(asin, {}).get("attributes", ())),
            options={g.lower(): tuple(v["value"].strip().replace("/", " | ").lower() for v in vs)
                     for g, vs in groups.items()},
            description=obj["full_description"],
            features=tuple([bullets] if isinstance(bullets, str) else bullets), reviews=(),
            query=obj["query"].lower().strip(), product_category=obj["product_category"],
            price_text=shown,
        ))  # fmt: skip
    goals: list[Goal] = []
    for p in products:
        entry = attributes.get(p.asin, {})
        if kind == "synthetic" and entry.get("instruction") is not None:
            upper, text = price_bound(p.price, rng)
            names = sorted(p.options)
            for values in itertools.product(*(p.options[n] for n in names)):
                wanted = dict(zip(names, values, strict=True))
                clause = " with " + ", and ".join(f"{k}: {v}" for k, v in wanted.items())
                instruction = entry["instruction"] + (clause if wanted else "") + text
                goals.append(
                    Goal.of(p, instruction, entry["instruction_attributes"], wanted, upper)
                )
        for h in humans.get(p.asin, []) if kind == "human" else []:
            if not h["instruction_attributes"]:
                skipped["human instruction without attributes"] += 1
                continue
            assert h["instruction_options"] in ([], None)  # as written below
            upper, text = price_bound(p.price, rng)
            wanted = None if h["instruction_options"] is None else {}
            instruction = h["instruction"].strip(".") + text
            goals.append(
                Goal.of(p, instruction, h["instruction_attributes"], wanted, upper, "human")
            )
    manifest = {"source": "webshop", "items": items.name, "goal_kind": kind, "seed": seed,
                "skipped": dict(skipped)}  # fmt: skip
    return Shop(tuple(products), tuple(goals), manifest)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """3,000 products in WebShop's format: ranged and missing prices, null descriptions,
    option groups, skipped asins; instructions for 1 % of them and human ones for some."""
    d = tmp_path_factory.mktemp("webshop")
    items, ins = write_files(d, 3000, seed=7)
    entries = json.loads(ins.read_text())
    human = {
        asin: [
            {
                "instruction": "Find me one.",
                "instruction_attributes": e["attributes"][:1],
                "instruction_options": None if i % 3 == 0 else [],
                "worker_id": "w",
            }
            for _ in range(1 + i % 3)
        ]  # fmt: skip
        for i, (asin, e) in enumerate(list(entries.items())[::29])
    }
    (d / "human.json").write_text(json.dumps(human))
    return {"items": items, "ins": ins, "human": d / "human.json"}


def _files(d: Path) -> list[bytes]:
    return [(d / name).read_bytes() for name in SHOP_FILES]


@pytest.mark.parametrize("kind", ["synthetic", "human", "none"])
def test_streamed_files_equal_the_plain_conversion_byte_for_byte(generated, tmp_path, kind):
    ins = None if kind == "none" else generated["ins"]
    human = generated["human"] if kind == "human" else None
    plain = plain_shop(generated["items"], ins, human, seed=3)
    plain.save(tmp_path / "plain")
    report = write_webshop(
        tmp_path / "streamed", Conversion(generated["items"], ins, human, seed=3)
    )
    assert _files(tmp_path / "streamed") == _files(tmp_path / "plain")
    assert report.products == len(plain.products) and report.goals == len(plain.goals)
    assert len(plain.goals) > 20 or kind == "none"
    ranged = sum(" to " in p.price_text for p in plain.products)
    assert ranged > 100 and report.skipped["duplicate asin"] > 0
    shop, _ = convert_webshop(generated["items"], ins, human, seed=3)
    shop.save(tmp_path / "in_memory")
    assert _files(tmp_path / "in_memory") == _files(tmp_path / "plain")


def test_the_stream_holds_only_the_products_with_instructions(generated, tmp_path, monkeypatch):
    alive: list[weakref.ref] = []
    held: list[int] = []
    read_product, goals = convert.read_product, convert._goals

    def spy_read(*args):
        product = read_product(*args)
        alive.append(weakref.ref(product))
        return product

    def spy_goals(targets, *args):
        gc.collect()
        held.append(sum(r() is not None for r in alive))
        return goals(targets, *args)

    monkeypatch.setattr(convert, "read_product", spy_read)
    monkeypatch.setattr(convert, "_goals", spy_goals)
    write_webshop(tmp_path, Conversion(generated["items"], generated["ins"]))
    with_instructions = sum(
        e.get("instruction") is not None for e in json.loads(generated["ins"].read_text()).values()
    )
    assert len(alive) > 2900 and held == [with_instructions]


# ---- malformed records ----------------------------------------------------------------------


def _item(i: int) -> dict:
    pricing = f"${10 + i % 7}.50" if i % 4 else f"${5 + i % 3}.00 - ${30 + i % 5}.00"
    return {"asin": f"B{i:09d}", "name": f"Tea Tree Shampoo {i}", "full_description": "Mild.",
            "small_description": ["Sulfate free"], "pricing": pricing,
            "customization_options": {"Size": [{"value": "8 oz"}, {"value": "16 oz"}]},
            "category": "beauty", "query": "shampoo", "product_category": "Beauty › Hair"}  # fmt: skip


MALFORMED = [
    ({"name": 42}, "items.json: field 'name': expected a string"),
    ({"pricing": "twelve dollars"}, "items.json: field 'pricing': expected dollar amounts"),
    ({"query": None}, "items.json: field 'query': expected a string"),
    ({"customization_options": {"Size": ["s"]}}, "items.json: field 'customization_options'"),
]


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _with_malformed(tmp_path: Path, n_good: int) -> tuple[Path, Path, list[dict]]:
    """n_good items with the MALFORMED ones among them, and the good ones alone."""
    good = [_item(i) for i in range(n_good)]
    mixed = list(good)
    for k, (change, _) in enumerate(MALFORMED):
        mixed.insert(10 + 37 * k, {**_item(10_000 + k), **change})
    mixed.insert(5, ["not", "an", "object"])
    missing = _item(20_000)
    del missing["category"]
    mixed.insert(100, missing)
    ins = {f"B{i:09d}": {"attributes": ["mild"], "instruction": "i want a mild shampoo",
                         "instruction_attributes": ["mild"]} for i in range(0, n_good, 5)}  # fmt: skip
    ins["B000000051"] = {"attributes": "mild"}  # a malformed attributes entry skips its product
    ins["B000000100"]["instruction_attributes"] = []  # a malformed instruction skips its goals
    _write(tmp_path / "ins.json", ins)
    return _write(tmp_path / "items.json", mixed), tmp_path / "ins.json", good


def test_malformed_records_are_skipped_counted_and_draw_nothing(tmp_path):
    items, ins, good = _with_malformed(tmp_path, 1000)
    report = write_webshop(tmp_path / "mixed", Conversion(items, ins, seed=1))
    assert report.items.read == 1000 + len(MALFORMED) + 2
    assert report.products == 999  # the good ones but B000000051
    by_reason = report.items.malformed
    for _, reason in MALFORMED:
        assert sum(n for r, n in by_reason.items() if r.startswith(reason)) == 1
    assert by_reason["items.json: expected an object"] == 1
    assert by_reason["items.json: field 'category': missing"] == 1
    assert by_reason["ins.json: field 'attributes': expected a list of strings"] == 1
    instructions = report.instructions.malformed
    assert instructions == {
        "ins.json: field 'instruction_attributes': empty (goal.py requires some)": 1
    }
    manifest = json.loads((tmp_path / "mixed" / "manifest.json").read_text())
    assert manifest["malformed"] == {
        "limit": 0.01,
        "items": by_reason,
        "instructions": instructions,
    }
    # the products around a skipped one draw what they would draw without it
    del good[51]
    clean = _write(tmp_path / "clean.json", good)
    ins_clean = json.loads(ins.read_text())
    del ins_clean["B000000051"]
    ins_clean["B000000100"] = {"attributes": ["mild"]}
    _write(ins, ins_clean)
    write_webshop(tmp_path / "clean", Conversion(clean, ins, seed=1))
    mixed_lines = (tmp_path / "mixed" / "products.jsonl").read_text()
    assert mixed_lines == (tmp_path / "clean" / "products.jsonl").read_text()


def test_above_the_limit_the_conversion_fails_in_one_line(tmp_path, capsys):
    items, ins, _ = _with_malformed(tmp_path, 300)  # 7 of 306 items: 2.3 %
    out = tmp_path / "shop"
    Shop((Product("B0", "beauty", "x", "x", 1.0, (), {}, "", (), ()),), ()).save(out)
    before = _files(out)
    args = ["data", "webshop", "--items", str(items), "--instructions", str(ins), "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert (
        "7 of 306 items malformed (2.29%), above the limit of 1.00% (--max-malformed 0.01)" in err
    )
    assert "most common: items.json: " in err and "e.g. " in err and "items.json: item " in err
    assert _files(out) == before  # the earlier shop is left as it was
    assert main([*args, "--max-malformed", "0.05"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["items"] == 306 and summary["products"] == 299
    assert sum(summary["malformed"]["items"].values()) == 7
    assert Shop.load(out).manifest["malformed"]["limit"] == 0.05


def test_a_file_that_is_not_json_fails_at_once(tmp_path, capsys):
    items = tmp_path / "items.json"
    items.write_text('[{"asin": "B000000001"}, oops')
    assert main(["data", "webshop", "--items", str(items), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "items.json: not JSON (Expecting value, line 1)" in err
    assert not (tmp_path / "o" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--goals", "human"], "human goals need --human-instructions FILE"),
        (["--goals", "synthetic"], "synthetic goals need --instructions FILE"),
        (["--human-instructions", "h.json"], "--human-instructions needs --instructions"),
        (["--instructions", "i.json", "--human-instructions", "h.json", "--goals", "synthetic"],
         "--goals synthetic does not read --human-instructions"),
        (["--max-malformed", "1.5"], "max_malformed is a share, 0 to 1"),
        (["--max-products", "0"], "max_products must be >= 1"),
    ],
)  # fmt: skip
def test_conflicting_flags_fail_in_one_line(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    for name in ("items.json", "i.json", "h.json"):
        _write(tmp_path / name, {} if name != "items.json" else [])
    assert main(["data", "webshop", "--items", "items.json", *flags, "--out", "o"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_progress_reports_items_read_and_bytes(generated, tmp_path, monkeypatch):
    monkeypatch.setattr(convert, "PROGRESS_EVERY", 500)
    seen: list[tuple[int, int, int]] = []
    write_webshop(
        tmp_path, Conversion(generated["items"], generated["ins"]),
        progress=lambda r, n: seen.append((r.items.read, r.products, n)),
    )  # fmt: skip
    assert [s[0] for s in seen] == [500, 1000, 1500, 2000, 2500, 3000, 3000]
    assert seen[-1][2] == generated["items"].stat().st_size
    assert all(a[2] <= b[2] and a[1] <= b[1] for a, b in itertools.pairwise(seen))
