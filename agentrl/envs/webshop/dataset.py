"""Everything a WebShop environment reads, built once per process and shared by all instances.

:func:`load_webshop_data` either reads the original data files (``data_dir``) or generates the
catalogue, then runs the original's product normalisation, goal construction and split, and builds
the search index and the noun tagger. Results are cached per argument tuple, so the G environments
of a group (and all environments of a pool) share one copy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from agentrl.envs.webshop import products as prod
from agentrl.envs.webshop.catalogue import DEFAULT_NUM_PRODUCTS, generate_catalogue
from agentrl.envs.webshop.nouns import LexiconNounTagger, spacy_tagger_or_heuristic
from agentrl.envs.webshop.search import ProductSearchEngine, product_document


@dataclass(frozen=True)
class WebShopData:
    """Products (normalised), prices, goals by split, the search engine and the noun tagger."""

    products: list[dict[str, Any]]
    by_asin: dict[str, dict[str, Any]]
    prices: dict[str, float]
    splits: dict[str, list[dict[str, Any]]]
    search_engine: ProductSearchEngine
    nouns: Callable[[str], list[str]]
    source: str

    def search(self, query: str) -> list[dict[str, Any]]:
        """The top-50 products for ``query`` (positive BM25 score only), best first."""
        return [self.products[i] for i in self.search_engine.search(query)]


@lru_cache(maxsize=8)
def load_webshop_data(data_dir: str | None = None, num_products: int | None = None,
                      seed: int = 0, human_goals: bool = True,
                      spacy_model: str | None = "en_core_web_sm") -> WebShopData:
    """Build (or fetch from the per-process cache) the data for one configuration.

    ``data_dir``: directory with the original files; ``None`` generates the catalogue.
    ``num_products``: first N products only (default: all original products, or 1,000 generated).
    ``seed``: seeds the draws the original leaves unseeded (range prices, price bounds) and the
    generated catalogue. ``human_goals``: human instructions (default) or the original's
    templated goals from ``items_ins_v2`` (original data only). ``spacy_model``: the spaCy
    pipeline that tags nouns for the type reward on original data (``None``: the heuristic tagger).
    """
    if data_dir is None:
        generated = generate_catalogue(num_products or DEFAULT_NUM_PRODUCTS, seed=seed)
        raw = {"products": generated.products, "attributes": generated.attributes,
               "human_instructions": generated.human_instructions, "reviews": None}
        nouns: Callable[[str], list[str]] = LexiconNounTagger(generated.noun_lexicon)
        source = "generated"
        if not human_goals:
            raise ValueError("the generated catalogue has human-style goals only")
    else:
        raw = prod.load_original_files(data_dir)
        nouns = spacy_tagger_or_heuristic(spacy_model)
        source = str(data_dir)
    products = prod.normalize_products(
        raw["products"], raw["attributes"],
        raw["human_instructions"] if human_goals else None,
        reviews=raw["reviews"], num_products=num_products)
    rng = random.Random(seed)
    prices = prod.product_prices(products, rng)
    goals = (prod.human_goals(products, prices, rng) if human_goals
             else prod.synthetic_goals(products, prices, rng))
    engine = ProductSearchEngine([product_document(p) for p in products])
    return WebShopData(products=products, by_asin={p["asin"]: p for p in products},
                       prices=prices, splits=prod.split_goals(goals), search_engine=engine,
                       nouns=nouns, source=source)
