"""WebShop data: original-format loader, goal construction, splits, search, generated catalogue."""

from __future__ import annotations

import hashlib
import json
import random
import time

import pytest

from agentrl_env_webshop import pages
from agentrl_env_webshop.catalogue import generate_catalogue
from agentrl_env_webshop.dataset import load_webshop_data
from agentrl_env_webshop.products import (
    human_goals, normalize_products, parse_pricing, price_bound, split_goals, synthetic_goals,
)
from agentrl_env_webshop.reward import purchase_reward
from agentrl_env_webshop.search import ProductSearchEngine

from test_webshop_env import write_original_files


def test_loader_normalises_the_original_format(tmp_path):
    write_original_files(tmp_path)
    data = load_webshop_data(str(tmp_path), spacy_model=None)
    assert [p["asin"] for p in data.products] == ["B000000001", "B000000002", "B000000003"]
    pants, earbuds, blanket = data.products
    assert pants["options"] == {"color": ["navy blue", "khaki"], "size": ["small", "large"]}
    assert earbuds["options"] == {"color": ["black | white"]}
    assert earbuds["option_to_image"] == {"black | white": "w.jpg"}
    assert (pants["Price"], pants["pricing"]) == ("$25.99", [25.99])
    assert (earbuds["Price"], earbuds["pricing"]) == ("$19.99 to $29.99", [19.99, 29.99])
    assert (blanket["Price"], blanket["pricing"]) == ("$100.0", [100.0])
    assert 19.99 <= data.prices["B000000002"] <= 29.99
    assert blanket["Attributes"] == ["DUMMY_ATTR"] and blanket["BulletPoints"] == ["Soft and warm"]
    assert blanket["query"] == "throw blanket" and blanket["Rating"] == "N.A."
    assert pants["Title"] == pants["name"] and pants["MainImage"] == "img1"
    # two human goals: the one without attributes is skipped; all fit in the test split
    assert {k: len(v) for k, v in data.splits.items()} == {"test": 2, "eval": 0, "train": 0}
    by_asin = {g["asin"]: g for g in data.splits["test"]}
    earbud_goal = by_asin["B000000002"]
    assert earbud_goal["instruction_text"].startswith("i want noise cancelling earbuds, and price "
                                                      "lower than ")
    assert earbud_goal["price_upper"] > data.prices["B000000002"]
    assert earbud_goal["name"] == "Bolt Wireless Earbuds" and earbud_goal["goal_options"] == []


def test_loader_requires_the_three_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="items_human_ins.json"):
        (tmp_path / "items_shuffle_1000.json").write_text("[]")
        (tmp_path / "items_ins_v2_1000.json").write_text("{}")
        load_webshop_data(str(tmp_path), spacy_model=None)


def test_synthetic_goals_from_items_ins(tmp_path):
    write_original_files(tmp_path)
    data = load_webshop_data(str(tmp_path), human_goals=False, spacy_model=None)
    # one goal per option combination of the only product with an instruction (2 colours x 2 sizes)
    goals = data.splits["test"]
    assert len(goals) == 4 and {g["asin"] for g in goals} == {"B000000001"}
    texts = sorted(g["instruction_text"] for g in goals)
    assert texts[0].startswith("i want cargo pants with color: khaki, and size: large, and price")
    assert all(g["attributes"] == ["machine washable"] for g in goals)


def test_price_bound_and_pricing_parser():
    rng = random.Random(0)
    for price in (0.5, 9.99, 25.99, 100.0, 979.0):
        upper, text = price_bound(price, rng)
        assert price < upper <= price + 40 and text == f", and price lower than {upper:.2f} dollars"
    assert price_bound(985.0, rng) == (1000000, "")  # fewer than two candidate bounds
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")


def test_split_boundaries_and_seeded_shuffle():
    goals = [{"i": i} for i in range(2000)]
    splits = split_goals(goals)
    assert [len(splits[s]) for s in ("test", "eval", "train")] == [500, 1000, 500]
    assert splits == split_goals(goals)
    shuffled = list(goals)
    random.Random(233).shuffle(shuffled)
    assert splits["test"] == shuffled[:500] and splits["train"] == shuffled[1500:]


