"""The domain pinned to WebShop's own definitions (princeton-nlp/WebShop: engine/goal.py,
engine/engine.py, envs/web_agent_text_env.py and the page templates) and to MEM1's WebShop
setting (its WebShopEnv and rollout). Every expected value here is written out from what that
code does, worked by hand in the comments, on small files in WebShop's released format.
"""

from __future__ import annotations

import itertools
import json
import random

import pytest

from mem1_core.config import load_config
from mem1_core.trajectory.record import Action, Trajectory, Turn
from mem1_core.webshop.catalog import Goal, Product, Shop, ShopFormatError
from mem1_core.webshop.convert import convert_webshop
from mem1_core.webshop.env import FORMAT_ERROR_REWARD, WebShopEnvironment, shop_tasks
from mem1_core.webshop.pages import Page, PageKind, apply, parse_action
from mem1_core.webshop.reward import fuzzy_score, goal_options, webshop_reward
from mem1_core.webshop.views import available_actions, render, render_webshop

# ---- the split: WebShop's text environment shuffles its goals with random.seed(233) ---------


def _item(asin: str, colors: int, sizes: int) -> dict:
    """An item of items_shuffle.json whose options make colors x sizes synthetic goals."""
    return {
        "asin": asin,
        "name": f"Acme Shirt {asin}",
        "full_description": "A shirt.",
        "small_description": ["Cotton"],
        "pricing": "$12.99 - $24.99",
        "customization_options": {
            "Size": [{"value": f"S{j}"} for j in range(sizes)],
            "Color": [{"value": f"C{j}"} for j in range(colors)],
        },
        "category": "fashion",
        "query": "shirts",
        "product_category": "Clothing › Men › Shirts",
        "images": ["x.jpg"],
    }


@pytest.fixture(scope="module")
def big_shop(tmp_path_factory):
    """Five products of 20 colours x 21 sizes: 2,100 synthetic goals, more than WebShop's test
    and dev sets together."""
    d = tmp_path_factory.mktemp("big")
    items = [_item(f"B00000000{i}", 20, 21) for i in range(5)]
    ins = {
        it["asin"]: {
            "attributes": ["cotton"],
            "instruction": f"i need a cotton shirt {i}",
            "instruction_attributes": ["cotton"],
        }
        for i, it in enumerate(items)
    }
    (d / "items.json").write_text(json.dumps(items))
    (d / "ins.json").write_text(json.dumps(ins))
    shop, _ = convert_webshop(d / "items.json", d / "ins.json")
    shop.save(d / "shop")
    return shop, d / "shop"


def test_goals_come_in_goal_pys_order(big_shop) -> None:
    # get_synthetic_goals: products in file order; per product, itertools.product over the
    # option names sorted (color before size), values in the page's order
    shop, _ = big_shop
    expected = [
        (f"B00000000{i}", f"c{c}", f"s{s}")
        for i in range(5)
        for c, s in itertools.product(range(20), range(21))
    ]
    got = [(g.asin, g.options["color"], g.options["size"]) for g in shop.goals]
    assert got == expected and len(got) == 2100


def _webshop_order(goals: list) -> list:
    """SimServer.__init__: random.seed(233); random.shuffle(self.goals) (the module's own
    generator, its state put back afterwards)."""
    state = random.getstate()
    try:
        shuffled = list(goals)
        random.seed(233)
        random.shuffle(shuffled)
        return shuffled
    finally:
        random.setstate(state)


def test_test_dev_and_train_are_webshops_split(big_shop) -> None:
    from mem1_core.webshop.run import split_goals

    shop, shop_dir = big_shop
    cfg = load_config("webshop-smoke", None, [f"env.shop_dir={shop_dir}"])
    served = _webshop_order(list(shop.goals))
    for split, (start, end) in {
        "test": (0, 500),
        "dev": (500, 1500),
        "train": (1500, 2100),
    }.items():
        name, indices = split_goals(cfg, split)
        assert name == "shop" and [shop.goals[i] for i in indices] == served[start:end], split
    # MEM1's data script: session index < 500 is test, the rest train; no dev set
    cfg = load_config("webshop-smoke", None, [f"env.shop_dir={shop_dir}", "env.goal_split=mem1"])
    assert [shop.goals[i] for i in split_goals(cfg, "test")[1]] == served[:500]
    assert [shop.goals[i] for i in split_goals(cfg, "train")[1]] == served[500:]
    with pytest.raises(ValueError, match="no dev split"):
        split_goals(cfg, "dev")


