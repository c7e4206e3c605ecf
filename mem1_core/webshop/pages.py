"""Where a WebShop episode stands, and what an action does to it, as WebShop's text
environment has it (`web_agent_site/envs/web_agent_text_env.py` with the engine's
`parse_action` and the site's page templates).

A `Page` is where an episode stands: the search page, a page of search results, an item page,
or one of an item's detail pages (`[Description]`, `[Features]`, `[Reviews]`). How a page is
written for the agent is mem1_core.webshop.views.

The rules, as WebShop's text environment applies them:
- An action is read with WebShop's pattern `(.+)\\[(.+)\\]` from the start of the text (the
  last `[` before a closing `]` splits it), after the text between the tags is stripped (as
  MEM1 strips its action). The verb must then be exactly `search` or `click`: `Click[...]`
  and `search [...]` are not actions, and a value holding a `[` cannot be clicked.
- `search[keywords]` runs from any page (WebShop's text environment executes it wherever it
  is written; only the search page shows a search bar). The keywords are lowercased; the
  results are the search's top `max_results`, `results_per_page` a page.
- `click[value]` names something the page shows, compared as WebShop compares it: the value
  lowercased (not stripped) against the buttons' and the result links' lowercased text and
  the option values as the page holds them; `click[search]` is never an action. The page's
  clickables are a dict keyed that way, so an option value that two groups share belongs to
  the later group on the page (WebShop's radio buttons overwrite each other's key).
- What a click does is decided by the name first, in WebShop's order: `Buy Now` ends the
  episode with the item and the selected options; `Back to Search` returns to the search
  page; `Next >` on a results page shows the next page (shown on every results page, so it
  leads past the last into empty ones); `< Prev` goes back one page (a results page to the one
  before it, shown from page 2 on; an item to its results page; a detail page to its item);
  `Description`, `Features`, `Reviews` open that page; anything else opens the result or
  selects the option (a second value of a group replaces the first).
- Any page that lists results starts a new selection: opening an item from it has none.
An action the page does not offer returns None: the caller decides what that costs (a format
error and the page shown again, or, MEM1's setting, nothing at all).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum

from mem1_core.webshop.catalog import Product

BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
DETAILS = ("Description", "Features", "Reviews")

SEARCH, CLICK = "search", "click"
_ACTION = re.compile(r"(.+)\[(.+)\]")  # engine.py's parse_action, read with re.match


class PageKind(StrEnum):
    SEARCH = "search"
    RESULTS = "results"
    ITEM = "item"
    DETAIL = "detail"


@dataclass(frozen=True)
class Page:
    """Where an episode stands (immutable: `apply` returns a new page)."""

    kind: PageKind = PageKind.SEARCH
    keywords: str = ""
    """The last search's keywords (lowercased, as WebShop searches them)."""
    results: tuple[str, ...] = ()
    """The last search's asins, best first (all its pages)."""
    page_no: int = 1
    """The results page shown or last shown (1-based)."""
    asin: str | None = None
    """The open item (item and detail pages)."""
    selected: tuple[tuple[str, str], ...] = ()
    """The selected options of the open item, (group, value) in click order, one per group."""
    detail: str | None = None
    """Which detail page is open: one of DETAILS."""

    @property
    def options(self) -> dict[str, str]:
        return dict(self.selected)


@dataclass(frozen=True)
class Outcome:
    """What a valid action did: the new page, and for `[Buy Now]` what was bought."""

    page: Page
    bought: Product | None = None


@dataclass(frozen=True)
class Clickable:
    """One thing a click may name: its text as the page shows it, and for an option its group."""

    text: str
    group: str | None = None
    """The option group (an option value); None for a button or a result link."""


def parse_action(text: str) -> tuple[str, str] | None:
    """`search[red shoes]` -> ("search", "red shoes"); `click[Buy Now]` -> ("click", "Buy
    Now"); anything else -> None (module docstring: WebShop's pattern, an exact verb)."""
    m = _ACTION.match(text.strip())
    if m is None or m.group(1) not in (SEARCH, CLICK):
        return None
    return m.group(1), m.group(2)


def page_results(page: Page, per_page: int) -> tuple[str, ...]:
    """The asins on the results page shown (none past the last page)."""
    start = (page.page_no - 1) * per_page
    return page.results[start : start + per_page]


def n_pages(page: Page, per_page: int) -> int:
    """Pages the search's results fill (WebShop's `Next >` leads past them)."""
    return max(1, -(-len(page.results) // per_page))


def buttons(page: Page) -> list[str]:
    """The page's buttons, in page order."""
    if page.kind is PageKind.SEARCH:
        return []
    if page.kind is PageKind.RESULTS:
        prev = [PREV_PAGE] if page.page_no > 1 else []
        return [BACK_TO_SEARCH, *prev, NEXT_PAGE]
    if page.kind is PageKind.DETAIL:
        return [BACK_TO_SEARCH, PREV_PAGE]
    return [BACK_TO_SEARCH, PREV_PAGE, *DETAILS, BUY_NOW]


def clickables(page: Page, product: Product | None, per_page: int) -> dict[str, Clickable]:
    """What a click may name on `page`, keyed as WebShop keys it (`text_to_clickable`): the
    buttons' and result links' text lowercased, then the option values as they are, a later
    group's value taking over the key of an earlier one's (product: the open item)."""
    out = {b.lower(): Clickable(b) for b in buttons(page)}
    if page.kind is PageKind.RESULTS:
        out |= {a.lower(): Clickable(a) for a in page_results(page, per_page)}
    if page.kind is PageKind.ITEM:
        assert product is not None
        for group, values in product.options.items():
            for v in values:
                out[v] = Clickable(v, group)
    return out


def apply(
    page: Page,
    verb: str,
    arg: str,
    product_of: Callable[[str], Product],
    search: Callable[[str], list[str]],
    per_page: int,
) -> Outcome | None:
    """The page after `verb[arg]`, or None where `page` does not offer that action.
    product_of: asin -> Product; search: keywords -> ranked asins."""
    if verb == SEARCH:
        keywords = arg.lower()
        return Outcome(Page(PageKind.RESULTS, keywords=keywords, results=tuple(search(keywords))))
    if verb != CLICK:
        return None
    product = product_of(page.asin) if page.asin is not None else None
    name = arg.lower()
    target = clickables(page, product, per_page).get(name)
    if target is None or name == SEARCH:
        return None
    # the name decides first, in the order of WebShop's SimServer.receive
    if name == BUY_NOW.lower():
        assert product is not None
        return Outcome(page, bought=product)
    if name == BACK_TO_SEARCH.lower():
        return Outcome(Page())
    if name == NEXT_PAGE.lower() and page.kind is PageKind.RESULTS:
        return Outcome(replace(page, page_no=page.page_no + 1))
    if name == PREV_PAGE.lower():
        if page.kind is PageKind.RESULTS:
            return Outcome(replace(page, page_no=page.page_no - 1))
        if page.kind is PageKind.DETAIL:
            return Outcome(replace(page, kind=PageKind.ITEM, detail=None))
        return Outcome(replace(page, kind=PageKind.RESULTS, asin=None, selected=()))
    detail = next((d for d in DETAILS if d.lower() == name), None)
    if detail is not None:
        return Outcome(replace(page, kind=PageKind.DETAIL, detail=detail))
    if page.kind is PageKind.RESULTS:
        return Outcome(replace(page, kind=PageKind.ITEM, asin=target.text, selected=()))
    group = target.group
    assert group is not None
    selected = tuple((g, v) for g, v in page.selected if g != group) + ((group, target.text),)
    return Outcome(replace(page, selected=selected))
