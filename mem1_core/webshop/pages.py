"""WebShop's pages as its text mode shows them, and what an action does to them.

A `Page` is where an episode stands: the search page, a page of search results, an item page,
or one of an item's detail pages (`[Description]`, `[Features]`, `[Reviews]`). `render` writes a
page as text, in the bracketed form WebShop's text mode gives an agent (the form of the ReAct
and AgentBench WebShop prompts): every clickable is `[value]`, the rest is plain text, one
thing a line.

    search page      [Search]
    results page     [Back to Search] / Page 1 (Total results: 50) / [Next >] /
                     then per product: [ASIN] / title / $price
    item page        [Back to Search] / [< Prev] / each option group and its [values] /
                     title / Price: $x / Rating: N.A. / [Description] / [Features] /
                     [Reviews] / [Buy Now]
    detail page      [Back to Search] / [< Prev] / the description, features or reviews

`clickables` lists what a click may name on a page; `apply` moves from page to page. Rules,
as WebShop's browser (`web_agent_site/envs/web_agent_text_env.py`) has them:
- `search[keywords]` only where the page has the search bar (the search page), with non-empty
  keywords; the results are the search's top `max_results`, `results_per_page` a page.
- `click[value]` only on a value the page shows, compared as WebShop compares them (lowercased,
  stripped): an asin, an option value, a button.
- Clicking an option value selects it in its group (a second value of the group replaces the
  first); opening an item, or going back to search, clears the selection.
- `[< Prev]` goes back one page: a detail page to its item, an item to its results page, a
  results page to the one before it (shown from page 2 on).
- `[Buy Now]` ends the episode with the item and the selected options.
An action the page does not offer returns None: the caller counts it as invalid and the page
stays as it was.

Where it departs from WebShop's text mode: the instruction is not repeated at the top of every
page (it is in the task prompt, which every memory keeps, so repeating it would only lengthen
each observation); a selected option is shown as `(selected: value)` after its group, where
WebShop marks the clicked button; ratings are `N.A.` as in WebShop's scraped items without one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from mem1_core.webshop.catalog import Product

BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
DETAILS = ("Description", "Features", "Reviews")
SEARCH_BAR = "[Search]"

SEARCH, CLICK = "search", "click"
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.DOTALL | re.IGNORECASE)


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
    """The last search's keywords."""
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


def parse_action(text: str) -> tuple[str, str] | None:
    """`search[red shoes]` -> ("search", "red shoes"); `click[Buy Now]` -> ("click", "Buy
    Now"); anything else -> None. The verb is case-insensitive; the argument is stripped."""
    m = _ACTION.match(text)
    if m is None:
        return None
    return m.group(1).lower(), m.group(2).strip()


def page_results(page: Page, per_page: int) -> tuple[str, ...]:
    """The asins on the results page shown."""
    start = (page.page_no - 1) * per_page
    return page.results[start : start + per_page]


def n_pages(page: Page, per_page: int) -> int:
    return max(1, -(-len(page.results) // per_page))


def clickables(page: Page, product: Product | None, per_page: int) -> list[str]:
    """The values a click may name on `page`, as the page shows them (product: the open item)."""
    if page.kind is PageKind.SEARCH:
        return []
    if page.kind is PageKind.RESULTS:
        out = [BACK_TO_SEARCH]
        if page.page_no > 1:
            out.append(PREV_PAGE)
        if page.page_no < n_pages(page, per_page):
            out.append(NEXT_PAGE)
        return out + list(page_results(page, per_page))
    if page.kind is PageKind.DETAIL:
        return [BACK_TO_SEARCH, PREV_PAGE]
    assert product is not None
    values = [v for vs in product.options.values() for v in vs]
    return [BACK_TO_SEARCH, PREV_PAGE, *values, *DETAILS, BUY_NOW]


def _key(value: str) -> str:
    return value.strip().lower()


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
        if page.kind is not PageKind.SEARCH or not arg:
            return None
        return Outcome(Page(PageKind.RESULTS, keywords=arg, results=tuple(search(arg))))
    if verb != CLICK:
        return None
    product = product_of(page.asin) if page.asin is not None else None
    shown = {_key(v): v for v in clickables(page, product, per_page)}
    value = shown.get(_key(arg))
    if value is None:
        return None
    if value == BACK_TO_SEARCH:
        return Outcome(Page())
    if page.kind is PageKind.RESULTS:
        if value == NEXT_PAGE:
            return Outcome(replace(page, page_no=page.page_no + 1))
        if value == PREV_PAGE:
            return Outcome(replace(page, page_no=page.page_no - 1))
        return Outcome(replace(page, kind=PageKind.ITEM, asin=value, selected=()))
    if page.kind is PageKind.DETAIL:  # only [< Prev] is left
        return Outcome(replace(page, kind=PageKind.ITEM, detail=None))
    assert product is not None
    if value == PREV_PAGE:
        return Outcome(replace(page, kind=PageKind.RESULTS, asin=None, selected=()))
    if value == BUY_NOW:
        return Outcome(page, bought=product)
    if value in DETAILS:
        return Outcome(replace(page, kind=PageKind.DETAIL, detail=value))
    group = next(g for g, vs in product.options.items() if value in vs)
    selected = tuple((g, v) for g, v in page.selected if g != group) + ((group, value),)
    return Outcome(replace(page, selected=selected))


def price_text(price: float) -> str:
    return f"${price:.2f}"


def render(page: Page, product_of: Callable[[str], Product], per_page: int) -> str:
    """The page as WebShop's text mode shows it (module docstring)."""
    if page.kind is PageKind.SEARCH:
        return SEARCH_BAR
    if page.kind is PageKind.RESULTS:
        lines = [f"[{BACK_TO_SEARCH}]", f"Page {page.page_no} (Total results: {len(page.results)})"]
        if page.page_no > 1:
            lines.append(f"[{PREV_PAGE}]")
        if page.page_no < n_pages(page, per_page):
            lines.append(f"[{NEXT_PAGE}]")
        for asin in page_results(page, per_page):
            p = product_of(asin)
            lines += [f"[{asin}]", p.title, price_text(p.price)]
        return "\n".join(lines)
    assert page.asin is not None
    product = product_of(page.asin)
    lines = [f"[{BACK_TO_SEARCH}]", f"[{PREV_PAGE}]"]
    if page.kind is PageKind.DETAIL:
        return "\n".join(lines + [_detail_text(product, page.detail or DETAILS[0])])
    lines += option_lines(product.options, page.options)
    lines += [product.title, f"Price: {price_text(product.price)}", "Rating: N.A."]
    lines += [f"[{d}]" for d in DETAILS] + [f"[{BUY_NOW}]"]
    return "\n".join(lines)


def option_lines(options: Mapping[str, tuple[str, ...]], selected: Mapping[str, str]) -> list[str]:
    """One line per option group: `size [small][large]`, and `(selected: small)` once chosen."""
    lines = []
    for group, values in options.items():
        line = f"{group} " + "".join(f"[{v}]" for v in values)
        if group in selected:
            line += f" (selected: {selected[group]})"
        lines.append(line)
    return lines


def _detail_text(product: Product, detail: str) -> str:
    if detail == "Description":
        return product.description
    if detail == "Features":
        return "\n".join(product.features)
    return "\n".join(product.reviews) if product.reviews else "No reviews."