def test_task_files_list_the_test_goals_in_webshops_order(big_shop, tmp_path) -> None:
    import pyarrow.parquet as pq

    from mem1_core.runs.layout import RunPaths
    from mem1_core.webshop.run import ensure_shop_tasks

    shop, shop_dir = big_shop
    cfg = load_config("webshop-smoke", None, [f"env.shop_dir={shop_dir}", "data.max_eval_tasks=7"])
    out = ensure_shop_tasks(cfg, RunPaths(tmp_path / "run"), "test", 1)
    ids = pq.read_table(out, columns=["task_id"]).column("task_id").to_pylist()
    served = _webshop_order(list(range(len(shop.goals))))
    assert ids == [f"shop/{i}" for i in served[:7]]


# ---- the reward: goal.py hands a synthetic goal's options as (group, value) pairs ------------


SHIRTS = "clothing › men › shirts"


def _product(options: dict[str, tuple[str, ...]], description: str | None = "A shirt.") -> Product:
    return Product(
        asin="B0SHIRT001",
        category="fashion",
        product_type="shirts",
        title="Acme Cotton Shirt",
        price=20.0,
        attributes=("cotton",),
        options=options,
        description=description,
        features=("Soft.",),
        reviews=(),
        query="shirts",
        product_category=SHIRTS,
    )


def _goal(options: dict[str, str] | None, source: str = "synthetic", attrs=("cotton",)) -> Goal:
    return Goal(
        asin="B0SHIRT001",
        instruction="i need a cotton shirt",
        attributes=attrs,
        options=options,
        price_upper=30.0,
        product_type="shirts",
        category="fashion",
        query="shirts",
        name="Acme Cotton Shirt",
        product_category=SHIRTS,
        source=source,
    )


def test_a_pair_is_scored_as_thefuzz_scores_its_str() -> None:
    # thefuzz.utils.full_process(asciidammit(str(("size", "large")))) = "size   large":
    # tokens {size, large}; bought "x-large" -> {x, large}. Shared "large"; the three
    # ratios: ("large", "large x") 2*5/12 = 83.3, ("large", "large size") 2*5/15 = 66.7,
    # ("large x", "large size") 2*6/17 = 70.6: the best rounds to 83, not above 85
    assert fuzzy_score("x-large", ("size", "large")) == 83
    # by value: {x, large} holds {large}: ratio("large", "large") = 100
    assert fuzzy_score("x-large", "large") == 100


@pytest.mark.parametrize(
    ("wanted", "bought", "webshop", "value"),
    [
        # (1 attribute + options matched + price) / (1 + 1 + 1): the pair is stricter here
        ({"size": "large"}, "x-large", 2 / 3, 1.0),
        # {large} is inside {size, x, large}: 100 both ways
        ({"size": "x-large"}, "large", 1.0, 1.0),
        # normalize_color on a pair asks whether either string *is* a colour: ("color",
        # "light pink") is none, so its text "color light pink" holds the bought "pink";
        # by value "light pink" becomes "light" (the first colour of the list inside it)
        ({"color": "light pink"}, "pink", 1.0, 2 / 3),
        # ("color", "red") holds "red" exactly: it becomes "red"; "dark red" bought becomes
        # "dark": no match either way
        ({"color": "red"}, "dark red", 2 / 3, 2 / 3),
    ],
)
def test_synthetic_goals_options_as_goal_py_hands_them(wanted, bought, webshop, value) -> None:
    group = next(iter(wanted))
    p = _product({group: (bought, "other")})
    g = _goal(wanted)
    got = webshop_reward(g, p, {group: bought}, 20.0)
    assert got.total == pytest.approx(webshop)
    assert goal_options(g) == list(wanted.items())
    named = webshop_reward(g, p, {group: bought}, 20.0, option_match="value")
    assert named.total == pytest.approx(value)


