"""How a page is written for the agent: two observation formats (`env.observation`).

`lines` (the default): one thing a line, every clickable in brackets, the form of the ReAct
and AgentBench WebShop prompts:

    search page      [Search]
    results page     [Back to Search] / Page 1 (Total results: 50) / [< Prev] (from page 2)
                     / [Next >] / then per product: [ASIN] / title / price text
    item page        [Back to Search] / [< Prev] / each option group and its [values] /
                     title / Price: <price text> / Rating: N.A. / [Description] /
                     [Features] / [Reviews] / [Buy Now]
    detail page      [Back to Search] / [< Prev] / the description, features or reviews

Where it departs from WebShop's text: the instruction is not repeated at the top of every
page (it is in the task prompt, which every memory keeps); a selected option is shown as
`(selected: value)` after its group, where WebShop's text shows no selection.

`webshop`: MEM1's WebShop observation (MEM1's `WebShopEnv` over WebShop's text environment in
its `text` mode): the page's visible texts stripped and joined with " [SEP] " (the
instruction at the top of every page, "WebShop" and the search button's "Search" on the
search page), then "Current available actions: " and the list MEM1 builds from the page's
clickables (`search[<content>]` where the page has the search bar, `click[key]` for each
other, keyed as WebShop keys them: mem1_core.webshop.pages.clickables).

Prices: every page shows the product's price text (WebShop's `Price`: "$12.99 to $24.99"
for a listed range), never the hidden price drawn within it that the reward checks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from mem1_core.webshop.catalog import Product
from mem1_core.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    DETAILS,
    PREV_PAGE,
    SEARCH,
    Page,
    PageKind,
    buttons,
    clickables,
    page_results,
)

OBSERVATIONS = ("lines", "webshop")
"""The observation formats (module docstring)."""
SEARCH_BAR = "[Search]"
SEP = " [SEP] "
SEARCH_ACTION = "search[<content>]"
"""How MEM1 lists the search bar among the available actions."""


def render(page: Page, product_of: Callable[[str], Product], per_page: int) -> str:
    """The page in the `lines` format (module docstring)."""
    if page.kind is PageKind.SEARCH:
        return SEARCH_BAR
    if page.kind is PageKind.RESULTS:
        lines = [f"[{BACK_TO_SEARCH}]", f"Page {page.page_no} (Total results: {len(page.results)})"]
        lines += [f"[{b}]" for b in buttons(page)[1:]]
        for asin in page_results(page, per_page):
            p = product_of(asin)
            lines += [f"[{asin}]", p.title, p.shown_price]
        return "\n".join(lines)
    assert page.asin is not None
    product = product_of(page.asin)
    lines = [f"[{BACK_TO_SEARCH}]", f"[{PREV_PAGE}]"]
    if page.kind is PageKind.DETAIL:
        texts = [t.strip() for t in detail_texts(product, page.detail or DETAILS[0])]
        return "\n".join(lines + texts)
    lines += option_lines(product.options, page.options)
    lines += [product.title, f"Price: {product.shown_price}", "Rating: N.A."]
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


def detail_texts(product: Product, detail: str) -> list[str]:
    """A detail page's texts: the description (WebShop's template writes a null one as
    "None"), the feature bullets (each written after a space, so an empty one still shows),
    or the reviews (WebShop's text environment loads none)."""
    if detail == "Description":
        return [str(product.description)]
    if detail == "Features":
        return [f" {b}" for b in product.features]
    return list(product.reviews)


def _joined(texts: list[str]) -> str:
    """WebShop's text mode: an empty template value leaves no text on the page; the others
    are stripped and joined."""
    return SEP.join(t.strip() for t in texts if t)


def render_webshop(
    page: Page, product_of: Callable[[str], Product], per_page: int, instruction: str
) -> str:
    """The page as WebShop's text environment writes it in its `text` mode: the visible
    texts of its HTML page, each stripped, joined with " [SEP] "."""
    texts = [] if page.kind is not PageKind.SEARCH else ["WebShop"]
    texts += ["Instruction:", instruction]
    if page.kind is PageKind.SEARCH:
        return _joined([*texts, "Search"])
    texts.append(BACK_TO_SEARCH)
    if page.kind is PageKind.RESULTS:
        texts.append(f"Page {page.page_no} (Total results: {len(page.results)})")
        texts += buttons(page)[1:]
        for asin in page_results(page, per_page):
            p = product_of(asin)
            texts += [asin, p.title, p.shown_price]
        return _joined(texts)
    assert page.asin is not None
    product = product_of(page.asin)
    texts.append(PREV_PAGE)
    if page.kind is PageKind.DETAIL:
        texts += detail_texts(product, page.detail or DETAILS[0])
        return _joined(texts)
    for group, values in product.options.items():
        texts += [group, *values]
    texts += [product.title, f"Price: {product.shown_price}", "Rating: N.A.", *DETAILS, BUY_NOW]
    return _joined(texts)


def available_actions(page: Page, product_of: Callable[[str], Product], per_page: int) -> list[str]:
    """MEM1's list of a page's actions: `search[<content>]` on the page with the search bar,
    then `click[key]` for each clickable (WebShop's keys, in its order)."""
    product = product_of(page.asin) if page.asin is not None else None
    keys = [k for k in clickables(page, product, per_page) if k != SEARCH]
    head = [SEARCH_ACTION] if page.kind is PageKind.SEARCH else []
    return head + [f"click[{k}]" for k in keys]


def observe(
    kind: str,
    page: Page,
    product_of: Callable[[str], Product],
    per_page: int,
    instruction: str,
) -> str:
    """The observation of `page` in format `kind` (`OBSERVATIONS`)."""
    if kind == "lines":
        return render(page, product_of, per_page)
    if kind != "webshop":
        raise ValueError(f"observation {kind!r}: use one of {OBSERVATIONS}")
    text = render_webshop(page, product_of, per_page, instruction)
    return f"{text}\n\nCurrent available actions: {available_actions(page, product_of, per_page)}"


def listed_title(observations: Iterable[str], asin: str) -> str | None:
    """The title a results page showed for `asin`, in either format (each lists the item's
    `[ASIN]` or `ASIN`, then its title, then its price text): from the last of `observations`
    that listed it; None where none did."""
    title = None
    for text in observations:
        pieces = [p.strip() for p in re.split(r"\n|" + re.escape(SEP), text)]
        for here, after in zip(pieces, pieces[1:], strict=False):
            if here in (asin, f"[{asin}]"):
                title = after
    return title


def first_observation(kind: str, instruction: str) -> str:
    """What the task prompt shows before the first action: the search page (`lines`), or
    MEM1's first state, the instruction and the search action (`webshop`)."""
    if kind == "lines":
        return SEARCH_BAR
    if kind != "webshop":
        raise ValueError(f"observation {kind!r}: use one of {OBSERVATIONS}")
    return f"Instruction: {instruction}\nAvailable actions: {SEARCH_ACTION}"
