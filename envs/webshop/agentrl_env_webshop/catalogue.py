"""The generated WebShop catalogue: products, attributes and instructions in the original format.

:func:`generate_catalogue` writes the same three structures the original data files hold (a product
list, an ``asin -> {attributes}`` map and an ``asin -> [human instruction]`` map), so the generated
catalogue goes through exactly the loader, goal construction and splits the original data does.
Everything is drawn from one ``random.Random(seed)``, whose algorithm Python keeps stable, so the
catalogue is identical on every machine. 1,000 products and about 6,000 instructions take a
fraction of a second. :func:`write_catalogue_files` streams a catalogue of any size (the original's
1.18 M products: ``python -m agentrl_env_webshop.generate DIR``) into the full data files'
names, one product in memory at a time; above 2,000 products only every k-th product gets
instructions, so there are about 12,000 goals, as in the original's human instruction set.

Guarantees that make a perfect score reachable for every generated goal (the tests check them):

* goal attributes are attributes of the target product; goal options are values the target
  offers, at most one per option group;
* the target's price is below the goal's price bound (prices stay far below 980 dollars);
* option values never equal a page button, an ASIN or another value of the same product, so every
  one of them is a distinct clickable.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from agentrl_env_webshop.catalogue_vocab import (
    BRAND_SYLLABLES, CATEGORIES, OPTION_POOLS, TITLE_ADJECTIVES, TITLE_AUDIENCES,
)
from agentrl_env_webshop.products import (
    FULL_ATTRIBUTES_FILE, FULL_PRODUCTS_FILE, HUMAN_INSTRUCTIONS_FILE,
)

DEFAULT_NUM_PRODUCTS = 1000
FULL_NUM_PRODUCTS = 1_181_436  # products in the original's full items_shuffle.json
GOALS_PER_PRODUCT = 6
MAX_INSTRUCTED_PRODUCTS = 2000
NOUN_LEXICON_FILE = "noun_lexicon.json"
_ASIN_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"

# How an instruction asks for one option value, by option name.
_OPTION_PHRASES = {
    "color": [" in {v} color", ", and color is {v}", " in {v}"],
    "size": [", size {v}", " in size {v}", ", and size is {v}"],
    "flavor name": [" in {v} flavor", ", and flavor name is {v}"],
    "scent": [" with {v} scent", ", and scent is {v}"],
    "style": [" in the {v} style", ", and style is {v}"],
    "item package quantity": [", and item package quantity is {v}", " in a pack of {v}"],
    "capacity": [" with {v} capacity", ", and capacity is {v}"],
    "pattern name": [" with a {v} pattern", ", and pattern name is {v}"],
    "material type": [" in {v}", ", and material type is {v}"],
}


@dataclass(frozen=True)
class GeneratedCatalogue:
    """The generated data in the original file formats, plus the part of speech of title words."""

    products: list[dict[str, Any]]
    attributes: dict[str, dict[str, Any]]
    human_instructions: dict[str, list[dict[str, Any]]]
    noun_lexicon: dict[str, bool]


def _product_types() -> list[tuple[str, str, tuple]]:
    return [(cat, department, ptype)
            for cat, (department, _attrs, types) in CATEGORIES.items() for ptype in types]


def _is_plural(phrase: str) -> bool:
    last = phrase.split()[-1]
    return last.endswith("s") and not last.endswith("ss")


def _article(next_word: str) -> str:
    return "an " if next_word[0] in "aeiou" else "a "


def _brand(rng: random.Random) -> str:
    return "".join(rng.choice(BRAND_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _asin(rng: random.Random, used: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(_ASIN_CHARS) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _option_values(rng: random.Random, pool_key: str) -> tuple[str, list[str]]:
    name, pool = OPTION_POOLS[pool_key]
    if name == "size":  # sizes come as a contiguous run, like real listings
        count = rng.randint(3, min(6, len(pool)))
        start = rng.randint(0, len(pool) - count)
        return name, pool[start:start + count]
    return name, rng.sample(pool, rng.randint(2, min(5, len(pool))))


def _price_text(rng: random.Random, lo: int, hi: int) -> str:
    price = rng.randint(lo, hi) - 0.01
    if rng.random() < 0.12:
        return f"${price:.2f}${price + rng.randint(3, 15):.2f}"
    return f"${price:.2f}"


def _instruction(rng: random.Random, phrase: str, attrs: list[str],
                 options: dict[str, str]) -> str:
    verb = "are" if _is_plural(phrase) else "is"
    art = "" if _is_plural(phrase) else None
    both = " and ".join(attrs)
    first, rest = attrs[0], " and ".join(attrs[1:])
    template = rng.randrange(6)
    if template == 0:
        text = f"i need {_a(art, first)}{first} {phrase}" + (f" which {verb} {rest}" if rest else "")
    elif template == 1:
        text = f"i am looking for {_a(art, phrase)}{phrase} that {verb} {both}"
    elif template == 2:
        text = f"i want {_a(art, first)}{', '.join(attrs)} {phrase}"
    elif template == 3:
        text = f"find me {_a(art, phrase)}{phrase} that {verb} {both}"
    elif template == 4:
        text = f"i would like {_a(art, first)}{first} {phrase}" + (f" that {verb} {rest}" if rest
                                                                  else "")
    else:
        text = f"i'm looking for {_a(art, both)}{both} {phrase}"
    for name, value in options.items():
        text += rng.choice(_OPTION_PHRASES[name]).format(v=value)
    return text


def _a(art: str | None, next_text: str) -> str:
    return _article(next_text) if art is None else art


def _noun_lexicon() -> dict[str, bool]:
    lexicon: dict[str, bool] = {}
    for word in TITLE_ADJECTIVES + ["for", "and", "with"]:
        lexicon[word] = False
    for _dept, attrs, _types in CATEGORIES.values():
        for attr in attrs:
            for word in attr.split():
                lexicon[word] = False
    for audiences in TITLE_AUDIENCES.values():
        for word in audiences:
            lexicon[word] = True
    for _cat, _dept, ptype in _product_types():
        for word in ptype[0].split():
            lexicon[word] = True
    return lexicon


def generate_catalogue(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0,
                       goals_per_product: int = GOALS_PER_PRODUCT) -> GeneratedCatalogue:
    """Generate ``num_products`` products (round-robin over product types) and their goals."""
    lexicon = _noun_lexicon()
    products, attributes, instructions = [], {}, {}
    for product, attrs, goals in iter_catalogue(num_products, seed, goals_per_product, lexicon):
        products.append(product)
        attributes[product["asin"]] = attrs
        if goals is not None:
            instructions[product["asin"]] = goals
    return GeneratedCatalogue(products, attributes, instructions, lexicon)


def instruction_stride(num_products: int) -> int:
    """Every how many products one gets instructions: 1 up to 2,000 products, then about 2,000
    instructed products in all (about 12,000 goals, the size of the original's human set)."""
    return max(1, -(-num_products // MAX_INSTRUCTED_PRODUCTS))


def iter_catalogue(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0,
                   goals_per_product: int = GOALS_PER_PRODUCT,
                   lexicon: dict[str, bool] | None = None
                   ) -> Iterator[tuple[dict[str, Any], dict[str, Any], list | None]]:
    """``(product, attribute entry, instructions or None)`` one product at a time.

    Adds every brand to ``lexicon`` (as a noun) when given. Up to 2,000 products every product has
    instructions; above that only every :func:`instruction_stride`-th does.
    """
    if num_products <= 0:
        raise ValueError(f"num_products must be positive, got {num_products}")
    rng = random.Random(seed)
    types = _product_types()
    stride = instruction_stride(num_products)
    used_asins: set[str] = set()
    for index in range(num_products):
        category, department, (phrase, query, path, (lo, hi), pools) = types[index % len(types)]
        attr_pool = CATEGORIES[category][1]
        asin = _asin(rng, used_asins)
        brand = _brand(rng)
        if lexicon is not None:
            lexicon[brand.lower()] = True
        attrs = rng.sample(attr_pool, rng.randint(3, 5))
        audience = rng.choice(TITLE_AUDIENCES[category])
        adjective = rng.choice(TITLE_ADJECTIVES)
        title = (f"{brand} {adjective.title()} {phrase.title()} for {audience.title()}, "
                 f"{attrs[0].title()} and {attrs[1].title()}")
        options = dict(_option_values(rng, key) for key in pools)
        option_count = " and ".join(f"{len(v)} {n}" for n, v in options.items())
        description = (f"The {brand} {phrase} is {', '.join(attrs[:-1])} and {attrs[-1]}. "
                       f"Made for {audience}, it comes in {option_count} choices.")
        bullets = [f"{a.upper()}: this {phrase} is {a}, chosen by {audience} every day."
                   for a in attrs]
        product = {
            "asin": asin, "name": title, "full_description": description,
            "small_description": bullets, "pricing": _price_text(rng, lo, hi),
            "customization_options": {
                name.title(): [{"value": v, "image": None} for v in values]
                for name, values in options.items()},
            "images": [""], "category": category, "query": query,
            "product_category": f"{department} › {path}",
        }
        goals = (_product_instructions(rng, phrase, attrs, options, goals_per_product)
                 if index % stride == 0 else None)
        yield product, {"attributes": attrs}, goals


def write_catalogue_files(out_dir: str | Path, num_products: int, seed: int = 0,
                          goals_per_product: int = GOALS_PER_PRODUCT) -> Path:
    """Write the generated catalogue as the original's full data files, streaming.

    ``items_shuffle.json`` (products), ``items_ins_v2.json`` (attributes), ``items_human_ins.json``
    (instructions) and ``noun_lexicon.json`` (the part of speech of every title word, which the
    loader uses instead of spaCy when present). One product is in memory at a time; the files are
    written under temporary names and renamed when complete. 1.18 M products: about 1.4 GB.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = (FULL_PRODUCTS_FILE, FULL_ATTRIBUTES_FILE, HUMAN_INSTRUCTIONS_FILE, NOUN_LEXICON_FILE)
    tmp = {name: out / f".{name}.{os.getpid()}.tmp" for name in names}
    lexicon = _noun_lexicon()
    with open(tmp[FULL_PRODUCTS_FILE], "w", encoding="utf-8") as products, \
            open(tmp[FULL_ATTRIBUTES_FILE], "w", encoding="utf-8") as attributes, \
            open(tmp[HUMAN_INSTRUCTIONS_FILE], "w", encoding="utf-8") as human:
        first_goal = True
        for n, (product, attrs, goals) in enumerate(
                iter_catalogue(num_products, seed, goals_per_product, lexicon)):
            sep = "[\n" if n == 0 else ",\n"
            products.write(sep + json.dumps(product, ensure_ascii=False))
            key = json.dumps(product["asin"])
            attributes.write(("{\n" if n == 0 else ",\n") + f"{key}: {json.dumps(attrs)}")
            if goals is not None:
                human.write(("{\n" if first_goal else ",\n") + f"{key}: {json.dumps(goals)}")
                first_goal = False
        products.write("\n]\n")
        attributes.write("\n}\n")
        human.write("{}\n" if first_goal else "\n}\n")
    tmp[NOUN_LEXICON_FILE].write_text(json.dumps(lexicon), encoding="utf-8")
    for name in names:
        os.replace(tmp[name], out / name)
    return out


def _product_instructions(rng: random.Random, phrase: str, attrs: list[str],
                          options: dict[str, list[str]], count: int) -> list[dict[str, Any]]:
    result, seen = [], set()
    for _ in range(count * 3):
        if len(result) == count:
            break
        goal_attrs = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
        goal_options = {name: rng.choice(values) for name, values in options.items()
                        if rng.random() < 0.8}
        text = _instruction(rng, phrase, goal_attrs, goal_options)
        if text in seen:
            continue
        seen.add(text)
        result.append({"instruction": text, "instruction_attributes": goal_attrs,
                       "instruction_options": list(goal_options.values())})
    return result