def test_human_goals_options_are_values_either_way() -> None:
    # get_human_goals: goal_options is the instruction's list of values
    p = _product({"size": ("x-large", "small")})
    g = _goal({"size": "large"}, source="human")
    assert goal_options(g) == ["large"]
    for mode in ("webshop", "value"):
        assert webshop_reward(g, p, {"size": "x-large"}, 20.0, option_match=mode).total == 1.0


def test_null_fields_fail_only_where_goal_py_reads_them() -> None:
    p = _product({"size": ("m",)}, description=None)
    # "cotton" is among the product's attributes: the description is never read
    assert webshop_reward(_goal({"size": "m"}), p, {"size": "m"}, 20.0).total == 1.0
    # "machine wash" is not: goal.py goes on to title, bullets, then Description.lower()
    with pytest.raises(ShopFormatError, match="no description"):
        webshop_reward(_goal({}, attrs=("machine wash",)), p, {}, 20.0)
    with pytest.raises(ShopFormatError, match="null instruction_options"):
        webshop_reward(_goal(None, source="human"), _product({}), {}, 20.0)


# ---- pages and actions, as the text environment has them -------------------------------------

RED = Product(
    asin="B000000001",
    category="fashion",
    product_type="shoes",
    title="Red Shoes",
    price=13.5,
    attributes=("a",),
    options={"color": ("red", "blue [x]", "black"), "size": ("small", "red")},
    description="desc text",
    features=("bullet one",),
    reviews=(),
    query="q",
    product_category="a › b › c",
    price_text="$12.99 to $24.99",
)
BLUE = Product(
    asin="B000000002",
    category="fashion",
    product_type="shoes",
    title="Blue Shoes",
    price=5.0,
    attributes=("a",),
    options={},
    description=None,
    features=(),
    reviews=(),
    query="q",
    product_category="a › b › c",
)
BY_ASIN = {p.asin: p for p in (RED, BLUE)}
INSTRUCTION = "i need a thing"


def _go(page: Page, action: str) -> Page | None:
    parsed = parse_action(action)
    if parsed is None:
        return None
    out = apply(page, *parsed, BY_ASIN.__getitem__, lambda kw: [RED.asin, BLUE.asin], 10)
    return None if out is None else out.page


def _sep(page: Page) -> str:
    return render_webshop(page, BY_ASIN.__getitem__, 10, INSTRUCTION)


def test_webshops_text_pages() -> None:
    # convert_html_to_text(simple=True) of each template: visible texts stripped, " [SEP] "
    assert _sep(Page()) == "WebShop [SEP] Instruction: [SEP] i need a thing [SEP] Search"
    results = _go(Page(), "search[Shoes]")
    assert results.keywords == "shoes"  # the text environment lowercases the argument
    assert _sep(results) == (
        "Instruction: [SEP] i need a thing [SEP] Back to Search [SEP] Page 1 (Total results: 2) "
        "[SEP] Next > [SEP] B000000001 [SEP] Red Shoes [SEP] $12.99 to $24.99 [SEP] B000000002 "
        "[SEP] Blue Shoes [SEP] $5.0"
    )
    # results_page.html shows Next > on every page, < Prev from page 2: past the last page
    second = _go(results, "click[next >]")
    assert _sep(second) == (
        "Instruction: [SEP] i need a thing [SEP] Back to Search [SEP] Page 2 (Total results: 2) "
        "[SEP] < Prev [SEP] Next >"
    )
    assert _go(_go(second, "click[next >]"), "click[< prev]").page_no == 2
    item = _go(results, "click[b000000001]")
    assert _sep(item) == (
        "Instruction: [SEP] i need a thing [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] "
        "red [SEP] blue [x] [SEP] black [SEP] size [SEP] small [SEP] red [SEP] Red Shoes [SEP] "
        "Price: $12.99 to $24.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] "
        "Reviews [SEP] Buy Now"
    )
    assert _sep(_go(item, "click[description]")).endswith(
        "Back to Search [SEP] < Prev [SEP] desc text"
    )
    assert _sep(_go(item, "click[features]")).endswith("< Prev [SEP] bullet one")
    # a null full_description: the template writes "None"
    blue = _go(_go(results, "click[b000000002]"), "click[description]")
    assert _sep(blue).endswith("< Prev [SEP] None")
    # our lines format shows the same price text, never the drawn price
    assert "Price: $12.99 to $24.99" in render(item, BY_ASIN.__getitem__, 10)
    assert "$13.5" not in render(item, BY_ASIN.__getitem__, 10)


