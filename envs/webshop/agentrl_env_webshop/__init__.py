"""WebShop (text mode) on a generated catalogue or on the original data files.

``make_env("webshop", max_steps=15, data_dir=None, num_products=None, seed=0, human_goals=True,
spacy_model="en_core_web_sm", index_cache="auto", files="auto")``: ``data_dir`` points at the
original files (``items_shuffle_1000.json``, ``items_ins_v2_1000.json``, ``items_human_ins.json``,
or the full ``items_shuffle.json`` and ``items_ins_v2.json``); without it the project's
deterministic catalogue (1,000 products, about 6,000 instructions) is generated in memory. Data is
built once per process and shared by every instance with the same arguments; large catalogues go
through an on-disk, memory-mapped cache (``index_cache``, see :mod:`.dataset`).
"""

from __future__ import annotations

from pathlib import Path

from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec
from agentrl_env_webshop.dataset import WebShopData, load_webshop_data
from agentrl_env_webshop.env import WebShopEnv


_HERE = Path(__file__).resolve().parent


def make_webshop(max_steps: int = 15, data_dir: str | None = None,
                 num_products: int | None = None, seed: int = 0, human_goals: bool = True,
                 spacy_model: str | None = "en_core_web_sm", index_cache: str | None = "auto",
                 files: str = "auto") -> WebShopEnv:
    data = load_webshop_data(None if data_dir is None else str(data_dir),
                             None if num_products is None else int(num_products), int(seed),
                             bool(human_goals), spacy_model,
                             index_cache if index_cache in (None, False) else str(index_cache),
                             str(files))
    return WebShopEnv(data, max_steps=max_steps)


SPEC = EnvSpec(
    name="webshop",
    make_env=make_webshop,
    splits=("train", "eval", "test"),
    prompt=PromptSpec(preamble="You are an expert autonomous agent operating in the WebShop e-commerce environment.",
                      advice=" Think carefully about which admissible action best advances the shopping goal.",
                      task_source="info", admissible_layout="quoted"),
    actions=ActionSpec(lowercase=True, fallback_chars=20),      # its commands are lower case
    results=ResultSpec(title="WebShop (score and success %)", columns=("Score", "Success"),
                       success_column="Success", score_column="Score", per_type=False,
                       published=str(_HERE / "published.yaml")),
    recipes_dir=str(_HERE / "recipe_files"),
    description="WebShop (text mode): finding and buying the product an instruction describes",
)

__all__ = ["SPEC", "WebShopData", "WebShopEnv", "load_webshop_data", "make_webshop"]
