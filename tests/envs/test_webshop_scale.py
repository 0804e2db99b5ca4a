"""WebShop at the original data's size: full-format files streamed through the loader, the
generator's file writer, the BM25 index (bit-identical to bm25s), the on-disk index cache and
instances sharing one loaded copy. Small samples only; docs/benchmarks.md has the 1.18 M run."""

from __future__ import annotations

import json
import random

import bm25s
import numpy as np
import pytest

from agentrl.envs import TaskRef, make_env
from agentrl_env_webshop import dataset
from agentrl_env_webshop import products as prod
from agentrl_env_webshop.catalogue import (
    generate_catalogue, instruction_stride, iter_catalogue, write_catalogue_files,
)
from agentrl_env_webshop.dataset import load_webshop_data
from agentrl_env_webshop.search import Analyzer, ProductSearchEngine, product_document

from test_webshop_env import write_original_files


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "agentrl-cache"))
    load_webshop_data.cache_clear()
    dataset._OPEN.clear()
    yield
    load_webshop_data.cache_clear()
    dataset._OPEN.clear()


def _forget_loaded():
    load_webshop_data.cache_clear()
    dataset._OPEN.clear()


def _same_data(a, b):
    assert a.splits == b.splits
    assert len(a.products) == len(b.products)
    assert list(a.products) == list(b.products)
    assert dict(a.prices) == dict(b.prices)
    for product in a.products:
        assert b.by_asin[product["asin"]] == product
    assert "B0NOTTHERE" not in b.by_asin and b.by_asin.get("x" * 11) is None


def test_json_stream_reader_matches_json_load(tmp_path, monkeypatch):
    monkeypatch.setattr(prod, "_READ_CHARS", 5)  # every value crosses piece boundaries
    cases = [[], {}, [1, 2.5, 1234567890, "x", {"a": [1, {"b": None}]}, -7e-3],
             {"k": 1, "l": [1, 2], "m": {"z": "\u00e9\u2028 \\\" ,]}"}, "n": 123456}]
    for case in cases:
        for indent in (None, 2):
            path = tmp_path / "f.json"
            path.write_text(json.dumps(case, indent=indent, ensure_ascii=False), encoding="utf-8")
            expected = case if isinstance(case, list) else list(case.items())
            assert list(prod.iter_json_items(path)) == expected
    (tmp_path / "bad.json").write_text("[1, 2")
    with pytest.raises(ValueError):
        list(prod.iter_json_items(tmp_path / "bad.json"))


def test_full_file_names_go_through_the_same_loader(tmp_path, monkeypatch):
    small, full = tmp_path / "small", tmp_path / "full"
    small.mkdir()
    full.mkdir()
    write_original_files(small)
    for source, target in (("items_shuffle_1000.json", "items_shuffle.json"),
                           ("items_ins_v2_1000.json", "items_ins_v2.json"),
                           ("items_human_ins.json", "items_human_ins.json")):
        data = json.loads((small / source).read_text(encoding="utf-8"))
        (full / target).write_text(json.dumps(data, indent=1), encoding="utf-8")
    assert prod.original_file_paths(full)["products"].name == "items_shuffle.json"
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        prod.original_file_paths(full, files="1000")
    monkeypatch.setattr(prod, "_READ_CHARS", 64)
    a = load_webshop_data(str(small), spacy_model=None)
    b = load_webshop_data(str(full), spacy_model=None)
    _same_data(a, b)
    assert [p["asin"] for p in b.products] == ["B000000001", "B000000002", "B000000003"]


def test_generator_files_load_like_the_in_memory_catalogue(tmp_path):
    write_catalogue_files(tmp_path / "data", 300, seed=4)
    on_disk = load_webshop_data(str(tmp_path / "data"), seed=4, index_cache=None)
    in_memory = load_webshop_data(num_products=300, seed=4)
    _same_data(in_memory, on_disk)
    title = in_memory.products[0]["Title"]
    assert on_disk.nouns(title) == in_memory.nouns(title)  # the generator's noun lexicon
    for goal in in_memory.splits["test"][:100]:
        query = goal["instruction_text"].lower()
        assert on_disk.search_engine.search(query) == in_memory.search_engine.search(query)


def test_large_catalogues_instruct_every_kth_product():
    assert instruction_stride(2000) == 1 and instruction_stride(1_181_436) == 591
    instructed = [g is not None for _, _, g in iter_catalogue(4001, seed=0)]  # stride 3
    assert sum(instructed) == 1334 and instructed[:4] == [True, False, False, True]
    # up to 2,000 products the catalogue is unchanged: every product has its instructions
    assert len(generate_catalogue(150).human_instructions) == 150


