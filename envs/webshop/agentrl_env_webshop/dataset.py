"""Everything a WebShop environment reads, built once per process and shared by all instances.

:func:`load_webshop_data` either reads the original data files (``data_dir``) or generates the
catalogue, then runs the original's product normalisation, goal construction and split, and builds
the search index and the noun tagger. Results are cached per argument tuple, so the G environments
of a group (and all environments of a pool) share one copy.

Products stream through normalisation and indexing one at a time, so the original's full
``items_shuffle.json`` (1.18 M products) never sits in memory as one JSON document. For large
catalogues (a products file of 64 MB or more, with ``index_cache="auto"``) the result is written
once to an on-disk cache, ``$AGENTRL_CACHE_DIR/webshop/index-<key>/`` (default
``~/.cache/agentrl/webshop``), keyed by the SHA-256 of the data files' contents and the loading
arguments: the BM25 arrays, the normalised products (one JSON record each, with an offset table),
a sorted ASIN table, the prices and the goal splits. Later loads, in any process, memory-map it:
no product is decoded until a page shows it, and the processes of a machine share one copy of the
index and the products through the page cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import random
import shutil
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from agentrl_env_webshop import products as prod
from agentrl_env_webshop.catalogue import (
    DEFAULT_NUM_PRODUCTS, NOUN_LEXICON_FILE, generate_catalogue, write_catalogue_files,
)
from agentrl_env_webshop.nouns import LexiconNounTagger, spacy_tagger_or_heuristic
from agentrl_env_webshop.search import IndexBuilder, ProductSearchEngine, product_document

CACHE_FORMAT = 1
GENERATOR_VERSION = 1  # bump when the generated catalogue changes
AUTO_CACHE_MIN_BYTES = 64 << 20
IN_MEMORY_MAX_GENERATED = 100_000
_DECODED_PRODUCTS_KEPT = 4096
RANKINGS_KEPT = 1024  # rankings each loaded WebShopData keeps (0: none, every search runs the engine)


@dataclass(frozen=True)
class WebShopData:
    """Products (normalised), prices, goals by split, the search engine and the noun tagger.

    ``products`` is a list, or a :class:`ProductStore` reading the on-disk cache; ``by_asin`` and
    ``prices`` are the matching mappings. ``cache_dir`` is the cache directory, if one is used.
    """

    products: Sequence[dict[str, Any]]
    by_asin: Mapping[str, dict[str, Any]]
    prices: Mapping[str, float]
    splits: dict[str, list[dict[str, Any]]]
    search_engine: ProductSearchEngine
    nouns: Callable[[str], list[str]]
    source: str
    cache_dir: str | None = None
    _ranked: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)

    def search(self, query: str) -> list[dict[str, Any]]:
        """The top-50 products for ``query`` (positive BM25 score only), best first."""
        return list(self.results(query))

    def ranked(self, query: str) -> list[int]:
        """The product indices of :meth:`search`; the last 1,024 queries' rankings are kept (the
        G rollouts of a group, or an expert and its episode, often repeat a query)."""
        ranking = self._ranked.get(query)
        if ranking is None:
            ranking = self._ranked[query] = self.search_engine.search(query)
            if len(self._ranked) > RANKINGS_KEPT:
                self._ranked.popitem(last=False)
        return ranking

    def clear_rankings(self) -> None:
        """Forget the kept rankings (with ``RANKINGS_KEPT = 0``, every later search runs the engine)."""
        self._ranked.clear()

    def results(self, query: str) -> Results:
        """:meth:`search` as a sequence that decodes a product when it is read (a results page
        reads 10 of the 50)."""
        return Results(self.ranked(query), self.products)


class Results(Sequence):
    """Products at ranked indices, read on access."""

    def __init__(self, indices: list[int], products: Sequence[dict[str, Any]]):
        self._indices, self._products = indices, products

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._products[i] for i in self._indices[index]]
        return self._products[self._indices[index]]


@lru_cache(maxsize=8)
def load_webshop_data(data_dir: str | None = None, num_products: int | None = None,
                      seed: int = 0, human_goals: bool = True,
                      spacy_model: str | None = "en_core_web_sm",
                      index_cache: str | None = "auto", files: str = "auto") -> WebShopData:
    """Build (or fetch from the per-process cache) the data for one configuration.

    ``data_dir``: directory with the original files; ``None`` generates the catalogue (above
    100,000 products it is written once, in the original files' format, under the cache root and
    read back from there). ``num_products``: first N products only (default: all original
    products, or 1,000 generated). ``seed``: seeds the draws the original leaves unseeded (range
    prices, price bounds) and the generated catalogue. ``human_goals``: human instructions
    (default) or the original's templated goals from ``items_ins_v2`` (original data only).
    ``spacy_model``: the spaCy pipeline that tags nouns for the type reward on original data
    (``None``: the heuristic tagger; a ``noun_lexicon.json`` next to the files, which the
    generator writes, takes precedence). ``index_cache``: ``"auto"`` (cache products files of
    64 MB or more under ``$AGENTRL_CACHE_DIR/webshop``), a directory (always cache there) or
    ``None``/``"off"`` (never). ``files``: which original files (``"auto"``, ``"full"``,
    ``"1000"``, see :func:`~agentrl_env_webshop.products.original_file_paths`).
    """
    if data_dir is None:
        if not human_goals:
            raise ValueError("the generated catalogue has human-style goals only")
        count = num_products or DEFAULT_NUM_PRODUCTS
        if count <= IN_MEMORY_MAX_GENERATED:
            return _generated_in_memory(count, seed)
        data_dir, num_products = str(generated_catalogue_dir(count, seed, index_cache)), None
    paths = prod.original_file_paths(data_dir, files)
    nouns = _noun_tagger(Path(data_dir), spacy_model)
    root = _cache_root(index_cache, paths["products"])
    if root is None:
        return _from_files_in_memory(paths, num_products, seed, human_goals, nouns, str(data_dir))
    return _from_cache(root, paths, num_products, seed, human_goals, nouns, str(data_dir),
                       spacy_model)


# ----- sources -------------------------------------------------------------------------------------
def _generated_in_memory(count: int, seed: int) -> WebShopData:
    generated = generate_catalogue(count, seed=seed)
    products = prod.iter_normalized_products(generated.products, generated.attributes,
                                             generated.human_instructions)
    return _in_memory(products, seed, True, LexiconNounTagger(generated.noun_lexicon), "generated")


def _raw_streams(paths: Mapping[str, Path | None], human_goals: bool, num_products: int | None
                 ) -> Iterator[dict[str, Any]]:
    attributes = dict(prod.iter_json_items(paths["attributes"]))
    human = dict(prod.iter_json_items(paths["human_instructions"])) if human_goals else None
    reviews = None
    if paths["reviews"] is not None:
        with open(paths["reviews"], encoding="utf-8") as f:
            reviews = json.load(f)
    return prod.iter_normalized_products(prod.iter_json_items(paths["products"]), attributes,
                                         human, reviews=reviews, num_products=num_products)


def _from_files_in_memory(paths, num_products, seed, human_goals, nouns, source) -> WebShopData:
    return _in_memory(_raw_streams(paths, human_goals, num_products), seed, human_goals, nouns,
                      source)


def _noun_tagger(data_dir: Path, spacy_model: str | None) -> Callable[[str], list[str]]:
    lexicon = data_dir / NOUN_LEXICON_FILE
    if lexicon.is_file():
        return LexiconNounTagger(json.loads(lexicon.read_text(encoding="utf-8")))
    return spacy_tagger_or_heuristic(spacy_model)


# ----- one pass over the products ----------------------------------------------------------------
def _one_pass(products: Iterable[dict[str, Any]], seed: int, human_goals: bool,
              keep: Callable[[dict[str, Any]], None]):
    """Prices, index and goals in one pass, the seeded draws in the original's order (every
    range price in catalogue order, then the goals' price bounds)."""
    rng = random.Random(seed)
    builder = IndexBuilder()
    prices: list[float] = []
    asins: list[str] = []
    goal_products, goal_prices = [], {}
    for product in products:
        pricing = product["pricing"]
        price = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
        prices.append(price)
        asins.append(product["asin"])
        builder.add(product_document(product))
        if ("instructions" in product if human_goals
                else product.get("instruction_text") is not None):
            goal_products.append(product)
            goal_prices[product["asin"]] = price
        keep(product)
    goals = (prod.human_goals(goal_products, goal_prices, rng) if human_goals
             else prod.synthetic_goals(goal_products, goal_prices, rng))
    return asins, prices, builder.finish(), prod.split_goals(goals)