def test_mem1s_available_actions() -> None:
    # WebShopEnv.get_available_actions: 'search[<content>]' where the search bar is, then
    # click[key] for every key of text_to_clickable but 'search': buttons and result links
    # lowercased, in page order, then the option values (a repeated value keeps its first place)
    def actions(page: Page) -> list[str]:
        return available_actions(page, BY_ASIN.__getitem__, 10)

    results = _go(Page(), "search[shoes]")
    item = _go(results, "click[B000000001]")
    assert actions(Page()) == ["search[<content>]"]
    assert actions(results) == [
        "click[back to search]", "click[next >]", "click[b000000001]", "click[b000000002]",
    ]  # fmt: skip
    assert actions(_go(results, "click[next >]")) == [
        "click[back to search]", "click[< prev]", "click[next >]",
    ]  # fmt: skip
    assert actions(item) == [
        "click[back to search]", "click[< prev]", "click[description]", "click[features]",
        "click[reviews]", "click[buy now]", "click[red]", "click[blue [x]]", "click[black]",
        "click[small]",
    ]  # fmt: skip
    assert actions(_go(item, "click[reviews]")) == ["click[back to search]", "click[< prev]"]


def test_actions_as_the_text_environment_reads_them() -> None:
    results = _go(Page(), "search[shoes]")
    item = _go(results, "click[B000000001]")
    # search[...] runs from any page: step() calls browser.search wherever it is written
    for page in (results, item, _go(item, "click[features]")):
        assert _go(page, "search[blue shoes]").kind is PageKind.RESULTS
    # parse_action: (.+)\[(.+)\] from the start, the verb compared exactly
    assert parse_action("click[red] now") == ("click", "red")
    for text in ("Click[red]", "CLICK[red]", "Search[shoes]", "search [shoes]", "click[]"):
        assert parse_action(text) is None, text
    # "click[blue [x]]" splits at its last "[": the verb "click[blue " is no verb
    assert parse_action("click[blue [x]]") is None
    # the argument is lowercased, not stripped
    assert _go(item, "click[RED]") is not None and _go(item, "click[ red]") is None
    # "red" is a colour and a size: the size's radio button is the later key, so it wins
    assert _go(item, "click[red]").options == {"size": "red"}
    assert _go(_go(item, "click[black]"), "click[red]").options == {"color": "black", "size": "red"}
    # < Prev is no action on the first results page; Back to Search is on every page
    assert _go(results, "click[< prev]") is None
    assert _go(item, "click[back to search]") == Page()


# ---- MEM1's setting: its observation, and a broken tag format ends the episode with -1 ---------


@pytest.fixture(scope="module")
def mem1_env():
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.webshop.run import tokenizer_texts

    goal = Goal.of(RED, INSTRUCTION, ["a"], {"color": "black"}, 30.0)
    shop = Shop((RED, BLUE), (goal,))
    tok = train_tiny_tokenizer(tokenizer_texts(shop) * 4, 800)
    env = WebShopEnvironment(
        tok, {"s": shop}, observation="webshop", format_error="end", max_results=10
    )
    return env, shop


