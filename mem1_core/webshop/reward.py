"""WebShop's reward for a purchase (Yao et al. 2022, `web_agent_site/engine/goal.py`).

    total = (attribute matches + option matches + [price <= price bound])
            / (goal attributes + goal options + 1) * r_type

- An attribute of the goal matches when one of the product's attributes scores above 85 on
  thefuzz's `token_set_ratio`, or else when the attribute appears verbatim in the product's
  lowercased title, features or description.
- An option of the goal matches when one of the chosen option values scores above 85, both
  sides first passed through WebShop's `normalize_color` (a value containing a colour word
  becomes the first such word of WebShop's colour list). goal.py hands a synthetic goal's
  options to this test as (group, value) pairs (`goal_options.items()`), a human goal's as
  values: a pair is a colour only where one of its two strings is exactly a colour word, and
  its fuzzy text is the pair as Python writes it, "('size', 'large')", so the group's words
  join the value's ("large" bought scores 100 against ('size', 'x-large'), "x-large" bought
  83 against ('size', 'large')). `option_match="webshop"` reproduces this; `"value"`
  compares every goal's options by value (a named variant, docs/webshop.md).
- r_type is 1, 0.5, 0.1 or 0 from the query match, the category match (two or more shared
  breadcrumb levels) and the title score (the share of the goal name's nouns found among the
  bought title's nouns), by goal.py's rules.

Fuzzy scores: thefuzz's `token_set_ratio` as thefuzz (>= 0.20) computes it, through
rapidfuzz: both strings lose the code points 128-255, then non-alphanumerics become spaces,
letters are lowercased and ends trimmed; the score is rounded to an integer before the
`> 85` test. WebShop pins thefuzz 0.19, which computed the same ratio with difflib's
SequenceMatcher; its matching-block heuristic can find a shorter common subsequence than
rapidfuzz's exact one, so a few pairs near the threshold can score differently.

Nouns: goal.py keeps the tokens spaCy tags NOUN or PROPN (`en_core_web_sm` in its code,
`en_core_web_lg` in WebShop's first release). No package registry here ships those models,
so the stand-in (`content_words`) keeps every word of two or more letters that is not an
English function word (articles, pronouns, prepositions, conjunctions, auxiliaries,
quantifiers); it also keeps adjectives and verbs, so its title scores are lower than
spaCy's where names carry them. Which parser scores is a setting (`env.noun_parser`:
`standin`, `spacy` or `spacy:MODEL`), never a guess from what is installed: a run that asks
for spaCy where it or its model is missing stops in one line, and `Reward.noun_parser` says
which one scored.

Null fields fail where goal.py fails on them: a product without a description only when an
attribute is found neither among its attributes, nor in its title or features; a goal whose
options are null whenever it is scored. A goal without attributes scores r_att None, where
goal.py divides by zero (no goal of WebShop's has none).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rapidfuzz.fuzz import token_set_ratio
from rapidfuzz.utils import default_process

from mem1_core.webshop.catalog import BREADCRUMB_SEPARATOR, Goal, Product, ShopFormatError

FUZZY_THRESHOLD = 85
"""A fuzzy match needs a rounded score above this (goal.py: `score > 85`)."""
SPACY_MODEL = "en_core_web_sm"
"""The spaCy model goal.py loads; `spacy` names it, `spacy:MODEL` another."""
STANDIN = "standin"
OPTION_MATCHES = ("webshop", "value")
"""How a goal's options reach the option test: `webshop` as goal.py hands them (a synthetic
goal's as (group, value) pairs), `value` every goal's by value."""

# WebShop's colour list (web_agent_site/engine/normalize.py), in its order: the first entry
# found inside a value replaces it, so order decides ("navy blue" -> "blue").
COLOR_SET = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze "
    "brown burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas "
    "coffee cognac copper coral cranberry cream crystal dark denim eggplant elephant espresso "
    "fuchsia gold granite grape graphite grass gray green grey heather indigo ivory ivy khaki "
    "lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha "
    "multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple "
    "rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow"
).split()

# Closed-class English words: what the stand-in noun parser drops.
FUNCTION_WORDS = frozenset(
    "a an the this that these those my your his her its our their some any each every no "
    "all both either neither few many much more most other another such what which whose "
    "i you he she it we they me him us them myself yourself itself ourselves themselves "
    "who whom whoever whatever one ones "
    "of in on at by for with about against between into through during before after above "
    "below to from up down out off over under again further via per within without onto "
    "upon toward towards across along around behind beside besides beyond inside outside "
    "near than like as "
    "and or but nor so yet if because while although though unless until whether "
    "is am are was were be been being have has had having do does did doing will would "
    "shall should can could may might must "
    "not only own same too very just also then there here when where why how".split()
)
_LETTERS = re.compile(r"[^\W\d_]+")
_LATIN1 = {i: None for i in range(128, 256)}


Option = str | tuple[str, str]
"""An option as the option test sees it: a value, or a synthetic goal's (group, value) pair."""


