"""WebShop purchase score: the original formula, partial credit, type factor, colours, fallbacks."""

from __future__ import annotations

import difflib

import pytest

from agentrl_env_webshop.nouns import HeuristicNounTagger, LexiconNounTagger
from agentrl_env_webshop.reward import (
    COLOR_SET, normalize_color, purchase_reward, token_set_ratio, type_reward,
)


def simple_nouns(text: str) -> list[str]:
    """Test tagger: every lowercase word that is not in a tiny adjective list is a noun."""
    return [w for w in text.lower().replace(",", " ").split() if w not in {"red", "soft", "for"}]


def product(**overrides):
    base = {
        "asin": "B000000001", "name": "Acme Soft Cotton Pants", "Title": "Acme Soft Cotton Pants",
        "query": "pants", "product_category": "Clothing › Men › Pants",
        "Attributes": ["machine washable", "elastic waistband"],
        "BulletPoints": ["Made of cotton"], "Description": "Comfortable pants.",
    }
    base.update(overrides)
    return base


def goal(**overrides):
    base = {
        "asin": "B000000001", "name": "Acme Soft Cotton Pants", "query": "pants",
        "product_category": "Clothing › Men › Pants",
        "attributes": ["machine washable", "elastic waistband"],
        "goal_options": ["navy blue", "large"], "price_upper": 40.0,
    }
    base.update(overrides)
    return base


def test_perfect_purchase_scores_one():
    score, parts = purchase_reward(product(), goal(), 30.0,
                                   {"color": "navy blue", "size": "large"}, simple_nouns)
    assert score == 1.0
    assert parts["r_type"] == 1.0 and parts["r_price"] is True
    assert parts["num_attr_matches"] == 2 and parts["num_option_matches"] == 2


def test_four_of_five_criteria_is_point_eight():
    # one of the two goal options is wrong: (2 attrs + 1 option + price) / (2 + 2 + 1)
    score, parts = purchase_reward(product(), goal(), 30.0,
                                   {"color": "navy blue", "size": "small"}, simple_nouns)
    assert score == pytest.approx(0.8)
    assert parts["num_option_matches"] == 1


def test_price_above_bound_loses_its_share():
    score, parts = purchase_reward(product(), goal(), 45.0,
                                   {"color": "navy blue", "size": "large"}, simple_nouns)
    assert parts["r_price"] is False
    assert score == pytest.approx(4 / 5)


def test_missing_options_and_attribute_partial_credit():
    score, _ = purchase_reward(product(Attributes=["machine washable"], Description="",
                                       BulletPoints=[]),
                               goal(), 30.0, {}, simple_nouns)
    assert score == pytest.approx((1 + 0 + 1) / 5)


def test_attribute_fuzzy_threshold_is_strictly_above_85():
    assert token_set_ratio("Machine-Washable!", "machine washable") == 100
    assert token_set_ratio("", "anything") == 0
    plain = {"Title": "x", "BulletPoints": [], "Description": ""}
    wanted = goal(attributes=["machine washable"], goal_options=[])
    assert token_set_ratio("machine wash", "machine washable") == 86
    _, close = purchase_reward(product(Attributes=["machine wash"], **plain), wanted, 1.0, {},
                               simple_nouns)
    assert close["num_attr_matches"] == 1
    assert token_set_ratio("hand wash only", "machine washable") <= 85
    _, far = purchase_reward(product(Attributes=["hand wash only"], **plain), wanted, 1.0, {},
                             simple_nouns)
    assert far["num_attr_matches"] == 0


PLAIN_TEXT = {"Title": "t", "BulletPoints": [], "Description": ""}


def _attr_matches(product_attr: str, goal_attr: str) -> int:
    _, parts = purchase_reward(product(Attributes=[product_attr], **PLAIN_TEXT),
                               goal(attributes=[goal_attr], goal_options=[]), 1.0, {},
                               simple_nouns)
    return parts["num_attr_matches"]


