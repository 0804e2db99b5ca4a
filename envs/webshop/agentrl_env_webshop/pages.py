"""The text-mode pages of WebShop.

The original renders HTML templates and, in ``text`` observation mode, joins the page's visible
text nodes, each stripped, with ``" [SEP] "`` (whitespace-only nodes dropped). These functions
produce the same strings directly from the page contents. The clickables of a page are the
lowercased texts of its buttons and product links in page order, then its option values; this is
what ``click[...]`` accepts.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

SEP = " [SEP] "
BACK_TO_SEARCH = "Back to Search"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BUY_NOW = "Buy Now"
SEARCH_BUTTON = "Search"
SUB_PAGES = ("Description", "Features", "Reviews")
PRODUCTS_PER_PAGE = 10


def _visible(text: Any) -> str | None:
    """A text node as the text mode shows it: stripped; ``None`` when the node would not exist."""
    text = str(text)
    if text == "" or (text.strip() == "" and "\n" in text):
        return None
    return text.strip()


def join_visible(parts: Iterable[Any]) -> str:
    return SEP.join(v for v in (_visible(p) for p in parts) if v is not None)


def _instruction_header(instruction: str) -> list[str]:
    return ["Instruction:", instruction]


def search_page(instruction: str) -> str:
    return join_visible(["WebShop", *_instruction_header(instruction), SEARCH_BUTTON])


def results_page(instruction: str, page_products: Sequence[Mapping[str, Any]], page: int,
                 total: int) -> str:
    parts = [*_instruction_header(instruction), BACK_TO_SEARCH,
             f"Page {page} (Total results: {total})"]
    if page > 1:
        parts.append(PREV_PAGE)
    parts.append(NEXT_PAGE)
    for product in page_products:
        parts += [product["asin"], product["Title"], product["Price"]]
    return join_visible(parts)


def item_page(instruction: str, product: Mapping[str, Any]) -> str:
    parts = [*_instruction_header(instruction), BACK_TO_SEARCH, PREV_PAGE]
    for option_name, values in product["options"].items():
        parts.append(option_name)
        parts += values
    parts += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}",
              *SUB_PAGES, BUY_NOW]
    return join_visible(parts)


def sub_page(instruction: str, product: Mapping[str, Any], name: str) -> str:
    parts = [*_instruction_header(instruction), BACK_TO_SEARCH, PREV_PAGE]
    if name == "Description":
        parts.append(product["Description"])
    elif name == "Features":
        parts += product["BulletPoints"]
    elif name == "Reviews":
        for review in product["Reviews"]:
            parts += [f'"{review.get("title", "")}"', review.get("score", ""),
                      review.get("body", "")]
    else:
        raise ValueError(f"unknown sub-page {name!r}")
    return join_visible(parts)


def _html_safe_json(value: Any) -> str:
    # Flask's ``tojson`` filter: sorted keys, ASCII only, HTML-sensitive characters escaped.
    text = json.dumps(value, sort_keys=True)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return text


def done_page(asin: str, options: Mapping[str, str], reward: float) -> str:
    """The confirmation page; the template's unset fields render as ``None`` or not at all."""
    parts = ["Thank you for shopping with us!", "Your code:", "None",
             "(Paste it in your MTurk interface.)", "Purchased", "asin", asin,
             "options", _html_safe_json(dict(options)), "attrs", "None", "category", "None",
             "query", "None", "product category", "None", "Target", "asin", "options", "attrs",
             "price upper", "instuction text", "category", "product category", "query",
             "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)", str(reward),
             "Reward Details", "None"]
    return join_visible(parts)


def results_clickables(page_products: Sequence[Mapping[str, Any]], page: int) -> list[str]:
    buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if page > 1 else []) + [NEXT_PAGE]
    return _unique([b.lower() for b in buttons] + [p["asin"].lower() for p in page_products])


def item_clickables(product: Mapping[str, Any]) -> list[str]:
    buttons = [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, BUY_NOW]
    values = [v for values in product["options"].values() for v in values]
    return _unique([b.lower() for b in buttons] + values)


def sub_page_clickables() -> list[str]:
    return [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]


def search_clickables() -> list[str]:
    return [SEARCH_BUTTON.lower()]


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def page_slice(products: Sequence[Any], page: int) -> list[Any]:
    return list(products[(page - 1) * PRODUCTS_PER_PAGE:page * PRODUCTS_PER_PAGE])
