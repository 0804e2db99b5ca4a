"""Products and goals in the original WebShop data format, and the task splits.

Input records use the field names of the original files:

* ``items_shuffle_1000.json`` (or the full ``items_shuffle.json``): a list of products ``{asin, name, full_description,
  small_description (list or str), pricing ("$19.99" or "$19.99$29.99"), customization_options
  {Name: [{value, image}]}, images, category, query, product_category ("A › B › C")}``;
* ``items_ins_v2_1000.json`` (or ``items_ins_v2.json``): ``{asin: {attributes: [...], instruction, instruction_attributes}}``;
* ``items_human_ins.json``: ``{asin: [{instruction, instruction_attributes,
  instruction_options}]}``;
* optionally ``reviews.json``: ``[{asin, reviews: [{title, score|stars, body|review}],
  average_rating}]``.

:func:`normalize_products` turns them into the dictionaries the pages and the reward read
(``Title``, ``Description``, ``BulletPoints``, ``Price``, ``pricing``, ``options``,
``Attributes``, ...), exactly as the original loader does. :func:`human_goals` and
:func:`synthetic_goals` build goals as the original does; the random draws it leaves unseeded
(range prices, the price bound) come from one seeded generator here so that every machine sees the
same tasks. :func:`split_goals` shuffles with seed 233 and cuts test 0-499, eval 500-1499, train
1500 onwards.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_LIMIT = 1000000
GOAL_SHUFFLE_SEED = 233
SPLIT_BOUNDS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}

PRODUCTS_FILE = "items_shuffle_1000.json"
ATTRIBUTES_FILE = "items_ins_v2_1000.json"
FULL_PRODUCTS_FILE = "items_shuffle.json"
FULL_ATTRIBUTES_FILE = "items_ins_v2.json"
HUMAN_INSTRUCTIONS_FILE = "items_human_ins.json"
REVIEWS_FILE = "reviews.json"


def parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    """``"$19.99$29.99"`` -> ``([19.99, 29.99], "$19.99 to $29.99")``; missing -> 100.0."""
    if not pricing:
        return [100.0], "$100.0"
    values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def normalize_products(raw_products: Iterable[Mapping[str, Any]],
                       attributes: Mapping[str, Any],
                       human_instructions: Mapping[str, Any] | None = None,
                       reviews: Iterable[Mapping[str, Any]] | None = None,
                       num_products: int | None = None) -> list[dict[str, Any]]:
    """Products in the form the pages and the reward read (the original loader's rules)."""
    return list(iter_normalized_products(raw_products, attributes, human_instructions,
                                         reviews=reviews, num_products=num_products))


def iter_normalized_products(raw_products: Iterable[Mapping[str, Any]],
                             attributes: Mapping[str, Any],
                             human_instructions: Mapping[str, Any] | None = None,
                             reviews: Iterable[Mapping[str, Any]] | None = None,
                             num_products: int | None = None) -> Iterator[dict[str, Any]]:
    """:func:`normalize_products` one product at a time (``raw_products`` may be a stream)."""
    all_reviews: dict[str, list] = {}
    all_ratings: dict[str, Any] = {}
    for entry in reviews or []:
        all_reviews[entry["asin"]] = entry["reviews"]
        all_ratings[entry["asin"]] = entry["average_rating"]
    if num_products is not None:  # the first N raw records, skipped ones included
        raw_products = itertools.islice(raw_products, num_products)
    seen: set[str] = set()
    for raw in raw_products:
        asin = raw["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        yield _normalize_product(raw, attributes, human_instructions, all_reviews, all_ratings)


def _normalize_product(raw: Mapping[str, Any], attributes: Mapping[str, Any],
                       human_instructions: Mapping[str, Any] | None,
                       all_reviews: Mapping[str, list], all_ratings: Mapping[str, Any]
                       ) -> dict[str, Any]:
    asin = raw["asin"]
    product = dict(raw)
    product["Title"] = raw["name"]
    product["Description"] = raw["full_description"]
    product["Reviews"] = [_normalize_review(r) for r in all_reviews.get(asin, [])]
    product["Rating"] = all_ratings.get(asin, "N.A.")
    small = raw["small_description"]
    product["BulletPoints"] = list(small) if isinstance(small, list) else [small]
    product["pricing"], product["Price"] = parse_pricing(raw.get("pricing"))
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    for option_name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[option_name.lower()] = values
    product["options"] = options
    product["option_to_image"] = option_to_image
    attr_entry = attributes.get(asin) or {}
    product["Attributes"] = list(attr_entry.get("attributes") or ["DUMMY_ATTR"])
    if human_instructions is not None:
        if asin in human_instructions:
            product["instructions"] = human_instructions[asin]
    else:
        product["instruction_text"] = attr_entry.get("instruction")
        product["instruction_attributes"] = attr_entry.get("instruction_attributes")
    images = raw.get("images") or [""]
    product["MainImage"] = images[0]
    product["query"] = raw["query"].lower().strip()
    return product


def _normalize_review(review: Mapping[str, Any]) -> dict[str, Any]:
    review = dict(review)
    if "score" not in review:
        review["score"] = review.pop("stars")
    review["body"] = review.pop("review") if "review" in review else review.get("body", "")
    return review


def product_prices(products: Iterable[Mapping[str, Any]], rng: random.Random) -> dict[str, float]:
    """The price the reward compares: the single price, or a uniform draw inside a range."""
    prices = {}
    for product in products:
        pricing = product["pricing"]
        prices[product["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return prices


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """The goal's upper price and its instruction suffix (the larger of two of the next 4 tens)."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_LIMIT, ""
    _, upper = sorted(rng.sample(candidates, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def human_goals(products: Iterable[Mapping[str, Any]], prices: Mapping[str, float],
                rng: random.Random) -> list[dict[str, Any]]:
    """One goal per human instruction that names at least one attribute."""
    goals = []
    for item in products:
        for ins in item.get("instructions", []):
            attributes = ins["instruction_attributes"]
            if len(attributes) == 0:
                continue
            upper, price_text = price_bound(prices[item["asin"]], rng)
            goals.append({
                "asin": item["asin"], "category": item["category"], "query": item["query"],
                "name": item["name"], "product_category": item["product_category"],
                "instruction_text": ins["instruction"].strip(".") + price_text,
                "attributes": attributes, "price_upper": upper,
                "goal_options": ins["instruction_options"], "weight": 1,
            })
    return goals


def synthetic_goals(products: Iterable[Mapping[str, Any]], prices: Mapping[str, float],
                    rng: random.Random) -> list[dict[str, Any]]:
    """One goal per option combination of every product with a templated instruction."""
    goals = []
    for product in products:
        if product.get("instruction_text") is None:
            continue
        upper, price_text = price_bound(prices[product["asin"]], rng)
        options = product["options"]
        names = sorted(options)
        for combination in itertools.product(*(options[n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"],
                "query": product["query"], "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": product["instruction_attributes"], "price_upper": upper,
                "goal_options": goal_options, "weight": 1,
            })
    return goals


def split_goals(goals: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Seeded shuffle (seed 233), then test 0-499, eval 500-1499, train the rest."""
    shuffled = list(goals)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(shuffled)
    return {name: shuffled[lo:hi] for name, (lo, hi) in SPLIT_BOUNDS.items()}


def original_file_paths(data_dir: str | Path, files: str = "auto") -> dict[str, Path | None]:
    """The data files of ``data_dir``: ``products``, ``attributes``, ``human_instructions`` and
    ``reviews`` (``None`` when absent).

    ``files="1000"`` reads the 1,000-product files (``items_shuffle_1000.json``,
    ``items_ins_v2_1000.json``), ``"full"`` the full ones (``items_shuffle.json``,
    ``items_ins_v2.json``, about 1.18 M products), ``"auto"`` the full ones when both are
    present, else the 1,000-product ones. ``items_human_ins.json`` is the same file for both.
    """
    data_dir = Path(data_dir)
    if files not in ("auto", "full", "1000"):
        raise ValueError(f"files must be 'auto', 'full' or '1000', got {files!r}")
    full = [data_dir / FULL_PRODUCTS_FILE, data_dir / FULL_ATTRIBUTES_FILE]
    if files == "full" or (files == "auto" and all(p.is_file() for p in full)):
        products, attributes = full
    else:
        products, attributes = data_dir / PRODUCTS_FILE, data_dir / ATTRIBUTES_FILE
    human = data_dir / HUMAN_INSTRUCTIONS_FILE
    missing = [p.name for p in (products, attributes, human) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"WebShop data_dir {str(data_dir)!r} lacks {', '.join(missing)}")
    reviews = data_dir / REVIEWS_FILE
    return {"products": products, "attributes": attributes, "human_instructions": human,
            "reviews": reviews if reviews.is_file() else None}


def load_original_files(data_dir: str | Path, files: str = "auto") -> dict[str, Any]:
    """Read the original data files from ``data_dir`` (reviews are optional) into memory."""
    paths = original_file_paths(data_dir, files)

    def read(path: Path | None) -> Any:
        if path is None:
            return None
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    return {name: read(path) for name, path in paths.items()}


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_READ_CHARS = 1 << 23


def iter_json_items(path: str | Path) -> Iterator[Any]:
    """The elements of a top-level JSON array (``[...]``) or the ``(key, value)`` pairs of a
    top-level object (``{...}``), parsed one at a time from ``path``.

    Reads the file in 8 M-character pieces, so memory holds one piece and one element at a time,
    not the whole document: the full ``items_shuffle.json`` (about 5 GB, 1.18 M products) streams
    through in constant memory. The values are exactly what ``json.load`` would give.
    """
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def more() -> None:
            nonlocal buf, pos, eof
            chunk = f.read(_READ_CHARS)
            eof = chunk == ""
            buf, pos = buf[pos:] + chunk, 0

        def skip() -> str:  # the next non-blank character ("" at the end of the file)
            nonlocal pos
            while True:
                pos = _WHITESPACE.match(buf, pos).end()
                if pos < len(buf) or eof:
                    return buf[pos:pos + 1]
                more()

        def value() -> Any:
            nonlocal pos
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    if eof:
                        raise
                    more()
                    continue
                if end < len(buf) or eof:  # a number at the end of the piece may go on
                    pos = end
                    return obj
                more()

        opener = skip()
        if opener not in ("[", "{"):
            raise ValueError(f"{path}: expected a JSON array or object, found {opener!r}")
        closer = "]" if opener == "[" else "}"
        pos += 1
        if skip() == closer:
            return
        while True:
            if opener == "[":
                yield value()
            else:
                key = value()
                if skip() != ":":
                    raise ValueError(f"{path}: expected ':' after key {key!r}")
                pos += 1
                skip()
                yield key, value()
            separator = skip()
            pos += 1
            if separator == closer:
                return
            if separator != ",":
                raise ValueError(f"{path}: expected ',' or {closer!r}, found {separator!r}")
            skip()