def _play(env: WebShopEnvironment, shop: Shop, turns: list[str]) -> Trajectory:
    [task] = shop_tasks(shop, "s", observation="webshop")
    tr = Trajectory(task.task_id, "mem1", env.encode_prompt(task.prompt), task.golden_answers)
    tr.max_turns = 10
    for text in turns:
        tr.turns.append(Turn([], env.encode(text), [], Action.INVALID))
        env.step([tr])
    return tr


def test_mem1s_setting(mem1_env) -> None:
    env, shop = mem1_env
    [task] = shop_tasks(shop, "s", observation="webshop")
    # MEM1's first state: prepare_render_cache(get_instruction_text())
    assert task.prompt.endswith(
        "Instruction: i need a thing\nAvailable actions: search[<content>]\n"
    )
    tr = _play(env, shop, ["<IS> s </IS><query>search[shoes]</query>"])
    assert tr.turns[0].info_text.startswith(
        "<info>Instruction: [SEP] i need a thing [SEP] Back to Search [SEP] Page 1"
    )
    assert "\n\nCurrent available actions: ['click[back to search]', 'click[next >]'," in (
        tr.turns[0].info_text
    )
    # an action the page does not offer: WebShop does nothing, the same page comes back
    tr = _play(env, shop, ["<IS> s </IS><query>search[shoes]</query>",
                           "<IS> s </IS><query>click[buy now]</query>"])  # fmt: skip
    assert not tr.done and tr.turns[1].action is Action.INVALID
    body = tr.turns[1].info_text.split("\n[HINT]")[0]
    assert body == tr.turns[0].info_text.split("\n[HINT]")[0]
    # a broken tag format: the episode ends with -1 (MEM1's check_valid_status)
    for broken in ("<query>search[shoes]</query>", "<IS> s </IS><answer>B000000001</answer>"):
        tr = _play(env, shop, ["<IS> s </IS><query>search[shoes]</query>", broken])
        assert tr.done and tr.reward == FORMAT_ERROR_REWARD == -1.0 and tr.answer is None
        assert tr.turns[-1].info_ids == []


def test_mem1s_profile() -> None:
    cfg = load_config("webshop-mem1")
    assert (cfg.env.observation, cfg.env.format_error, cfg.env.goal_split) == (
        "webshop", "end", "mem1",
    )  # fmt: skip
    assert cfg.rollout.turns_base == 10 and cfg.rollout.turns_per_objective == 0


# ---- conversion: null fields are kept; conflicting flags fail in one line ---------------------


def test_null_fields_do_not_stop_a_conversion(tmp_path) -> None:
    items = [_item("B000000001", 2, 1), _item("B000000002", 1, 1)]
    items[1]["full_description"] = None
    ins = {it["asin"]: {"attributes": ["cotton"], "instruction": "i need a shirt",
                        "instruction_attributes": ["cotton"]} for it in items}  # fmt: skip
    human = {"B000000001": [{"instruction": "a shirt", "instruction_attributes": ["cotton"],
                             "instruction_options": None}]}  # fmt: skip
    for name, data in (("items", items), ("ins", ins), ("human", human)):
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    shop, _ = convert_webshop(tmp_path / "items.json", tmp_path / "ins.json")
    assert shop.product("B000000002").description is None
    assert shop.product("B000000001").shown_price == "$12.99 to $24.99"
    shop.save(tmp_path / "shop")
    assert Shop.load(tmp_path / "shop").product("B000000002").description is None
    shop, _ = convert_webshop(
        tmp_path / "items.json", tmp_path / "ins.json", tmp_path / "human.json"
    )
    (g,) = shop.goals
    assert g.options is None and g.source == "human" and g.difficulty == 1


def test_human_instructions_need_the_attributes_file(tmp_path, capsys) -> None:
    from mem1_core.cli.main import main

    (tmp_path / "items.json").write_text(json.dumps([_item("B000000001", 1, 1)]))
    (tmp_path / "human.json").write_text("{}")
    rc = main(["data", "webshop", "--items", str(tmp_path / "items.json"),
               "--human-instructions", str(tmp_path / "human.json"), "--out", str(tmp_path / "o")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--human-instructions needs --instructions" in err
