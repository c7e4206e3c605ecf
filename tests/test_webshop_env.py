"""WebShop's pages, actions and episodes on a hand-built shop.

Pages are checked against the text of our `lines` format (written out here by hand), the
rules against WebShop's text environment (clicks only on what the page shows, options replace
within a group, Buy Now ends with the reward of what was bought; tests/test_webshop_fidelity.py
pins the rest to WebShop's code), and episodes by driving the real environment with
hand-written turns.
"""

from __future__ import annotations

import pytest

from mem1_core.trajectory.record import Action, Trajectory, Turn
from mem1_core.webshop.catalog import Goal, Product, Shop
from mem1_core.webshop.env import (
    FORMAT_HINT,
    NO_ANSWER,
    WebShopEnvironment,
    shop_tasks,
    webshop_prompt,
)
from mem1_core.webshop.pages import Page, PageKind, apply, clickables, parse_action
from mem1_core.webshop.reward import webshop_reward
from mem1_core.webshop.views import render

SHOES = "clothing, shoes & jewelry › shoes › running shoes"


def _product(asin: str, title: str, price: float, attrs: tuple[str, ...], options) -> Product:
    return Product(
        asin=asin,
        category="fashion",
        product_type="running shoes",
        title=title,
        price=price,
        attributes=attrs,
        options=options,
        description=f"{title}: made to last.",
        features=("Breathable mesh.", "Rubber sole."),
        reviews=("Rated 5 out of 5: great shoes.",),
        query="running shoes",
        product_category=SHOES,
    )


PRODUCTS = (
    _product(
        "B0AAAAAAA1",
        "Zeta Non Slip Running Shoes",
        42.5,
        ("non slip", "breathable"),
        {"size": ("8", "9", "10"), "color": ("black", "red")},
    ),
    _product("B0AAAAAAA2", "Omo Trail Running Shoes", 30.0, ("waterproof",), {"size": ("8", "9")}),
    _product("B0AAAAAAA3", "Kiva Canvas Sneakers", 25.0, ("lightweight",), {}),
)
GOAL = Goal(
    asin="B0AAAAAAA1",
    instruction="i need non slip running shoes with size: 9, and color: red, and price lower "
    "than 50.00 dollars",
    attributes=("non slip",),
    options={"size": "9", "color": "red"},
    price_upper=50.0,
    product_type="running shoes",
    category="fashion",
    query="running shoes",
    name="Zeta Non Slip Running Shoes",
    product_category=SHOES,
)
SHOP = Shop(PRODUCTS, (GOAL,))
BY_ASIN = {p.asin: p for p in PRODUCTS}


def search_all(keywords: str) -> list[str]:
    """A search that lists every product whose title shares a word with the keywords."""
    words = set(keywords.lower().split())
    return [p.asin for p in PRODUCTS if words & set(p.title.lower().split())]


def go(page: Page, action: str, per_page: int = 2) -> Page:
    out = apply(page, *parse_action(action), BY_ASIN.__getitem__, search_all, per_page)
    assert out is not None, action
    return out.page


# ---- pages ---------------------------------------------------------------------------------


def test_pages_render_as_webshops_text_mode() -> None:
    assert render(Page(), BY_ASIN.__getitem__, 2) == "[Search]"
    results = go(Page(), "search[running shoes]")
    assert render(results, BY_ASIN.__getitem__, 2) == "\n".join(
        [
            "[Back to Search]",
            "Page 1 (Total results: 2)",
            "[Next >]",
            "[B0AAAAAAA1]",
            "Zeta Non Slip Running Shoes",
            "$42.5",
            "[B0AAAAAAA2]",
            "Omo Trail Running Shoes",
            "$30.0",
        ]
    )
    item = go(results, "click[B0AAAAAAA1]")
    assert render(item, BY_ASIN.__getitem__, 2) == "\n".join(
        [
            "[Back to Search]",
            "[< Prev]",
            "size [8][9][10]",
            "color [black][red]",
            "Zeta Non Slip Running Shoes",
            "Price: $42.5",
            "Rating: N.A.",
            "[Description]",
            "[Features]",
            "[Reviews]",
            "[Buy Now]",
        ]
    )
    features = go(item, "click[Features]")
    assert render(features, BY_ASIN.__getitem__, 2) == (
        "[Back to Search]\n[< Prev]\nBreathable mesh.\nRubber sole."
    )