def fuzzy_score(a: Option, b: Option) -> int:
    """thefuzz's `token_set_ratio(a, b)`: an integer in [0, 100]. A pair is scored as
    thefuzz scores anything not a string: by its `str`, "('size', 'large')"."""
    pa = default_process(str(a).translate(_LATIN1))
    pb = default_process(str(b).translate(_LATIN1))
    return int(round(token_set_ratio(pa, pb)))


def fuzzy_match(a: Option, b: Option) -> bool:
    return fuzzy_score(a, b) > FUZZY_THRESHOLD


def normalize_color(value: Option) -> Option:
    """WebShop's `normalize_color`: the first colour of `COLOR_SET` found `in` the value, else
    the value unchanged. For a string that is a substring test ("standard" holds "tan"); for
    a (group, value) pair Python's `in` asks whether one of the two strings *is* the colour."""
    return next((c for c in COLOR_SET if c in value), value)


# ---- nouns ---------------------------------------------------------------------------------

NounParser = Callable[[str], list[str]]
"""Text -> its nouns, lowercased, in order, repeats kept (the title score divides by how
many the goal name has, repeats included)."""


def content_words(text: str) -> list[str]:
    """The stand-in noun parser: lowercased runs of letters, two or more long, that are not
    in `FUNCTION_WORDS` ("Men's T-Shirt, 2 Pack" -> men, shirt, pack)."""
    words = _LETTERS.findall(text.lower())
    return [w for w in words if len(w) >= 2 and w not in FUNCTION_WORDS]


def spacy_noun_parser(nlp) -> NounParser:
    """goal.py's parse with a loaded spaCy pipeline: tokens tagged NOUN or PROPN."""

    @functools.lru_cache(maxsize=1 << 16)
    def parse(text: str) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in nlp(text) if t.pos_ in ("PNOUN", "NOUN", "PROPN"))

    return lambda text: list(parse(text))


class NounParserUnavailable(RuntimeError):
    """The configured noun parser cannot run here; says how to install it or what to set."""


def check_noun_parser_spec(spec: str) -> None:
    """Raise ValueError unless `spec` is `standin`, `spacy` or `spacy:MODEL`."""
    model = spec.removeprefix("spacy:") if spec.startswith("spacy:") else None
    if spec not in (STANDIN, "spacy") and not model:
        raise ValueError(
            f"env.noun_parser={spec!r}: use standin, spacy (goal.py's {SPACY_MODEL}) or spacy:MODEL"
        )


@functools.cache
def noun_parser(spec: str = STANDIN) -> tuple[str, NounParser]:
    """(name, parser) for `spec`: `standin` (`content_words`), `spacy` (goal.py's model) or
    `spacy:MODEL`. The name is what `Reward.noun_parser` records ("standin",
    "spacy:en_core_web_sm"). Raises NounParserUnavailable where spaCy or the model is
    missing: a run never falls back to another parser by itself."""
    check_noun_parser_spec(spec)
    if spec == STANDIN:
        return STANDIN, content_words
    model = SPACY_MODEL if spec == "spacy" else spec.removeprefix("spacy:")
    fix = (
        f"install them (pip install spacy && python -m spacy download {model}) or set "
        f"env.noun_parser={STANDIN}"
    )
    try:
        import spacy
    except ImportError:
        raise NounParserUnavailable(
            f"env.noun_parser={spec} needs spaCy, which is not installed: {fix}"
        ) from None
    try:
        nlp = spacy.load(model)
    except OSError:  # spaCy's "can't find model"
        raise NounParserUnavailable(
            f"env.noun_parser={spec} needs spaCy's model {model}, which is not installed: {fix}"
        ) from None
    return f"spacy:{model}", spacy_noun_parser(nlp)


