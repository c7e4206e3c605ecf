"""The shop's dataclasses, files and generator: goals built as WebShop's synthetic goals
are (web_agent_site/engine/goal.py), files that round-trip and fail by name."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from mem1_core.webshop import vocab
from mem1_core.webshop.catalog import (
    NO_PRICE_BOUND,
    Goal,
    Product,
    Shop,
    ShopFormatError,
    option_text,
    price_bound,
)
from mem1_core.webshop.generate import generate_shop


@pytest.fixture(scope="module")
def shop() -> Shop:
    return generate_shop(seed=3, n_products=700, n_goals=300)


def test_same_seed_same_shop_other_seed_other_shop(shop):
    again = generate_shop(seed=3, n_products=700, n_goals=300)
    assert again.products == shop.products and again.goals == shop.goals
    other = generate_shop(seed=4, n_products=700, n_goals=300)
    assert {p.asin for p in other.products}.isdisjoint({p.asin for p in shop.products})


def test_products_cover_every_type_evenly(shop):
    n_kinds = sum(len(k) for k in vocab.CATEGORIES.values())
    counts: dict[str, int] = {}
    for p in shop.products:
        counts[p.product_type] = counts.get(p.product_type, 0) + 1
    assert len(counts) == n_kinds
    # 700 products over 35 types: exactly 20 each
    assert set(counts.values()) == {700 // n_kinds}
    assert {p.category for p in shop.products} == set(vocab.CATEGORIES)


def test_goals_ask_for_what_their_target_has(shop):
    for g in shop.goals:
        target = shop.target(g)
        assert set(g.attributes) <= set(target.attributes)
        assert set(g.options) == set(target.options)
        assert all(v in target.options[k] for k, v in g.options.items())
        assert g.query == target.query and g.name == target.title
        assert target.product_type in g.instruction
        assert all(a in g.instruction for a in g.attributes)
        assert option_text(g.options) in g.instruction


def test_price_bound_is_goal_py_rule(shop):
    # goal.py: of the first four $10 steps above the price, two drawn, the larger kept; the
    # larger of two distinct draws from four is never the smallest step.
    for g in shop.goals:
        price = shop.target(g).price
        steps = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
        assert g.price_upper in steps[1:]
        assert g.instruction.endswith(f", and price lower than {g.price_upper:.2f} dollars")
    # $985 leaves one step ($990) above it: no bound and no text
    assert price_bound(985.0, random.Random(0)) == (NO_PRICE_BOUND, "")
    # $12.50: the steps are 20, 30, 40, 50; every draw keeps one of 30, 40, 50
    draws = {price_bound(12.5, random.Random(s))[0] for s in range(200)}
    assert draws == {30.0, 40.0, 50.0}


def test_option_text_is_goal_py_clause():
    assert option_text({"color": "red", "size": "large"}) == " with color: red, and size: large"
    assert option_text({}) == ""


def test_text_names_no_attribute_the_product_lacks(shop):
    # The reward credits a goal attribute found in the title, description or features: those
    # texts must not name an attribute of the product's type that the product lacks.
    pools = {k.name: k.attributes for ks in vocab.CATEGORIES.values() for k in ks}
    for p in shop.products:
        text = " ".join([p.title, p.description, *p.features]).lower()
        for a in pools[p.product_type]:
            assert (a in text) == (a in p.attributes), (p.asin, a)


def test_save_load_round_trip(shop, tmp_path):
    shop.save(tmp_path / "shop")
    loaded = Shop.load(tmp_path / "shop")
    assert loaded.products == shop.products and loaded.goals == shop.goals
    assert loaded.manifest["seed"] == 3 and loaded.manifest["products"] == 700
    assert loaded.product(shop.goals[0].asin) == shop.target(shop.goals[0])


def test_malformed_line_names_file_line_and_field(shop, tmp_path):
    shop.save(tmp_path)
    path = tmp_path / "goals.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    row["price_upper"] = "cheap"
    lines[1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ShopFormatError, match=r"goals\.jsonl:2: field 'price_upper'"):
        Shop.load(tmp_path)


def test_shop_without_manifest_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        Shop.load(tmp_path)


def test_goal_on_a_missing_product_is_refused(shop):
    p = shop.products[0]
    g = Goal("NOPE", "i need x", (), {}, 10.0, p.product_type, p.category, p.query)
    with pytest.raises(ShopFormatError, match="NOPE"):
        Shop((p,), (g,))
    with pytest.raises(ShopFormatError, match="two products"):
        Shop((p, p), ())
    with pytest.raises(ShopFormatError, match="missing field 'title'"):
        Product.from_dict({k: v for k, v in p.to_dict().items() if k != "title"})


def test_the_reward_tells_every_option_and_attribute_apart():
    # A wrong click or a product lacking an attribute must cost the match: no two values of
    # an option group match under WebShop's option matcher (colour-normalised, token set
    # score > 85), and no two attributes of a type match or contain one another.
    from mem1_core.webshop.reward import fuzzy_match, normalize_color, option_matches

    for group, values in vocab.OPTION_VALUES.items():
        for a, b in itertools.combinations(values, 2):
            assert not fuzzy_match(normalize_color(a), normalize_color(b)), (group, a, b)
        # as goal.py hands a synthetic goal's options: the right value bought matches its
        # (group, value) pair, any other value of the group does not
        for a in values:
            wanted = [(vocab.group_name(group), a)]
            assert [option_matches([b], wanted) for b in values] == [b == a for b in values]
    for kinds in vocab.CATEGORIES.values():
        for kind in kinds:
            assert len({vocab.group_name(k) for k in kind.options}) == len(kind.options)
            for a, b in itertools.permutations(kind.attributes, 2):
                assert not fuzzy_match(a, b) and a not in b, (kind.name, a, b)


def test_cli_writes_the_embedded_shop(tmp_path, capsys):
    from mem1_core.cli.main import main

    out = tmp_path / "shop"
    assert (
        main(["data", "shop", "--seed", "3", "--products", "70", "--goals", "5", "--out", str(out)])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert (summary["products"], summary["goals"]) == (70, 5)
    assert Shop.load(out).goals == generate_shop(3, 70, 5).goals
    # A save that dies midway (here: goals.jsonl cannot be replaced, a directory stands in
    # its place) leaves no manifest, so the directory no longer reads as a complete shop.
    (out / "goals.jsonl").unlink()
    (out / "goals.jsonl").mkdir()
    with pytest.raises(OSError):
        generate_shop(4, 70, 5).save(out)
    with pytest.raises(FileNotFoundError, match="did not finish"):
        Shop.load(out)
    assert main(["data", "shop", "--products", "0", "--out", str(out)]) == 2