def test_results_pages_next_and_prev() -> None:
    results = go(Page(), "search[shoes sneakers]", per_page=2)  # three results, two a page
    assert results.results == ("B0AAAAAAA1", "B0AAAAAAA2", "B0AAAAAAA3")
    text = render(results, BY_ASIN.__getitem__, 2)
    assert "Page 1 (Total results: 3)" in text and "[Next >]" in text and "[< Prev]" not in text
    second = go(results, "click[Next >]")
    text = render(second, BY_ASIN.__getitem__, 2)
    assert text.splitlines()[:4] == [
        "[Back to Search]", "Page 2 (Total results: 3)", "[< Prev]", "[Next >]",
    ]  # fmt: skip
    assert "[B0AAAAAAA3]" in text and "[B0AAAAAAA1]" not in text
    assert go(second, "click[< Prev]").page_no == 1
    # on page 2 only its own items can be clicked
    assert apply(second, "click", "B0AAAAAAA1", BY_ASIN.__getitem__, search_all, 2) is None


def test_clicks_only_on_what_the_page_shows() -> None:
    no = []
    results = go(Page(), "search[running]")
    item = go(results, "click[b0aaaaaaa1]")  # WebShop compares lowercased values
    assert item.kind is PageKind.ITEM and item.asin == "B0AAAAAAA1"
    for page, action in [
        (Page(), "click[Buy Now]"),  # the search page has only the search bar
        (results, "click[Buy Now]"),
        (results, "click[B0AAAAAAA3]"),  # not among these results
        (item, "click[11]"),  # not one of its sizes
        (item, "click[B0AAAAAAA2]"),
    ]:
        if apply(page, *parse_action(action), BY_ASIN.__getitem__, search_all, 10) is not None:
            no.append(action)
    assert no == []
    assert parse_action("buy[it]") is None and parse_action("click red") is None
    assert parse_action("search[]") is None  # WebShop's pattern needs a character inside
    assert parse_action(" click[Buy Now] ") == ("click", "Buy Now")
    assert set(clickables(item, BY_ASIN["B0AAAAAAA1"], 10)) == {
        "back to search", "< prev", "8", "9", "10", "black", "red",
        "description", "features", "reviews", "buy now",
    }  # fmt: skip


def test_options_replace_within_a_group_and_reset_on_a_new_item() -> None:
    item = go(go(Page(), "search[running]"), "click[B0AAAAAAA1]")
    item = go(go(go(item, "click[8]"), "click[red]"), "click[9]")
    assert item.options == {"color": "red", "size": "9"}
    assert "size [8][9][10] (selected: 9)" in render(item, BY_ASIN.__getitem__, 10)
    # a detail page and back keep the selection; back to the results and in again clears it
    assert go(go(item, "click[Reviews]"), "click[< Prev]").options == item.options
    back = go(go(item, "click[< Prev]"), "click[B0AAAAAAA1]")
    assert back.kind is PageKind.ITEM and back.options == {}
    assert go(item, "click[Back to Search]") == Page()
    out = apply(item, "click", "Buy Now", BY_ASIN.__getitem__, search_all, 10)
    assert out is not None and out.bought is BY_ASIN["B0AAAAAAA1"]


# ---- episodes ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok():
    from mem1_core.models.tokenizer import train_tiny_tokenizer

    texts = [webshop_prompt(GOAL.instruction)] + [
        render(p, BY_ASIN.__getitem__, 10)
        for p in (go(go(Page(), "search[running]"), "click[B0AAAAAAA1]"),)
    ]
    return train_tiny_tokenizer(texts * 4, 600)


def env_of(tok) -> WebShopEnvironment:
    return WebShopEnvironment(tok, {"s": SHOP}, results_per_page=10, max_results=50)


def play(env: WebShopEnvironment, turns: list[str], max_turns: int = 8) -> Trajectory:
    """Drive the environment with hand-written turns, one step each, as the rollout does."""
    [task] = shop_tasks(SHOP, "s")
    tr = Trajectory(task.task_id, "mem1", env.encode_prompt(task.prompt), task.golden_answers)
    tr.max_turns = max_turns
    for text in turns:
        assert not tr.done
        tr.turns.append(Turn([], env.encode(text), [], Action.INVALID))
        env.step([tr])
    return tr


def act(action: str) -> str:
    return f"<IS> shopping </IS><query>{action}</query>"