def test_attribute_score_just_above_85_rounds_to_85_and_does_not_match():
    # thefuzz 0.19.0 (the original's pin) scores with difflib, rounded: best pair is
    # 'durable protection mtareail' / 'durable protection material', 23 matched of 54 characters
    # -> raw 85.185 -> 85, not > 85. (An LCS/Indel ratio, e.g. rapidfuzz's, finds 24: 88.9.)
    raw = 100 * difflib.SequenceMatcher(None, "durable protection mtareail",
                                        "durable protection material").ratio()
    assert raw == pytest.approx(85.185, abs=1e-3)
    assert token_set_ratio("durable mtareail protection", "durable material protection") == 85
    assert _attr_matches("durable mtareail protection", "durable material protection") == 0


def test_attribute_score_rounding_up_to_86_matches():
    # 'chew resistant' / 'heat resistant': 12 of 28 characters -> raw 85.714 -> 86 > 85
    assert token_set_ratio("chew resistant", "heat resistant") == 86
    assert _attr_matches("chew resistant", "heat resistant") == 1
    # the same after processing: U+2011 (non-breaking hyphen) becomes a space, upper case lowered
    assert token_set_ratio("Chew\u2011Resistant", "heat resistant") == 86
    assert _attr_matches("Chew\u2011Resistant", "heat resistant") == 1


def test_fuzzy_score_uses_thefuzz_default_processing():
    # case and ASCII punctuation are ignored
    assert token_set_ratio("Heat-Resistant!", "heat resistant") == 100
    # any non-word character is a separator, not deleted ('chewresistant' would score 81)
    assert token_set_ratio("chew\u2013resistant", "heat resistant") == 86
    assert token_set_ratio("kid\u2019s size", "kids size") == 95
    # '_' is a word character; only the characters 128-255 are dropped, not all non-ASCII
    assert token_set_ratio("heat_resistant", "heat resistant") == 93
    assert token_set_ratio("cr\u00e8me", "crme") == 100
    assert token_set_ratio("\u0142ight", "light") == 80
    assert _attr_matches("\u0142ight", "light") == 0


def test_fuzzy_score_argument_order_follows_the_original():
    # difflib is not symmetric: attributes are scored (product, goal), options (goal, chosen)
    assert token_set_ratio("durable mtareail protection", "durable material protection") == 85
    assert token_set_ratio("durable material protection", "durable mtareail protection") == 89
    _, parts = purchase_reward(product(**PLAIN_TEXT),
                               goal(goal_options=["durable material protection"]), 1.0,
                               {"style": "durable mtareail protection"}, simple_nouns)
    assert parts["num_option_matches"] == 1


def test_attribute_text_fallback_title_features_description():
    for field, value in (("Title", "Acme Pants Gluten Free"),
                         ("BulletPoints", ["100% GLUTEN FREE recipe"]),
                         ("Description", "A gluten free treat.")):
        p = product(Attributes=["DUMMY_ATTR"], **{field: value})
        _, parts = purchase_reward(p, goal(attributes=["gluten free"], goal_options=[]), 1.0, {},
                                   simple_nouns)
        assert parts["num_attr_matches"] == 1, field


def test_option_text_fallback_counts_an_unmatched_option_found_in_the_title():
    p = product(Title="Acme Pants, Olive")
    _, parts = purchase_reward(p, goal(goal_options=["navy blue"]), 1.0, {"color": "olive"},
                               simple_nouns)
    assert parts["num_option_matches"] == 1


def test_colour_normalisation_uses_the_first_listed_colour():
    assert COLOR_SET[0] == "alabaster" and COLOR_SET[-1] == "yellow"
    assert normalize_color("black forest") == "black"
    assert normalize_color("violet lavender") == "lavender"  # list order, not text order
    assert normalize_color("123alabaster") == "alabaster"
    assert normalize_color("webshop") == "webshop"
    assert normalize_color("") == ""
    # 'navy blue' and 'light blue' normalise to 'blue' ('blue' precedes 'light' and 'navy')
    _, parts = purchase_reward(product(Title="t", BulletPoints=[], Description=""),
                               goal(goal_options=["light blue"]), 1.0, {"color": "navy blue"},
                               simple_nouns)
    assert parts["num_option_matches"] == 1


