"""WebShop's reward (web_agent_site/engine/goal.py) on cases worked by hand.

The formula: total = (attribute matches + option matches + [price <= bound]) / (attributes
+ options + 1) * r_type. Fuzzy scores are thefuzz's token_set_ratio: with S the sorted
shared tokens and A, B each side's sorted extra tokens, the best of ratio(S, S+A),
ratio(S, S+B), ratio(S+A, S+B), where ratio(x, y) = 200 * LCS(x, y) / (|x| + |y|), rounded to
an integer; a match needs more than 85. Titles' nouns here come from the stated stand-in
(content words), so every case passes nouns="standin".
"""

from __future__ import annotations

import pytest

from mem1_core.webshop.catalog import Goal, Product
from mem1_core.webshop.reward import (
    NounParserUnavailable,
    content_words,
    fuzzy_score,
    normalize_color,
    noun_parser,
    option_matches,
    spacy_noun_parser,
    webshop_reward,
)

SHOES = "clothing, shoes & jewelry › shoes › running shoes"
COFFEE = "grocery & gourmet food › beverages › ground coffee"


def product(
    title: str = "Zeta Non Slip Running Shoes",
    attributes: tuple[str, ...] = ("non slip",),
    query: str = "running shoes",
    breadcrumb: str = SHOES,
    description: str = "Made to last.",
    features: tuple[str, ...] = (),
) -> Product:
    return Product(
        asin="B0PRODUCT1",
        category="fashion",
        product_type=query,
        title=title,
        price=40.0,
        attributes=attributes,
        options={"size": ("8", "9"), "color": ("black", "red")},
        description=description,
        features=features,
        reviews=(),
        query=query,
        product_category=breadcrumb,
    )


def goal(
    attributes: tuple[str, ...] = ("non slip",),
    options: dict[str, str] | None = None,
    price_upper: float = 50.0,
    name: str = "Acme Memory Foam Running Shoes",
) -> Goal:
    return Goal(
        asin="B0TARGET01",
        instruction="i need running shoes",
        attributes=attributes,
        options={"size": "9", "color": "black"} if options is None else options,
        price_upper=price_upper,
        product_type="running shoes",
        category="fashion",
        query="running shoes",
        name=name,
        product_category=SHOES,
    )


def reward(g: Goal, p: Product, chosen: dict[str, str], price: float):
    return webshop_reward(g, p, chosen, price, nouns="standin")


def test_everything_matched_scores_one():
    # attributes 1/1, options 2/2, price 40 <= 50: (1 + 2 + 1) / (1 + 2 + 1) = 1; same
    # query, so r_type 1 (title score: {running, shoes} of acme, memory, foam, running,
    # shoes = 2/5 = 0.4)
    r = reward(goal(), product(), {"size": "9", "color": "black"}, 40.0)
    assert r.total == 1.0 and r.success
    assert (r.r_type, r.r_att, r.r_option, r.r_price) == (1.0, 1.0, 1.0, True)
    assert r.title_score == pytest.approx(0.4) and r.query_match and r.category_match
    assert r.noun_parser == "standin"


def test_partial_attributes_and_options_and_price_over():
    # Goal: non slip, memory foam, arch support; size 9, color black; bound $30.
    # Product attributes: non slip only; text names neither other attribute.
    # - non slip: exact -> 1
    # - memory foam (11 chars) vs non slip (8): no shared token, the ratio is at most
    #   200 * 8 / 19 = 84.2 -> no; not in the text -> 0
    # - arch support (12) vs non slip (8): at most 200 * 8 / 20 = 80 -> 0
    # options: size 9 chosen -> 1; black wanted, red and 9 chosen -> 0
    # price 35 > 30 -> 0
    # total = (1 + 1 + 0) / (3 + 2 + 1) = 2/6
    g = goal(attributes=("non slip", "memory foam", "arch support"), price_upper=30.0)
    r = reward(g, product(), {"size": "9", "color": "red"}, 35.0)
    assert (r.attribute_matches, r.option_matches, r.r_price) == (1, 1, False)
    assert r.r_att == pytest.approx(1 / 3) and r.r_option == pytest.approx(1 / 2)
    assert r.total == pytest.approx(2 / 6)


def test_price_at_the_bound_counts():
    # goal.py: price <= price_upper. (1 + 2 + 1) / 4 at $50.00 against a $50 bound; a cent
    # more drops the price match: (1 + 2 + 0) / 4 = 0.75
    assert reward(goal(), product(), {"size": "9", "color": "black"}, 50.0).total == 1.0
    assert reward(goal(), product(), {"size": "9", "color": "black"}, 50.01).total == 0.75