def test_index_scores_are_bit_identical_to_bm25s():
    raw = generate_catalogue(400, seed=1)
    products = prod.normalize_products(raw.products, raw.attributes, raw.human_instructions)
    documents = [product_document(p) for p in products]
    engine = ProductSearchEngine(documents)
    analyze = Analyzer()
    reference = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    reference.index([analyze(d) for d in documents], show_progress=False)
    vocab = reference.vocab_dict
    rng = random.Random(0)
    words = " ".join(documents[:20]).split()
    queries = [i["instruction"] for v in raw.human_instructions.values() for i in v][:300]
    queries += [" ".join(rng.sample(words, rng.randint(1, 4))) for _ in range(200)]
    for query in queries:
        ids = [vocab[t] for t in analyze(query) if t in vocab]
        expected = reference.get_scores(ids) if ids else np.zeros(len(documents), np.float32)
        got = engine.scores(query)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32),
                                                           expected.view(np.uint32)), query
        positive = np.flatnonzero(expected > 0)
        ranked = positive[np.argsort(-expected[positive], kind="stable")][:50].tolist()
        assert engine.search(query) == ranked, query


def test_index_cache_is_built_once_then_memory_mapped(tmp_path, monkeypatch):
    write_catalogue_files(tmp_path / "data", 300, seed=2)
    cache = tmp_path / "cache"
    built = load_webshop_data(str(tmp_path / "data"), index_cache=str(cache))
    assert built.cache_dir is not None and (cache / built.cache_dir.rsplit("/", 1)[1]).is_dir()
    _forget_loaded()

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")

    monkeypatch.setattr(dataset, "build_cache", no_rebuild)
    cached = load_webshop_data(str(tmp_path / "data"), index_cache=str(cache))
    assert cached is not built and cached.cache_dir == built.cache_dir
    assert isinstance(cached.search_engine._data, np.memmap)
    assert isinstance(cached.products, dataset.ProductStore)
    reference = load_webshop_data(str(tmp_path / "data"), index_cache=None)
    assert reference.cache_dir is None
    _same_data(reference, cached)
    for goal in reference.splits["test"] + reference.splits["train"][:200]:
        query = goal["instruction_text"].lower()
        assert cached.search(query) == reference.search(query)
    # another seed is another cache entry: the key covers the arguments, not only the files
    monkeypatch.undo()
    other = load_webshop_data(str(tmp_path / "data"), seed=3, index_cache=str(cache))
    assert other.cache_dir != cached.cache_dir


def test_cached_env_plays_step_for_step_like_the_in_memory_env(tmp_path):
    write_catalogue_files(tmp_path / "data", 200, seed=5)
    kwargs = {"data_dir": str(tmp_path / "data")}
    cached = make_env("webshop", index_cache=str(tmp_path / "cache"), **kwargs)
    plain = make_env("webshop", index_cache=None, **kwargs)
    assert cached.data.cache_dir and plain.data.cache_dir is None
    rng = random.Random(0)
    for index in range(25):
        task = TaskRef("test", index)
        first = cached.reset(task), plain.reset(task)
        assert first[0] == first[1]
        actions = plain.expert_actions()
        assert cached.expert_actions() == actions
        actions = actions[:2] + ["click[description]", "click[< prev]"] + actions[2:]
        for action in actions + [f"search[{rng.choice(plain.instruction.split())} red]"]:
            assert cached.step(action) == plain.step(action)


def test_instances_share_one_loaded_copy(tmp_path):
    write_catalogue_files(tmp_path / "data", 100, seed=6)
    cache = tmp_path / "cache"
    envs = [make_env("webshop", data_dir=str(tmp_path / "data"), index_cache=str(cache))
            for _ in range(4)]
    # a different spelling of the same configuration opens the same copy
    envs.append(make_env("webshop", data_dir=str(tmp_path / "data"), index_cache=cache, seed=0))
    assert all(env.data is envs[0].data for env in envs)
    assert envs[0].data.search_engine is envs[-1].data.search_engine


def test_auto_cache_only_for_large_products_files(tmp_path, monkeypatch):
    write_catalogue_files(tmp_path / "data", 50, seed=7)
    assert load_webshop_data(str(tmp_path / "data")).cache_dir is None  # small: in memory
    _forget_loaded()
    monkeypatch.setattr(dataset, "AUTO_CACHE_MIN_BYTES", 1)
    data = load_webshop_data(str(tmp_path / "data"))
    assert data.cache_dir.startswith(str(tmp_path / "agentrl-cache" / "webshop"))


def test_large_generated_catalogues_go_through_files_and_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset, "IN_MEMORY_MAX_GENERATED", 50)
    data = load_webshop_data(num_products=60, seed=8, index_cache=str(tmp_path / "c"))
    files = tmp_path / "c" / "catalogue-v1-seed8-n60"
    assert (files / "items_shuffle.json").is_file() and data.source == str(files)
    assert data.cache_dir is not None and len(data.products) == 60
    monkeypatch.setattr(dataset, "IN_MEMORY_MAX_GENERATED", 100)
    _same_data(load_webshop_data(num_products=60, seed=8), data)