def _in_memory(products: Iterable[dict[str, Any]], seed: int, human_goals: bool, nouns,
               source: str) -> WebShopData:
    kept: list[dict[str, Any]] = []
    asins, prices, index, splits = _one_pass(products, seed, human_goals, kept.append)
    return WebShopData(products=kept, by_asin={p["asin"]: p for p in kept},
                       prices=dict(zip(asins, prices)), splits=splits,
                       search_engine=ProductSearchEngine(index=index), nouns=nouns, source=source)


# ----- the on-disk cache -------------------------------------------------------------------------
def default_cache_root() -> Path:
    base = os.environ.get("AGENTRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "agentrl")
    return Path(base) / "webshop"


def _cache_root(index_cache: Any, products_file: Path) -> Path | None:
    if index_cache in (None, False, "off", "none", ""):
        return None
    if index_cache == "auto":
        if products_file.stat().st_size < AUTO_CACHE_MIN_BYTES:
            return None
        return default_cache_root()
    return Path(index_cache)


def generated_catalogue_dir(num_products: int, seed: int, index_cache: Any = "auto") -> Path:
    """The generated catalogue written as the original's full files (once, under a lock)."""
    root = default_cache_root() if index_cache in ("auto", None, False, "off", "none", "") \
        else Path(index_cache)
    target = root / f"catalogue-v{GENERATOR_VERSION}-seed{seed}-n{num_products}"
    with _locked(root, target.name):
        if not (target / NOUN_LEXICON_FILE).is_file():  # written last
            write_catalogue_files(target, num_products, seed)
    return target


class _locked:
    def __init__(self, root: Path, name: str):
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f".{name}.lock"

    def __enter__(self):
        self.file = open(self.path, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def file_digest(path: Path, root: Path) -> str:
    """SHA-256 of a file's contents, remembered per (path, size, mtime, inode) in
    ``root/file-digests.json`` so that a file is read in full only once per version."""
    stat = path.stat()
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    memo_path = root / "file-digests.json"
    try:
        memo = json.loads(memo_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        memo = {}
    entry = memo.get(str(path.resolve()))
    if entry and entry["stamp"] == stamp:
        return entry["sha256"]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    memo[str(path.resolve())] = {"stamp": stamp, "sha256": digest.hexdigest()}
    tmp = memo_path.with_name(f".{memo_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(memo), encoding="utf-8")
    os.replace(tmp, memo_path)
    return digest.hexdigest()


def cache_key(root: Path, paths: Mapping[str, Path | None], num_products: int | None, seed: int,
              human_goals: bool) -> str:
    root.mkdir(parents=True, exist_ok=True)
    material = {"format": CACHE_FORMAT, "num_products": num_products, "seed": seed,
                "human_goals": human_goals,
                "files": {role: None if path is None or (role == "human_instructions"
                                                         and not human_goals)
                          else file_digest(path, root) for role, path in paths.items()}}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:24]


_OPEN: dict[tuple[str, str, str | None], WebShopData] = {}


def _from_cache(root: Path, paths, num_products, seed, human_goals, nouns, source,
                spacy_model) -> WebShopData:
    directory = root / f"index-{cache_key(root, paths, num_products, seed, human_goals)}"
    with _locked(root, directory.name):
        if not (directory / "meta.json").is_file():  # written last: the cache is complete
            build_cache(directory, _raw_streams(paths, human_goals, num_products), seed,
                        human_goals, source)
    # one open cache per process for all argument spellings that resolve to it
    key = (str(directory), source, spacy_model)
    if key not in _OPEN:
        _OPEN[key] = open_cache(directory, nouns)
    return _OPEN[key]


def build_cache(directory: Path, products: Iterable[dict[str, Any]], seed: int,
                human_goals: bool, source: str) -> None:
    """Write the cache for ``products`` to ``directory`` (via a temporary sibling, renamed)."""
    start = time.perf_counter()
    tmp = directory.with_name(f"{directory.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    offsets = [0]
    with open(tmp / "products.bin", "wb") as out:
        def keep(product: dict[str, Any]) -> None:
            record = json.dumps(product).encode()
            out.write(record)
            offsets.append(offsets[-1] + len(record))

        asins, prices, index, splits = _one_pass(products, seed, human_goals, keep)
    np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
    asin_array = np.asarray(asins, dtype="U10")
    del asins
    order = np.argsort(asin_array, kind="stable").astype(np.int32)
    np.save(tmp / "asins.npy", asin_array[order])
    np.save(tmp / "asin_order.npy", order)
    np.save(tmp / "prices.npy", np.asarray(prices, dtype=np.float64))
    ProductSearchEngine(index=index).save(tmp)
    (tmp / "splits.json").write_text(json.dumps(splits), encoding="utf-8")
    meta = {"format": CACHE_FORMAT, "source": source, "num_products": len(prices),
            "num_goals": {k: len(v) for k, v in splits.items()},
            "postings": int(index["data"].size), "vocab": len(index["vocab"]),
            "build_seconds": round(time.perf_counter() - start, 1)}
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def open_cache(directory: Path, nouns: Callable[[str], list[str]]) -> WebShopData:
    """The data of a cache :func:`build_cache` wrote, memory-mapped."""
    meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    store = ProductStore(directory)
    asins = AsinTable(directory, store)
    return WebShopData(
        products=store, by_asin=asins,
        prices=PriceTable(asins, np.load(directory / "prices.npy", mmap_mode="r")),
        splits=json.loads((directory / "splits.json").read_text(encoding="utf-8")),
        search_engine=ProductSearchEngine.load(directory), nouns=nouns, source=meta["source"],
        cache_dir=str(directory))


class ProductStore(Sequence):
    """The normalised products of a cache, decoded on access from a memory-mapped file (the
    last 4,096 decoded are kept)."""

    def __init__(self, directory: Path):
        self._offsets = np.load(directory / "offsets.npy", mmap_mode="r")
        with open(directory / "products.bin", "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        if size and hasattr(mmap, "MADV_RANDOM"):
            self._bytes.madvise(mmap.MADV_RANDOM)  # records are read one at a time: no readahead
        self._decoded: OrderedDict[int, dict[str, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        product = self._decoded.get(index)
        if product is None:
            start, end = int(self._offsets[index]), int(self._offsets[index + 1])
            product = self._decoded[index] = json.loads(self._bytes[start:end])
            if len(self._decoded) > _DECODED_PRODUCTS_KEPT:
                self._decoded.popitem(last=False)
        return product


class AsinTable(Mapping):
    """``asin -> product`` over a cache: binary search in the sorted ASIN table."""

    def __init__(self, directory: Path, store: ProductStore):
        self._sorted = np.load(directory / "asins.npy", mmap_mode="r")
        self._order = np.load(directory / "asin_order.npy", mmap_mode="r")
        self._store = store

    def index_of(self, asin: str) -> int | None:
        if not isinstance(asin, str) or len(asin) > 10:
            return None
        pos = int(np.searchsorted(self._sorted, asin))
        if pos < len(self._sorted) and self._sorted[pos] == asin:
            return int(self._order[pos])
        return None

    def __getitem__(self, asin: str) -> dict[str, Any]:
        index = self.index_of(asin)
        if index is None:
            raise KeyError(asin)
        return self._store[index]

    def __contains__(self, asin: object) -> bool:
        return self.index_of(asin) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return (str(a) for a in self._sorted)

    def __len__(self) -> int:
        return len(self._sorted)


class PriceTable(Mapping):
    """``asin -> price`` over a cache."""

    def __init__(self, asins: AsinTable, prices: np.ndarray):
        self._asins, self._prices = asins, prices

    def __getitem__(self, asin: str) -> float:
        index = self._asins.index_of(asin)
        if index is None:
            raise KeyError(asin)
        return float(self._prices[index])

    def __iter__(self) -> Iterator[str]:
        return iter(self._asins)

    def __len__(self) -> int:
        return len(self._asins)