def test_an_episode_ends_at_buy_now_with_the_reward_of_what_was_bought(tok) -> None:
    env = env_of(tok)
    actions = ["search[non slip running shoes]", "click[B0AAAAAAA1]", "click[9]", "click[red]"]
    tr = play(env, [act(a) for a in actions + ["click[Buy Now]"]])
    assert tr.done and tr.format_errors == 0
    assert [t.action for t in tr.turns] == [Action.QUERY] + [Action.CLICK] * 4
    assert [t.query for t in tr.turns][:4] == actions
    # the target, every option, under the bound, the same title: goal.py gives 1
    assert tr.reward == 1.0 and tr.em == [1.0] and tr.answer == "B0AAAAAAA1 (size: 9, color: red)"
    # each observation is the page the action led to, in the <info> block
    assert "Page 1 (Total results: " in tr.turns[0].info_text
    assert tr.turns[2].info_text.startswith("<info>[Back to Search]\n[< Prev]\nsize [8][9][10]")
    assert "(selected: 9)" in tr.turns[2].info_text
    assert tr.turns[0].info_ids == env.encode(tr.turns[0].info_text)
    assert tr.turns[-1].info_ids == []  # the episode ended: no observation


def test_buying_without_the_options_scores_what_goal_py_gives(tok) -> None:
    env = env_of(tok)
    tr = play(env, [act("search[running]"), act("click[B0AAAAAAA1]"), act("click[Buy Now]")])
    # by hand: attribute 1/1 (non slip), options 0/2, price 1: (1 + 0 + 1) / (1 + 2 + 1) * 1
    assert tr.reward == pytest.approx(0.5) and tr.em == [0.0]
    tr = play(
        env,
        [act("search[trail]"), act("click[B0AAAAAAA2]"), act("click[9]")] + [act("click[Buy Now]")],
    )
    expected = webshop_reward(GOAL, BY_ASIN["B0AAAAAAA2"], {"size": "9"}, 30.0)
    assert tr.reward == pytest.approx(expected.total) and tr.reward < 1.0


def test_invalid_actions_leave_the_page_and_count_as_format_errors(tok) -> None:
    env = env_of(tok)
    turns = [
        act("search[running]"),
        act("click[Buy Now]"),  # not on a results page
        act("Click[B0AAAAAAA1]"),  # WebShop's verbs are lowercase
        act("buy[B0AAAAAAA1]"),  # not an action
        "<IS> s </IS><answer> B0AAAAAAA1 </answer>",  # WebShop has no answer
        "<query>click[B0AAAAAAA1]</query>",  # no state: MEM1's format
        act("click[B0AAAAAAA1]"),
    ]
    tr = play(env, turns, max_turns=10)
    assert [t.action for t in tr.turns] == [Action.QUERY] + [Action.INVALID] * 5 + [Action.CLICK]
    assert tr.format_errors == 5 and not tr.done
    assert tr.turns[4].format_error == NO_ANSWER
    results_page = tr.turns[0].info_text.split("\n[HINT]")[0].removeprefix("<info>")
    for t in tr.turns[1:6]:  # the page stays, shown again after the hint
        body = t.info_text.removeprefix("<info>")
        assert body.startswith(FORMAT_HINT) and results_page.split("\n", 1)[1] in body
    assert env.page(tr).kind is PageKind.ITEM and env.page(tr).asin == "B0AAAAAAA1"


def test_the_turn_budget_ends_the_episode_with_reward_0(tok) -> None:
    env = env_of(tok)
    tr = play(env, [act("search[running]"), act("click[B0AAAAAAA1]"), act("click[9]")], 3)
    assert tr.done and tr.reward == 0.0 and tr.answer is None
    # the hint counts down in every observation
    assert "[HINT] You have 2 turns left." in tr.turns[0].info_text
    assert "[HINT] This is your last turn" in tr.turns[1].info_text


def test_tasks_and_metrics(tok) -> None:
    env = env_of(tok)
    [task] = shop_tasks(SHOP, "s")
    assert task.task_id == "s/0" and env.goal(task.task_id) is GOAL
    assert GOAL.instruction in task.prompt and task.prompt.rstrip().endswith("[Search]")
    won = play(env, [act(a) for a in ["search[running]", "click[B0AAAAAAA1]", "click[9]"]]
               + [act("click[red]"), act("click[Buy Now]")])  # fmt: skip
    half = play(env, [act("search[running]"), act("click[B0AAAAAAA1]"), act("click[Buy Now]")])
    lost = play(env, [act("buy[x]"), act("search[running]")], 2)
    m = env.metrics([won, half, lost])
    assert m["reward_x100"] == pytest.approx(100 * (1.0 + 0.5 + 0.0) / 3)
    assert m["success_rate"] == pytest.approx(1 / 3)
    assert m["turns"] == pytest.approx((5 + 3 + 2) / 3)
    assert m["format_errors"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="non-empty instruction"):
        webshop_prompt("  ")
    with pytest.raises(KeyError, match="no shop named"):
        env.goal("other/0")


