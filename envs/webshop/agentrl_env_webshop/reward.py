"""WebShop's purchase score, computed the way the original benchmark computes it.

``score = r_type * (n_attr + n_opt + r_price) / (len(goal_attrs) + len(goal_opts) + 1)``

* ``n_attr``: goal attributes matched by some product attribute with a fuzzy token-set ratio above
  85, or, failing that, found as a substring of the lowercased title, features or description;
* ``n_opt``: chosen options that match a goal option (``size`` exactly, every other option name
  fuzzily, both sides colour-normalised), or, failing that, appear in the product text;
* ``r_price``: 1 when the price is at most the goal's upper bound;
* ``r_type``: 1.0, lowered to 0.5 when neither the search query, two category levels nor enough
  title nouns agree, to 0.1 when under a tenth of the goal title's nouns are shared and to 0.0 when
  none are.

Products and goals are the plain dictionaries of :mod:`agentrl_env_webshop.products` (the original
field names: ``Title``, ``BulletPoints``, ``Description``, ``Attributes``, ``name``, ``query``,
``product_category``; goals carry ``attributes``, ``goal_options``, ``price_upper``).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Callable, Iterable, Mapping

FUZZY_THRESHOLD = 85
EXACT_MATCH_OPTION_NAMES = ("size",)

# The fixed colour vocabulary of the original benchmark, in its order: ``normalize_color`` returns
# the first of these contained in the option text.
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

NounExtractor = Callable[[str], list[str]]


def normalize_color(text: str) -> str:
    """The first colour of :data:`COLOR_SET` that occurs in ``text``; ``text`` itself if none."""
    for color in COLOR_SET:
        if color in text:
            return color
    return text


# thefuzz 0.19.0 (the version the original pins) ``utils.full_process(force_ascii=True)``: drop the
# characters 128-255, turn every non-word character (``\W``) into a space, lowercase, strip.
_LATIN1_HIGH = dict.fromkeys(range(128, 256))
_NON_WORD = re.compile(r"(?ui)\W")


def _full_process(text: str) -> str:
    return _NON_WORD.sub(" ", text.translate(_LATIN1_HIGH)).lower().strip()


def _ratio(a: str, b: str) -> int:
    # thefuzz 0.19.0 ``fuzz.ratio`` without python-Levenshtein (not in the original's requirements):
    # difflib's matching blocks, ``int(round(100 * ratio))`` (round half to even).
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz 0.19.0 ``fuzz.token_set_ratio(a, b)`` exactly: an integer 0..100, 0 when either side
    is empty after processing. Not symmetric in general (difflib is not), so keep the original's
    argument order."""
    pa, pb = _full_process(a), _full_process(b)
    if not pa or not pb:
        return 0
    tokens_a, tokens_b = set(pa.split()), set(pb.split())
    sect = " ".join(sorted(tokens_a & tokens_b))
    a_rest = (sect + " " + " ".join(sorted(tokens_a - tokens_b))).strip()
    b_rest = (sect + " " + " ".join(sorted(tokens_b - tokens_a))).strip()
    sect = sect.strip()
    return max(_ratio(sect, a_rest), _ratio(sect, b_rest), _ratio(a_rest, b_rest))


def _product_text_contains(product: Mapping[str, Any], needle: str) -> bool:
    return (needle in product["Title"].lower()
            or needle in " ".join(product["BulletPoints"]).lower()
            or needle in product["Description"].lower())


def attribute_matches(product: Mapping[str, Any], goal_attributes: Iterable[str]) -> int:
    """How many goal attributes the product has (fuzzy attribute match, else text fallback)."""
    matches = 0
    for goal_attr in goal_attributes:
        # original: fuzz.token_set_ratio(p_attr, g_attr) > 85, the product attribute first
        if any(token_set_ratio(p_attr, goal_attr) > FUZZY_THRESHOLD
               for p_attr in product["Attributes"]):
            matches += 1
        elif _product_text_contains(product, goal_attr):
            matches += 1
    return matches


def option_matches(product: Mapping[str, Any], goal_options: Iterable[str],
                   chosen_options: Mapping[str, str]) -> int:
    """How many chosen options match a goal option (counted per chosen option, as originally)."""
    goal_norm = [normalize_color(o) for o in goal_options]
    matches = 0
    for name, value in chosen_options.items():
        value = normalize_color(value)
        if name.lower() in EXACT_MATCH_OPTION_NAMES:
            matched = value in goal_norm
        else:
            # original: fuzz.token_set_ratio(g_option, p_option_v) > 85, the goal option first
            matched = any(token_set_ratio(g, value) > FUZZY_THRESHOLD for g in goal_norm)
        if matched or _product_text_contains(product, value):
            matches += 1
    return matches


def type_reward(product: Mapping[str, Any], goal: Mapping[str, Any],
                nouns: NounExtractor) -> dict[str, Any]:
    """The type factor ``r_type`` and its parts (query match, category match, title score)."""
    query_match = product["query"] == goal["query"]
    bought_levels = {x.strip() for x in product["product_category"].split("›")}
    goal_levels = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(bought_levels & goal_levels) >= 2
    bought_nouns = nouns(product["name"])
    goal_nouns = nouns(goal["name"])
    if goal_nouns:
        title_score = len(set(bought_nouns) & set(goal_nouns)) / len(goal_nouns)
    else:
        title_score = 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def goal_option_values(goal: Mapping[str, Any]) -> list[str]:
    options = goal["goal_options"]
    return list(options.values()) if isinstance(options, Mapping) else list(options)


def purchase_reward(product: Mapping[str, Any], goal: Mapping[str, Any], price: float,
                    chosen_options: Mapping[str, str],
                    nouns: NounExtractor) -> tuple[float, dict[str, Any]]:
    """The score of buying ``product`` at ``price`` with ``chosen_options`` for ``goal``.

    Returns ``(score, parts)`` where ``parts`` holds the sub-scores (``r_type``, ``r_att``,
    ``r_option``, ``r_price``, the match counts and the type details).
    """
    type_parts = type_reward(product, goal, nouns)
    goal_options = goal_option_values(goal)
    r_price = price <= goal["price_upper"]
    n_attr = attribute_matches(product, goal["attributes"])
    n_opt = option_matches(product, goal_options, chosen_options)
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    score = (n_attr + n_opt + r_price) / denominator
    score *= type_parts["r_type"]
    parts = dict(type_parts)
    parts.update({
        "num_attr_matches": n_attr, "num_option_matches": n_opt, "r_price": bool(r_price),
        "r_att": n_attr / len(goal["attributes"]) if goal["attributes"] else None,
        "r_option": n_opt / len(goal_options) if goal_options else None,
    })
    return score, parts