def test_attribute_found_in_text_counts():
    # memory foam is not among the product's attributes but its features name it (goal.py's
    # fallback to title, bullet points, description): (2 + 2 + 1) / (2 + 2 + 1) = 1
    p = product(features=("CUSHIONED: memory foam insole.",))
    g = goal(attributes=("non slip", "memory foam"))
    assert reward(g, p, {"size": "9", "color": "black"}, 40.0).total == 1.0


def test_type_reward_zero_zeroes_everything():
    # Ground coffee bought for a shoe goal: queries differ, breadcrumbs share no level,
    # title nouns {zeta, dark, roast, ground, coffee} share none of {acme, memory, foam,
    # running, shoes}: title score 0 -> r_type 0, so the total is 0 although the attribute,
    # the options and the price all match.
    p = product(
        title="Zeta Dark Roast Ground Coffee",
        query="ground coffee",
        breadcrumb=COFFEE,
        description="non slip lid",
    )
    r = reward(goal(), p, {"size": "9", "color": "black"}, 10.0)
    assert (r.query_match, r.category_match, r.title_score) == (False, False, 0.0)
    assert r.r_type == 0.0 and r.total == 0.0
    assert r.attribute_matches == 1 and r.option_matches == 2 and r.r_price


def test_type_reward_half_and_tenth():
    # Other query, one shared breadcrumb level (needs two), title nouns share {shoes} of
    # five: 1/5 = 0.2, not above 0.2 -> r_type 0.5; total (1 + 2 + 1) / 4 * 0.5 = 0.5
    p = product(
        title="Zeta Leather Shoes Polish",
        query="shoe polish",
        breadcrumb="clothing, shoes & jewelry › shoe care › polish",
    )
    r = reward(goal(), p, {"size": "9", "color": "black"}, 40.0)
    assert (r.query_match, r.category_match) == (False, False)
    assert r.title_score == pytest.approx(0.2) and r.r_type == 0.5 and r.total == 0.5
    # A goal name of eleven content words, one shared: 1/11 < 0.1 -> r_type 0.1 even with
    # the same query and breadcrumb; total 4/4 * 0.1
    name = "Acme Memory Foam Running Shoes Trail Road Gym Walking Jogging Sneakers"
    r = reward(goal(name=name), product(title="Zeta Sneakers"), {"size": "9", "color": "black"}, 1)
    assert r.title_score == pytest.approx(1 / 11) and r.r_type == 0.1
    assert r.total == pytest.approx(0.1)


def test_title_score_counts_repeated_goal_nouns():
    # goal name nouns: running, shoes, shoes, men (a list: goal.py divides by its length);
    # bought: trail, shoes -> shared {shoes}: 1/4
    r = reward(goal(name="Running Shoes, Shoes for Men"), product(title="Trail Shoes"), {}, 1.0)
    assert r.title_score == pytest.approx(0.25)


def test_fuzzy_attribute_near_matches_on_both_sides_of_the_threshold():
    # quick drying / quick dry: S = "quick"; S+A = "quick drying" (12), S+B = "quick dry"
    # (9); LCS = 9 -> 200 * 9 / 21 = 85.71 -> 86 > 85: a match
    assert fuzzy_score("quick drying", "quick dry") == 86
    g = goal(attributes=("quick drying",), options={})
    # (1 + 0 + 1) / (1 + 0 + 1) = 1
    assert reward(g, product(attributes=("quick dry",)), {}, 1.0).total == 1.0
    # adjustable height design / adjustable height blend: S = "adjustable height" (17),
    # S+A (24), S+B (23); ratio(S, S+B) = 200 * 17 / 40 = 85.0; ratio(S+A, S+B): LCS = 17 +
    # 1 (space) + 2 ("en" of design/blend) = 20 -> 200 * 20 / 47 = 85.1, rounded 85: not
    # above 85, so no match although the unrounded score is; (0 + 0 + 1) / 2 = 0.5
    assert fuzzy_score("adjustable height design", "adjustable height blend") == 85
    g = goal(attributes=("adjustable height design",), options={})
    assert reward(g, product(attributes=("adjustable height blend",)), {}, 1.0).total == 0.5