# ---- the reward ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Reward:
    """A purchase's reward and its parts, as goal.py's verbose reward reports them."""

    total: float
    """The reward, in [0, 1]."""
    r_type: float
    """Type reward: 1, 0.5, 0.1 or 0; multiplies the rest."""
    r_att: float | None
    """Share of goal attributes matched; None for a goal without attributes."""
    r_option: float | None
    """Share of goal options matched; None for a goal without options (goal.py)."""
    r_price: bool
    """Whether the price is within the goal's bound."""
    attribute_matches: int
    option_matches: int
    n_attributes: int
    n_options: int
    query_match: bool
    category_match: bool
    title_score: float
    """Share of the goal name's nouns (repeats counted) found among the bought title's."""
    noun_parser: str
    """Which noun parser scored the titles ("standin" or "spacy:MODEL")."""

    @property
    def success(self) -> bool:
        """Everything asked for was bought (WebShop's success rate counts reward 1)."""
        return self.total == 1.0


def type_reward(product: Product, goal: Goal, nouns: NounParser) -> tuple[float, bool, bool, float]:
    """goal.py's `get_type_reward`: (r_type, query_match, category_match, title_score)."""
    query_match = product.query == goal.query
    levels = {x.strip() for x in product.product_category.split(BREADCRUMB_SEPARATOR.strip())}
    wanted = {x.strip() for x in goal.product_category.split(BREADCRUMB_SEPARATOR.strip())}
    category_match = len(levels & wanted) >= 2
    bought, desired = nouns(product.title), nouns(goal.name)
    title_score = len(set(bought) & set(desired)) / len(desired) if desired else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attribute_matches(product: Product, goal_attributes: tuple[str, ...]) -> int:
    """goal.py's `get_attribute_reward` count: goal attributes that fuzzily match one of the
    product's, or else appear in its lowercased title, features or description (read in that
    order: a null description fails only when it is reached, as in goal.py)."""
    title, features = product.title.lower(), " ".join(product.features).lower()
    n = 0
    for g in goal_attributes:
        if any(fuzzy_match(p, g) for p in product.attributes) or g in title or g in features:
            n += 1
            continue
        if product.description is None:
            raise ShopFormatError(
                f"product {product.asin} has no description (null full_description in "
                f"WebShop's file), which the reward must search for attribute {g!r} (goal.py "
                "fails here too)"
            )
        n += g in product.description.lower()
    return n


def goal_options(goal: Goal, option_match: str = "webshop") -> list[Option]:
    """The goal's options as goal.py hands them to the option test: a synthetic goal's as
    (group, value) pairs, a human goal's as values (`option_match="value"`: values always)."""
    if option_match not in OPTION_MATCHES:
        raise ValueError(f"option_match={option_match!r}: use one of {OPTION_MATCHES}")
    if goal.options is None:
        raise ShopFormatError(
            f"goal for {goal.asin} has no options (null instruction_options in WebShop's "
            "file): goal.py cannot score it either"
        )
    if option_match == "webshop" and goal.source == "synthetic":
        return list(goal.options.items())
    return list(goal.options.values())


def option_matches(chosen: list[str], wanted: list[Option]) -> int:
    """goal.py's `get_option_reward` count: wanted options matched by a chosen value, both
    colour-normalised."""
    chosen_n = [normalize_color(o) for o in chosen]
    wanted_n = [normalize_color(o) for o in wanted]
    return sum(any(fuzzy_match(c, w) for c in chosen_n) for w in wanted_n)


def webshop_reward(
    goal: Goal,
    product: Product,
    chosen_options: Mapping[str, str],
    price: float,
    *,
    nouns: str = STANDIN,
    option_match: str = "webshop",
) -> Reward:
    """WebShop's reward for buying `product` at `price` with `chosen_options` (group ->
    value clicked) toward `goal`. `nouns` picks the noun parser (`noun_parser`);
    `option_match` how the goal's options are compared (`goal_options`)."""
    if not isinstance(price, int | float) or not math.isfinite(price) or price < 0:
        raise ValueError(f"price must be a finite number >= 0, got {price!r}")
    if not all(isinstance(v, str) for v in chosen_options.values()):
        raise ValueError(f"chosen option values must be strings, got {dict(chosen_options)}")
    parser_name, parser = noun_parser(nouns)
    r_type, query_match, category_match, title_score = type_reward(product, goal, parser)
    wanted = goal_options(goal, option_match)
    n_att, n_opt = len(goal.attributes), len(wanted)
    att = attribute_matches(product, goal.attributes)
    opt = option_matches(list(chosen_options.values()), wanted)
    r_price = price <= goal.price_upper
    total = (att + opt + r_price) / (n_att + n_opt + 1) * r_type
    return Reward(
        total=total,
        r_type=r_type,
        r_att=att / n_att if n_att else None,
        r_option=opt / n_opt if n_opt else None,
        r_price=r_price,
        attribute_matches=att,
        option_matches=opt,
        n_attributes=n_att,
        n_options=n_opt,
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
        noun_parser=parser_name,
    )