def test_search_drops_zero_score_hits_and_breaks_ties_by_catalogue_order():
    engine = ProductSearchEngine(["red shoe", "blue shoe", "a hat", "shoes for running shoes"])
    assert engine.search("umbrella") == []
    assert engine.search("the and a") == []  # stopwords only
    assert engine.search("shoe")[:2] == [3, 0]  # stemming: 'shoes' -> 'shoe', tf 2 ranks first
    assert engine.search("shoe")[2] == 1  # tie with doc 0 broken by catalogue order
    assert engine.search("hat") == [2]
    assert len(ProductSearchEngine([f"item {i}" for i in range(80)]).search("item")) == 50


def test_search_scores_follow_lucene_bm25():
    import math
    docs = ["cargo pants", "cargo cargo pants for men", "hat"]
    engine = ProductSearchEngine(docs, k1=0.9, b=0.4)
    lengths = [2, 4, 1]  # 'for' is a stopword
    avg = sum(lengths) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    expected = [idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / avg))
                for tf, dl in ((1, 2), (2, 4))]
    scores = engine.scores("cargo")
    assert scores[:2] == pytest.approx(expected, rel=1e-5) and scores[2] == 0


def test_generated_catalogue_size_and_determinism():
    start = time.perf_counter()
    first = generate_catalogue()
    elapsed = time.perf_counter() - start
    assert elapsed < 3.0
    assert len(first.products) >= 1000
    assert len({p["category"] for p in first.products}) >= 10
    assert sum(len(v) for v in first.human_instructions.values()) >= 5000
    second = generate_catalogue()
    assert first == second
    blob = json.dumps([first.products, first.attributes, first.human_instructions],
                      sort_keys=True).encode()
    # identical on every machine: pinned digest of the default catalogue
    assert hashlib.sha256(blob).hexdigest()[:16] == PINNED_CATALOGUE_DIGEST


PINNED_CATALOGUE_DIGEST = "cdfb1884c55e4a1e"


def test_generated_goals_admit_a_perfect_score():
    data = load_webshop_data()
    buttons = {b.lower() for b in (pages.BACK_TO_SEARCH, pages.NEXT_PAGE, pages.PREV_PAGE,
                                   pages.BUY_NOW, pages.SEARCH_BUTTON, *pages.SUB_PAGES)}
    for product in data.products:
        values = [v for vs in product["options"].values() for v in vs]
        assert len(values) == len(set(values)), product["asin"]
        assert not set(values) & (buttons | {product["asin"].lower()})
    goals = [g for split in data.splits.values() for g in split]
    assert len(goals) >= 5000
    for goal in goals:
        product = data.by_asin[goal["asin"]]
        assert set(goal["attributes"]) <= set(product["Attributes"])
        assert data.prices[goal["asin"]] < goal["price_upper"] < 1000000
        chosen = {}
        for value in goal["goal_options"]:
            groups = [name for name, vs in product["options"].items() if value in vs]
            assert len(groups) == 1 and groups[0] not in chosen, goal["instruction_text"]
            chosen[groups[0]] = value
            assert value in goal["instruction_text"]
        score, _ = purchase_reward(product, goal, data.prices[goal["asin"]], chosen, data.nouns)
        assert score == 1.0, goal["instruction_text"]


def test_instruction_search_retrieves_every_target():
    data = load_webshop_data()
    for goal in (g for split in data.splits.values() for g in split):
        ranked = data.search_engine.search(goal["instruction_text"].lower())
        assert goal["asin"] in {data.products[i]["asin"] for i in ranked}


def test_normalize_products_keeps_first_n_and_goal_helpers():
    raw = generate_catalogue(num_products=30, seed=3)
    products = normalize_products(raw.products, raw.attributes, raw.human_instructions,
                                  num_products=12)
    assert len(products) == 12
    rng = random.Random(1)
    prices = {p["asin"]: p["pricing"][0] for p in products}
    goals = human_goals(products, prices, rng)
    assert len(goals) == sum(len(raw.human_instructions[p["asin"]]) for p in products)
    assert all(g["price_upper"] > prices[g["asin"]] for g in goals)
    assert synthetic_goals(products, prices, rng) == []  # no templated instructions here