def test_fuzzy_option_near_matches_and_colour_normalisation():
    # size 9 / size 8: S = "size"; S+A = "size 9", S+B = "size 8" (6 each), LCS 5 ->
    # 200 * 5 / 12 = 83.3 -> 83: no match
    assert option_matches(["size 8"], ["size 9"]) == 0
    # pack of 2 / pack of 12: S = "of pack" (7); "of pack 2" (9), "of pack 12" (10);
    # LCS 9 -> 200 * 9 / 19 = 94.7 -> 95: a match (the reward cannot tell them apart)
    assert option_matches(["pack of 2"], ["pack of 12"]) == 1
    # cool powder snow / powder snow: one side's tokens within the other's -> 100
    assert option_matches(["powder snow"], ["cool powder snow"]) == 1
    # colours: "navy blue" and "light blue" both hold "blue", which comes first in
    # WebShop's list -> both "blue" -> match; "rose gold" -> "gold" (gold precedes rose)
    assert normalize_color("navy blue") == normalize_color("light blue") == "blue"
    assert normalize_color("rose gold") == "gold" and normalize_color("standard") == "tan"
    assert option_matches(["light blue"], ["navy blue"]) == 1
    # goal with no options: r_option None, denominator attributes + 1: (1 + 0 + 1) / 2
    r = reward(goal(options={}), product(), {"size": "8"}, 1.0)
    assert r.r_option is None and r.total == 1.0


def test_goal_py_published_cases():
    # WebShop's own test cases for its matchers (tests/web-agent-site/engine/test_goal.py)
    p = product(attributes=("tea tree", "essential oil", "natural ingredients"))
    g = goal(attributes=("tea tree", "essential oils", "natural ingredients"), options={})
    assert reward(g, p, {}, 1.0).attribute_matches == 3
    assert option_matches(["pack of 12", "grey", "XL"], ["grey", "XL", "pack of 12"]) == 3
    assert option_matches(["pack of 12", "blue", "XL"], ["grey", "XL", "pack of 12"]) == 2


def test_content_words_stand_in():
    assert content_words("Men's T-Shirt, 2 Pack for the Gym") == ["men", "shirt", "pack", "gym"]
    assert content_words("of the and") == []


def test_nounless_goal_name_scores_a_fifth():
    # goal.py: no nouns in the desired name -> title score 0.2 (not above 0.2, not below
    # 0.1); with the query matching, r_type stays 1
    r = reward(goal(name=""), product(), {"size": "9", "color": "black"}, 1.0)
    assert r.title_score == 0.2 and r.r_type == 1.0


def test_spacy_path_reads_noun_tags():
    spacy = pytest.importorskip("spacy")
    # A blank English pipeline whose attribute ruler tags a few words: the parser keeps
    # exactly the NOUN and PROPN tokens, lowercased, as goal.py does.
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("attribute_ruler")
    ruler.add([[{"LOWER": "shoes"}]], {"POS": "NOUN"})
    ruler.add([[{"LOWER": "acme"}]], {"POS": "PROPN"})
    ruler.add([[{"LOWER": "running"}]], {"POS": "VERB"})
    assert spacy_noun_parser(nlp)("Acme Running Shoes") == ["acme", "shoes"]
    with pytest.raises(NounParserUnavailable, match="no_such_model_here, which is not installed"):
        noun_parser("spacy:no_such_model_here")


def test_bad_input():
    with pytest.raises(ValueError, match="price"):
        reward(goal(), product(), {}, float("nan"))
    with pytest.raises(ValueError, match="price"):
        reward(goal(), product(), {}, -1.0)
    with pytest.raises(ValueError, match="strings"):
        reward(goal(), product(), {"size": 9}, 1.0)  # type: ignore[dict-item]
    for spec in ("nltk", "auto", "spacy:"):
        with pytest.raises(ValueError, match="noun_parser"):
            webshop_reward(goal(), product(), {}, 1.0, nouns=spec)
    with pytest.raises(ValueError, match="option_match"):
        webshop_reward(goal(), product(), {}, 1.0, option_match="fuzzy")


def test_a_spacy_setting_without_spacy_stops_in_one_line():
    """The noun parser is a setting, never a guess: `spacy` where spaCy or its model is missing
    raises one line that says what to install or set."""
    try:
        import spacy

        spacy.load("en_core_web_sm")
        pytest.skip("spaCy and en_core_web_sm are installed here")
    except (ImportError, OSError):
        pass
    with pytest.raises(NounParserUnavailable) as e:
        noun_parser("spacy")
    message = str(e.value)
    assert "\n" not in message and "env.noun_parser=standin" in message
    assert "en_core_web_sm" in message