# ---- the scripted teacher ------------------------------------------------------------------


def test_the_teacher_buys_the_goal_with_its_options(tok) -> None:
    from mem1_core.config import RolloutConfig
    from mem1_core.rollout.loop import rollout
    from mem1_core.webshop.teacher import WebShopTeacher

    env = env_of(tok)
    cfg = RolloutConfig(turns_base=8, turns_per_objective=0, gen_tokens_base=96)
    for memory in ("mem1", "full"):
        [tr] = rollout(shop_tasks(SHOP, "s"), WebShopTeacher(tok, env), env, cfg, memory=memory)
        assert tr.format_errors == 0 and tr.done
        assert tr.answer == "B0AAAAAAA1 (size: 9, color: red)" and tr.reward == 1.0
        assert tr.turns[0].query == "search[non slip 9 red running shoes]"
        # its state folds in what the instruction asks for
        assert "Need running shoes; non slip; size 9, color red; under $50." in tr.turns[0].gen_text


def test_the_teacher_goes_back_from_an_item_without_an_asked_option() -> None:
    """The best-looking title (type + attribute + price) lacks the asked colour: the teacher
    goes back and buys an item that offers it."""
    from mem1_core.config import RolloutConfig
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.rollout.loop import rollout
    from mem1_core.webshop.run import tokenizer_texts
    from mem1_core.webshop.teacher import WebShopTeacher

    black_only = _product(
        "B0AAAAAAA4", "Omo Waterproof Running Shoes", 20.0, ("waterproof",), {"color": ("black",)}
    )
    target = _product(
        "B0AAAAAAA5", "Lumo Running Shoes", 22.0, ("waterproof",), {"color": ("red", "black")}
    )
    goal = Goal(
        asin=target.asin,
        instruction="i need waterproof running shoes with color: red",
        attributes=("waterproof",),
        options={"color": "red"},
        price_upper=40.0,
        product_type="running shoes",
        category="fashion",
        query="running shoes",
        name=target.title,
        product_category=SHOES,
    )
    shop = Shop((*PRODUCTS, black_only, target), (goal,))
    tok = train_tiny_tokenizer(tokenizer_texts(shop) * 4, 600)
    env = WebShopEnvironment(tok, {"s": shop})
    cfg = RolloutConfig(turns_base=10, turns_per_objective=0, gen_tokens_base=96)
    [tr] = rollout(shop_tasks(shop, "s"), WebShopTeacher(tok, env), env, cfg, memory="mem1")
    queries = [t.query for t in tr.turns]
    assert queries[1:3] == ["click[B0AAAAAAA4]", "click[< Prev]"]
    assert tr.done and tr.format_errors == 0 and tr.answer.endswith("(color: red)")
    assert "Tried B0AAAAAAA4." in tr.turns[3].gen_text  # its state says what it ruled out


def test_the_teacher_shops_well_on_an_embedded_shop() -> None:
    """On a generated shop every turn is valid, every task ends in a purchase, and the mean
    reward is high (measured on a 2,000-product shop: 0.96)."""
    from mem1_core.config import RolloutConfig
    from mem1_core.models.tokenizer import train_tiny_tokenizer
    from mem1_core.rollout.loop import rollout
    from mem1_core.webshop.generate import generate_shop
    from mem1_core.webshop.run import tokenizer_texts
    from mem1_core.webshop.teacher import WebShopTeacher

    shop = generate_shop(3, 300, 24)
    tok = train_tiny_tokenizer(tokenizer_texts(shop), 1500)
    env = WebShopEnvironment(tok, {"s": shop})
    cfg = RolloutConfig(turns_base=10, turns_per_objective=0, gen_tokens_base=128)
    trajs = rollout(shop_tasks(shop, "s"), WebShopTeacher(tok, env), env, cfg, memory="mem1")
    assert all(t.done and t.answer is not None and t.format_errors == 0 for t in trajs)
    assert sum(t.reward for t in trajs) / len(trajs) >= 0.8
    # the shop's tokenizer texts cover every character the pages and the teacher write
    assert not any(tok.unk_token in t.gen_text + t.info_text for tr in trajs for t in tr.turns)
