"""WebShop text environment: golden transcripts, navigation semantics, protocol, expert."""

from __future__ import annotations

import json
import re

import pytest

from agentrl.envs import REQUIRED_INFO_KEYS, TaskRef, make_env

SEP = " [SEP] "


def write_original_files(directory) -> None:
    """A three-product data set in the original file formats."""
    products = [
        {"asin": "B000000001", "name": "Acme Stretch Cargo Pants for Men",
         "full_description": "Durable cargo pants with six pockets.",
         "small_description": ["Machine washable cotton", "Elastic waistband"],
         "pricing": "$25.99",
         "customization_options": {
             "Color": [{"value": "Navy Blue", "image": None}, {"value": "Khaki", "image": None}],
             "Size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}]},
         "images": ["img1"], "category": "fashion", "query": "cargo pants",
         "product_category": "Clothing › Men › Pants"},
        {"asin": "B000000002", "name": "Bolt Wireless Earbuds",
         "full_description": "Earbuds with long battery life.",
         "small_description": ["Noise cancelling"], "pricing": "$19.99$29.99",
         "customization_options": {"Color": [{"value": "Black/White", "image": "w.jpg"}]},
         "images": ["img2"], "category": "electronics", "query": "earbuds",
         "product_category": "Electronics › Headphones"},
        {"asin": "B000000003", "name": "Cozy Cotton Throw Blanket", "full_description": "",
         "small_description": "Soft and warm", "pricing": "", "customization_options": None,
         "images": ["img3"], "category": "home", "query": " Throw Blanket ",
         "product_category": "Home › Bedding"},
        {"asin": "nan", "name": "skipped", "full_description": "", "small_description": [],
         "pricing": "", "customization_options": {}, "images": [""], "category": "x",
         "query": "x", "product_category": "x"},
        {"asin": "B000000001", "name": "duplicate", "full_description": "",
         "small_description": [], "pricing": "", "customization_options": {}, "images": [""],
         "category": "x", "query": "x", "product_category": "x"},
    ]
    attributes = {
        "B000000001": {"attributes": ["machine washable", "elastic waistband"],
                       "instruction": "i want cargo pants",
                       "instruction_attributes": ["machine washable"]},
        "B000000002": {"attributes": ["noise cancelling"]},
    }
    human = {
        "B000000001": [
            {"instruction": "i need machine washable cargo pants in navy blue, size large.",
             "instruction_attributes": ["machine washable", "elastic waistband"],
             "instruction_options": ["navy blue", "large"]},
            {"instruction": "no attributes, so no goal", "instruction_attributes": [],
             "instruction_options": []}],
        "B000000002": [{"instruction": "i want noise cancelling earbuds",
                        "instruction_attributes": ["noise cancelling"],
                        "instruction_options": []}],
    }
    for name, data in (("items_shuffle_1000.json", products),
                       ("items_ins_v2_1000.json", attributes), ("items_human_ins.json", human)):
        (directory / name).write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture
def tiny_env(tmp_path):
    write_original_files(tmp_path)
    env = make_env("webshop", data_dir=str(tmp_path), spacy_model=None)
    index = next(i for i, g in enumerate(env.data.splits["test"]) if g["asin"] == "B000000001")
    return env, TaskRef("test", index)


def test_golden_transcript_full_purchase(tiny_env):
    env, task = tiny_env
    obs, info = env.reset(task)
    instr = info["task"]
    assert re.fullmatch(r"i need machine washable cargo pants in navy blue, size large, "
                        r"and price lower than (40|50|60)\.00 dollars", instr)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {instr} [SEP] Search"
    assert info["admissible_actions"] == ["search[<your query>]", "click[search]"]
    assert info["task_type"] == "fashion"

    head = f"Instruction: [SEP] {instr} [SEP] Back to Search"
    item = (f"{head} [SEP] < Prev [SEP] color [SEP] navy blue [SEP] khaki [SEP] size [SEP] small "
            f"[SEP] large [SEP] Acme Stretch Cargo Pants for Men [SEP] Price: $25.99 [SEP] "
            f"Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    transcript = [
        ("search[Cargo Pants]", f"{head} [SEP] Page 1 (Total results: 1) [SEP] Next > [SEP] "
                                f"B000000001 [SEP] Acme Stretch Cargo Pants for Men [SEP] $25.99"),
        ("click[B000000001]", item),
        ("click[features]", f"{head} [SEP] < Prev [SEP] Machine washable cotton [SEP] "
                            f"Elastic waistband"),
        ("click[< prev]", item),
        ("click[navy blue]", item),
        ("click[description]", f"{head} [SEP] < Prev [SEP] Durable cargo pants with six pockets."),
        ("click[< prev]", item),
        ("click[reviews]", f"{head} [SEP] < Prev"),
        ("click[< prev]", item),
        ("click[large]", item),
    ]
    for action, expected in transcript:
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == expected, action
        assert (reward, terminated, truncated, info["won"]) == (0.0, False, False, False)
    assert info["admissible_actions"] == [
        "click[back to search]", "click[< prev]", "click[description]", "click[features]",
        "click[reviews]", "click[buy now]", "click[navy blue]", "click[khaki]", "click[small]",
        "click[large]"]
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert obs == ("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it "
                   "in your MTurk interface.) [SEP] Purchased [SEP] asin [SEP] B000000001 [SEP] "
                   'options [SEP] {"color": "navy blue", "size": "large"} [SEP] attrs [SEP] None '
                   "[SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category [SEP] "
                   "None [SEP] Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] "
                   "instuction text [SEP] category [SEP] product category [SEP] query [SEP] Goal "
                   "[SEP] None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] "
                   "Reward Details [SEP] None")
    assert (reward, terminated, info["won"], info["task_score"]) == (1.0, True, True, 1.0)
    assert info["admissible_actions"] == []


def test_partial_credit_purchase_is_not_a_win(tiny_env):
    env, task = tiny_env
    env.reset(task)
    for action in ("search[cargo pants]", "click[b000000001]", "click[khaki]", "click[large]"):
        env.step(action)
    _, reward, terminated, _, info = env.step("click[buy now]")
    assert reward == pytest.approx(0.8) and terminated and not info["won"]


def test_item_prev_returns_to_results_and_clears_options(tiny_env):
    env, task = tiny_env
    env.reset(task)
    for action in ("search[cargo pants]", "click[b000000001]", "click[navy blue]"):
        env.step(action)
    obs, *_ = env.step("click[< prev]")
    assert "Page 1 (Total results: 1)" in obs
    env.step("click[b000000001]")
    obs, reward, *_ = env.step("click[buy now]")
    assert '{}' in obs.split(SEP)  # no option carried over
    assert reward == pytest.approx(3 / 5)


def test_back_to_search_and_search_on_any_page(tiny_env):
    env, task = tiny_env
    obs0, _ = env.reset(task)
    env.step("search[cargo pants]")
    env.step("click[b000000001]")
    obs, _, _, _, info = env.step("click[back to search]")
    assert obs == obs0 and info["admissible_actions"][0] == "search[<your query>]"
    env.step("search[cargo pants]")
    env.step("click[b000000001]")
    obs, *_ = env.step("search[earbuds]")  # accepted on the item page although not listed
    assert "Bolt Wireless Earbuds" in obs and "Page 1 (Total results: 1)" in obs


def test_invalid_actions_change_nothing(tiny_env):
    env, task = tiny_env
    obs0, _ = env.reset(task)
    for action in ("", "buy", "click[]", "search[]", "click[search]", "click[buy now]",
                   "click[next >]", "jump[cargo]", "click[b000000001]", "search", "😀[x]"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert (obs, reward, terminated) == (obs0, 0.0, False), action
    results, *_ = env.step("search[cargo pants]")
    for action in ("click[b000000002]", "click[< prev]", "click[navy blue]", "click[Buy Now]"):
        obs, reward, terminated, _, _ = env.step(action)
        assert (obs, reward, terminated) == (results, 0.0, False), action


def test_steps_after_the_purchase_stay_terminal(tiny_env):
    env, task = tiny_env
    env.reset(task)
    for action in env.expert_actions():
        final, *_ = env.step(action)
    obs, reward, terminated, _, info = env.step("search[anything]")
    assert (obs, reward, terminated, info["won"]) == (final, 0.0, True, True)


def test_truncation_at_max_steps(tiny_env):
    env, task = tiny_env
    short = make_env("webshop", data_dir=env.data.source, max_steps=3, spacy_model=None)
    short.reset(task)
    flags = [short.step("click[nothing]")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_info_keys_on_every_step(tiny_env):
    env, task = tiny_env
    _, info = env.reset(task)
    infos = [info] + [env.step(a)[4] for a in env.expert_actions()]
    for info in infos:
        assert set(REQUIRED_INFO_KEYS) <= set(info)
        assert info["split"] == "test" and info["index"] == task.index
        assert info["depth"] is None and info["task_type"] == "fashion"
    assert infos[-1]["won"] is True


def test_default_env_paging_and_empty_results():
    env = make_env("webshop")
    env.reset(TaskRef("test", 0))
    obs, *_, info = env.step("search[women]")
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP]" in obs
    assert "< Prev" not in obs
    products_on_page = [a for a in info["admissible_actions"] if re.fullmatch(r"click\[b0\w+\]", a)]
    assert len(products_on_page) == 10
    seen = set(products_on_page)
    for page in range(2, 6):
        obs, *_, info = env.step("click[next >]")
        assert f"Page {page} (Total results: 50) [SEP] < Prev [SEP] Next >" in obs
        page_products = {a for a in info["admissible_actions"] if a.startswith("click[b0")}
        assert len(page_products) == 10 and not page_products & seen
        seen |= page_products
    obs, *_ = env.step("click[next >]")  # Next is never hidden: page 6 is empty
    assert obs.endswith("Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >")
    obs, *_ = env.step("click[< prev]")
    assert "Page 5 (Total results: 50)" in obs
    obs, *_ = env.step("search[xyzzy qwerty]")
    assert obs.endswith("Page 1 (Total results: 0) [SEP] Next >")


@pytest.mark.parametrize("split, stride", [("test", 25), ("eval", 50), ("train", 225)])
def test_expert_wins_a_sample_of_each_split(split, stride):
    env = make_env("webshop")
    size = env.split_sizes()[split]
    for index in range(0, size, stride):
        env.reset(TaskRef(split, index))
        actions = env.expert_actions()
        assert len(actions) <= env.max_steps
        for action in actions:
            _, reward, terminated, truncated, info = env.step(action)
        assert terminated and reward == 1.0 and info["won"], (split, index, actions)


def test_group_members_share_the_task():
    first, second = make_env("webshop"), make_env("webshop")
    assert first.data is second.data  # built once per process
    obs_a, info_a = first.reset(TaskRef("eval", 7))
    obs_b, info_b = second.reset(TaskRef("eval", 7))
    assert obs_a == obs_b and info_a == info_b
    assert first.expert_actions() == second.expert_actions()