def test_size_options_match_exactly_other_options_fuzzily():
    plain = product(Title="t", BulletPoints=[], Description="")
    _, size_parts = purchase_reward(plain, goal(goal_options=["large"]), 1.0,
                                    {"size": "x-large"}, simple_nouns)
    _, fit_parts = purchase_reward(plain, goal(goal_options=["large"]), 1.0,
                                   {"fit": "x-large"}, simple_nouns)
    assert size_parts["num_option_matches"] == 0
    assert fit_parts["num_option_matches"] == 1


@pytest.mark.parametrize("bought_name, bought_query, bought_category, expected", [
    ("Acme Soft Cotton Pants", "pants", "Clothing › Men › Pants", 1.0),  # everything agrees
    ("Other Cotton Pants", "jeans", "Home › Kitchen", 1.0),              # 2 of 3 nouns > 0.2
    ("Zeta Pants", "jeans", "Home › Kitchen", 1.0),                      # 1 of 3 nouns > 0.2
    ("Zeta Lamp", "pants", "Clothing › Men › Pants", 0.0),               # no shared noun
])
def test_type_factor_cases(bought_name, bought_query, bought_category, expected):
    # the goal title's nouns are acme, cotton, pants ('soft' is not a noun)
    parts = type_reward({"name": bought_name, "query": bought_query,
                         "product_category": bought_category}, goal(), simple_nouns)
    assert parts["r_type"] == expected


def test_type_factor_half_and_tenth():
    many = goal(name="a b c d e f g h i j k")  # 11 goal nouns
    one = type_reward({"name": "a", "query": "x", "product_category": "P › Q"}, many,
                      simple_nouns)
    assert one["title_score"] == pytest.approx(1 / 11) and one["r_type"] == 0.1
    two = type_reward({"name": "a b", "query": "x", "product_category": "P › Q"}, many,
                      simple_nouns)
    assert two["title_score"] == pytest.approx(2 / 11) and two["r_type"] == 0.5
    two_same_query = type_reward({"name": "a b", "query": "pants", "product_category": "P › Q"},
                                 many, simple_nouns)
    assert two_same_query["r_type"] == 1.0
    two_same_category = type_reward({"name": "a b", "query": "x",
                                     "product_category": "Clothing › Men › Shirts"}, many,
                                    simple_nouns)
    assert two_same_category["category_match"] and two_same_category["r_type"] == 1.0


def test_goal_without_nouns_scores_title_point_two():
    parts = type_reward({"name": "anything", "query": "other", "product_category": "A › B"},
                        goal(name="soft red"), simple_nouns)
    assert parts["title_score"] == 0.2 and parts["r_type"] == 0.5
    parts = type_reward({"name": "anything", "query": "pants", "product_category": "A › B"},
                        goal(name="soft red"), simple_nouns)
    assert parts["r_type"] == 1.0


def test_type_factor_scales_the_whole_score():
    score, parts = purchase_reward(product(name="Zeta Lamp"), goal(), 30.0,
                                   {"color": "navy blue", "size": "large"}, simple_nouns)
    assert parts["r_type"] == 0.0 and score == 0.0


def test_noun_taggers():
    lexicon = LexiconNounTagger({"acme": True, "pants": True, "soft": False})
    assert lexicon("Acme Soft Pants, for Men") == ["acme", "pants", "men"]
    heuristic = HeuristicNounTagger()
    assert heuristic("Premium Soft Cotton Pants for Women, 2 Pack") == ["cotton", "pants",
                                                                        "women"]
