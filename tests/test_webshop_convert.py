"""The converter on small files in WebShop's released format (as its loader reads them:
web_agent_site/engine/engine.py and goal.py), written by the test."""

from __future__ import annotations

import json

import pytest

from mem1_core.cli.main import main
from mem1_core.webshop.catalog import Shop, ShopFormatError
from mem1_core.webshop.convert import convert_webshop, parse_pricing
from mem1_core.webshop.reward import webshop_reward


def _item(asin: str, **over) -> dict:
    item = {
        "asin": asin,
        "name": "Acme Tea Tree Shampoo",
        "full_description": "A shampoo with tea tree oil.",
        "small_description": ["Sulfate free formula", "For dry hair"],
        "pricing": "$12.99",
        "customization_options": {
            "Size": [{"value": "8 Fl Oz/Pack of 2", "image": None}, {"value": "16 fl oz"}],
            "Scent": [{"value": "Mint", "image": "x.jpg"}],
        },
        "category": "beauty",
        "query": " Shampoo ",
        "product_category": "Beauty & Personal Care › Hair Care › Shampoos",
        "images": ["x.jpg"],
    }
    item.update(over)
    return item


@pytest.fixture
def files(tmp_path):
    items = [
        _item("B000000001"),
        _item("B000000002", name="Zeta Hoodie", pricing="$10.00 - $20.00",
              customization_options={"Color": [{"value": "Red"}, {"value": "Blue"}],
                                     "Size": [{"value": "S"}, {"value": "M"}, {"value": "L"}]},
              small_description="Warm fleece", query="hoodies",
              product_category="Clothing › Men › Hoodies"),
        _item("B000000003", pricing="", customization_options=None),
        _item("nan"),  # the loader skips an asin of "nan"
        _item("B0000000041"),  # and one longer than 10 characters
        _item("B000000001", name="duplicate"),  # and one already seen
    ]  # fmt: skip
    ins = {
        "B000000001": {
            "attributes": ["tea tree", "sulfate free"],
            "instruction": "i need a tea tree shampoo",
            "instruction_attributes": ["tea tree"],
        },
        "B000000002": {
            "attributes": ["fleece lined"],
            "instruction": "i want a fleece lined hoodie",
            "instruction_attributes": ["fleece lined"],
        },
        "B000000003": {"attributes": [], "instruction": None, "instruction_attributes": None},
    }
    human = {
        "B000000001": [
            {
                "asin": "B000000001",
                "instruction": "Find me a sulfate free shampoo in mint, 16 fl oz.",
                "instruction_attributes": ["sulfate free"],
                "instruction_options": ["mint", "16 fl oz"],
                "worker_id": "w1",
            },
            {
                "instruction": "no attributes",
                "instruction_attributes": [],
                "instruction_options": [],
            },
        ],
        "B000000099": [  # no such product: ignored
            {"instruction": "x", "instruction_attributes": ["y"], "instruction_options": []}
        ],
    }
    paths = {}
    for name, data in (("items", items), ("ins", ins), ("human", human)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    return paths


def test_products_read_as_webshop_loader_reads_them(files):
    shop, report = convert_webshop(files["items"], files["ins"])
    assert [p.asin for p in shop.products] == ["B000000001", "B000000002", "B000000003"]
    assert report.skipped == {"bad asin": 2, "duplicate asin": 1}
    a, b, c = shop.products
    assert a.price == 12.99 and 10.0 <= b.price <= 20.0 and c.price == 100.0
    # groups lowercased; values stripped, lowercased, "/" -> " | "
    assert a.options == {"size": ("8 fl oz | pack of 2", "16 fl oz"), "scent": ("mint",)}
    assert c.options == {}
    assert a.attributes == ("tea tree", "sulfate free") and c.attributes == ()
    assert a.features == ("Sulfate free formula", "For dry hair") and b.features == ("Warm fleece",)
    assert a.query == "shampoo" and a.title == "Acme Tea Tree Shampoo"
    assert a.product_category == "Beauty & Personal Care › Hair Care › Shampoos"


def test_pricing_text():
    assert parse_pricing("$12.99") == [12.99]
    assert parse_pricing("$1,299.00 - $1,499.50") == [1299.0, 1499.5]
    assert parse_pricing("") == [100.0] and parse_pricing(None) == [100.0]
    with pytest.raises(ValueError, match="dollar amounts"):
        parse_pricing("twelve dollars")


def test_synthetic_goals_one_per_option_combination(files):
    shop, report = convert_webshop(files["items"], files["ins"], goals="synthetic")
    assert report.goal_kind == "synthetic"
    hoodie = [g for g in shop.goals if g.asin == "B000000002"]
    # color (2) x size (3) = 6 goals, option names sorted, one price bound for the product
    assert len(hoodie) == 6
    assert {tuple(g.options.items()) for g in hoodie} == {
        (("color", c), ("size", s)) for c in ("red", "blue") for s in ("s", "m", "l")
    }
    assert len({g.price_upper for g in hoodie}) == 1
    g = hoodie[0]
    assert g.instruction == (
        f"i want a fleece lined hoodie with color: {g.options['color']}, and size: "
        f"{g.options['size']}, and price lower than {g.price_upper:.2f} dollars"
    )
    # the shampoo: 2 sizes x 1 scent; the third product has no instruction: no goal
    assert len(shop.goals) == 6 + 2
    assert g.attributes == ("fleece lined",) and g.query == "hoodies" and g.name == "Zeta Hoodie"


def test_human_goals(files):
    shop, report = convert_webshop(files["items"], files["ins"], files["human"])
    assert report.goal_kind == "human"
    assert report.skipped["human instruction without attributes"] == 1
    (g,) = shop.goals
    # $12.99: the $10 steps above are 20, 30, 40, 50; the larger of two draws is 30-50
    assert g.price_upper in (30.0, 40.0, 50.0)
    assert g.instruction == (
        f"Find me a sulfate free shampoo in mint, 16 fl oz, and price lower than "
        f"{g.price_upper:.2f} dollars"
    )
    assert g.options == {"scent": "mint", "size": "16 fl oz"}
    # buying the target with the asked options at its price scores 1
    target = shop.target(g)
    r = webshop_reward(g, target, g.options, target.price, nouns="standin")
    assert r.total == 1.0


def test_cli_writes_a_shop_directory(files, tmp_path, capsys):
    out = tmp_path / "shop"
    rc = main(["data", "webshop", "--items", str(files["items"]), "--instructions",
               str(files["ins"]), "--human-instructions", str(files["human"]),
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["products"] == 3 and summary["goals"] == 1
    loaded = Shop.load(out)
    assert len(loaded.products) == 3 and loaded.manifest["goal_kind"] == "human"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pricing", "twelve dollars", r"items\.json: item 0 \(asin B000000001\): field 'pricing'"),
        ("name", 42, r"item 0 \(asin B000000001\): field 'name': expected a string"),
        ("customization_options", {"Size": ["s"]}, r"field 'customization_options'"),
    ],
)
def test_malformed_item_fails_naming_file_item_and_field(files, field, value, message):
    items = json.loads(files["items"].read_text())
    items[0][field] = value
    files["items"].write_text(json.dumps(items))
    with pytest.raises(ShopFormatError, match=message):
        convert_webshop(files["items"], files["ins"])


def test_malformed_files_fail_in_one_line(files, tmp_path, capsys):
    good = files["items"].read_text()
    broken = json.loads(good)
    del broken[1]["query"]
    files["items"].write_text(json.dumps(broken))
    rc = main(["data", "webshop", "--items", str(files["items"]), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "items.json: item 1 (asin B000000002): field 'query': missing" in err
    files["items"].write_text(good)
    good_ins = files["ins"].read_text()
    files["ins"].write_text(json.dumps([1, 2]))
    with pytest.raises(ShopFormatError, match=r"ins\.json: expected an object"):
        convert_webshop(files["items"], files["ins"])
    files["ins"].write_text(good_ins)
    human = {"B000000001": [{"instruction": "x", "instruction_options": []}]}
    files["human"].write_text(json.dumps(human))
    message = r"human\.json: asin B000000001 instruction 0: field 'instruction_attributes'"
    with pytest.raises(ShopFormatError, match=message):
        convert_webshop(files["items"], files["ins"], files["human"])
    with pytest.raises(ValueError, match="synthetic goals need --instructions"):
        convert_webshop(files["items"], goals="synthetic")
