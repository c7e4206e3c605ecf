"""The scripted WebShop teacher: shops well in MEM1's format, the warm start's data for the
shopping domain (the role the QA teacher, mem1_core.qa.teacher, plays there).

It plays behind the generation interface, so it runs under any memory policy through the same
rollout and environment as a model. Each turn it reads where its trajectory stands (the
environment replays the trajectory's actions: `WebShopEnvironment.page`) and acts:
1. on the search page, it searches with the goal's key words: its attributes and its product
   type (a second search, after an empty one, with the type alone);
2. on a results page, it opens the result that best matches the instruction by what the page
   shows (the type and attribute phrases in the title, a price under the bound), never by the
   target's asin, which no page names as the target;
3. on the item page, it clicks each option value the instruction asks for that the item
   offers, one a turn, then `[Buy Now]`; on its last turn it buys what is open;
4. on a detail page it goes back.
Its `<IS>` folds what it still needs (the type, attributes, options and price bound) and what
it has done (the search, the open item, the options chosen) into one short state.

It is not perfect on purpose or by accident: the best-looking result is not always the target
(several products share a type and attributes), so its reward is the ceiling a warm start can
imitate on a shop, not 1.
"""

from __future__ import annotations

import re

from mem1_core.data.prompts import IS_CLOSE, IS_OPEN, QUERY_CLOSE, QUERY_OPEN
from mem1_core.rollout.environment import Environment
from mem1_core.rollout.generation import Generation
from mem1_core.trajectory.record import Action, Trajectory
from mem1_core.webshop.catalog import NO_PRICE_BOUND, Goal, Product
from mem1_core.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PREV_PAGE,
    Page,
    PageKind,
    n_pages,
    page_results,
)

_PRICE = re.compile(r"\$([\d.]+)")


def search_keywords(goal: Goal, attempt: int = 0) -> str:
    """What the teacher types: the attributes, the option values and the type (WebShop indexes
    a product's option values with its text), then (a retry) the type alone."""
    if attempt > 0:
        return goal.product_type
    return " ".join([*goal.attributes, *goal.wanted.values(), goal.product_type])


def lowest_shown_price(product: Product) -> float:
    """The lowest price in the product's price text (a range's low end)."""
    return min((float(x) for x in _PRICE.findall(product.shown_price)), default=product.price)


def title_match(goal: Goal, product: Product) -> float:
    """How well a result matches the goal by what a results page shows: the type phrase in the
    title (2), each attribute phrase in it (1), a shown price under the bound (1.5)."""
    title = product.title.lower()
    score = 2.0 * (goal.product_type.lower() in title)
    score += sum(a.lower() in title for a in goal.attributes)
    return score + 1.5 * (lowest_shown_price(product) <= goal.price_upper)


def wanted_options(goal: Goal, product: Product) -> list[tuple[str, str]]:
    """(group, value as the item shows it) of the goal's options that the item offers and a
    click can name (WebShop's action pattern cannot name a value holding a "[")."""
    out = []
    for group, value in goal.wanted.items():
        for shown in product.options.get(group, ()):
            if shown.lower() == value.lower() and "[" not in shown:
                out.append((group, shown))
    return out


class WebShopTeacher:
    """A generation backend that writes teacher turns for the WebShop trajectories it is given."""

    reads_trajectories = True

    def __init__(self, tokenizer, env: Environment):
        # `env` is the WebShopEnvironment that builds this teacher (typed by its base: the
        # environment imports the teacher, so the teacher does not import it back)
        self.tok = tokenizer
        self.env = env

    def generate(self, contexts, params, generator=None, trajectories=None) -> list[Generation]:
        if trajectories is None:
            raise ValueError("the scripted teacher needs the trajectories it plays")
        out = []
        for traj in trajectories:
            ids = self.tok.encode(self.turn_text(traj), add_special_tokens=False)
            out.append(Generation(ids, [0.0] * len(ids), "stop"))
        return out

    def turn_text(self, traj: Trajectory) -> str:
        state, action = self.decide(traj)
        # a space after <query>: the tiny tokenizer's words carry their leading space
        return f"{IS_OPEN} {state} {IS_CLOSE}{QUERY_OPEN} {action}{QUERY_CLOSE}"

    def decide(self, traj: Trajectory) -> tuple[str, str]:
        """(state, action) for the trajectory's next turn."""
        goal = self.env.goal(traj.task_id)
        _, shop = self.env.shop_of(traj.task_id)
        page = self.env.page(traj)
        searches = [t.query for t in traj.turns if t.action is Action.QUERY]
        last_turn = len(traj.turns) + 1 >= traj.max_turns
        need = self.need(goal)
        if page.kind is PageKind.SEARCH:
            kw = search_keywords(goal, len(searches))
            return f"{need} Search.", f"search[{kw}]"
        tried = self.tried(traj)
        done = f" Tried {', '.join(tried)}." if tried else ""
        if page.kind is PageKind.RESULTS:
            return f"{need}{done}", self._pick(goal, page, shop.product, tried)
        if page.kind is PageKind.DETAIL:
            return f"{need}{done}", f"click[{PREV_PAGE}]"
        product = shop.product(page.asin or "")
        chosen = page.options
        offered = wanted_options(goal, product)
        todo = [(g, v) for g, v in offered if chosen.get(g) != v]
        picked = " ".join(f"{g} {v}." for g, v in chosen.items())
        state = f"{need}{done}" + (f" Chose {picked}" if picked else "")
        turns_left = traj.max_turns - len(traj.turns)
        # an item without an asked option: back to the results for the next candidate, while
        # the turns left pay for one more (back, open, its options, buy)
        if len(offered) < len(goal.wanted) and turns_left > len(goal.wanted) + 3:
            return state, f"click[{PREV_PAGE}]"
        if todo and not last_turn:
            return state, f"click[{todo[0][1]}]"
        return state, f"click[{BUY_NOW}]"

    @staticmethod
    def tried(traj: Trajectory) -> list[str]:
        """The items the trajectory opened from a results page, in order."""
        out = []
        for t in traj.turns:
            q = t.query or ""
            if t.action is Action.CLICK and q.startswith("click[B0") and q[6:-1] not in out:
                out.append(q[6:-1])
        return out

    def _pick(self, goal: Goal, page: Page, product_of, tried: list[str]) -> str:
        shown = [a for a in page_results(page, self.env.per_page) if a not in tried]
        more = page.page_no < n_pages(page, self.env.per_page)
        if not shown:
            return f"click[{NEXT_PAGE if more else BACK_TO_SEARCH}]"
        scores = [title_match(goal, product_of(a)) for a in shown]
        best = max(range(len(shown)), key=lambda i: scores[i])  # ties: the higher ranked
        # nothing of the type under the bound here: look at the next page first
        if scores[best] < 3.5 and more:
            return f"click[{NEXT_PAGE}]"
        return f"click[{shown[best]}]"

    @staticmethod
    def need(goal: Goal) -> str:
        """What the instruction asks for, folded into the state: type, attributes, options,
        price bound."""
        parts = [f"Need {goal.product_type}"]
        if goal.attributes:
            parts.append(", ".join(goal.attributes))
        if goal.wanted:
            parts.append(", ".join(f"{g} {v}" for g, v in goal.wanted.items()))
        if goal.price_upper < NO_PRICE_BOUND:
            parts.append(f"under ${goal.price_upper:.0f}")
        return "; ".join(parts) + "."
