"""BM25 product search with Lucene-like settings (the original uses a pyserini Lucene index).

Each product is indexed as one document: ``title description first-bullet options`` lowercased,
with options written ``name: v1, v2, and name2: ...`` as the original's index conversion does.
Scoring is BM25 in ``bm25s``'s ``method="lucene"`` form, ``k1=0.9``, ``b=0.4`` (pyserini's
defaults), the 33 Lucene English stopwords and PyStemmer's Snowball English stemmer. Like Lucene,
only documents with a positive score are returned; ties keep catalogue order.

The index is built here, streaming (:class:`IndexBuilder`: one document's tokens in memory at a
time), with the same float operations as ``bm25s`` 0.3 so that scores are bit-identical to it
(a test compares them): per-term score ``float32(idf32 * tf / (k1 * (1 - b + b * dl / avgdl) +
tf))``, a query's score the float32 sum over its tokens in query order. The index is three flat
arrays (a CSC matrix: per term, the documents holding it and their scores) that
:meth:`ProductSearchEngine.save` writes as ``.npy`` files and :meth:`ProductSearchEngine.load`
memory-maps, so every process on a machine shares one copy through the page cache.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

SEARCH_RETURN_N = 50
_TOKEN = re.compile(r"(?u)\b\w\w+\b")
INDEX_FILES = ("indptr.npy", "indices.npy", "data.npy", "vocab.json")


def product_document(product: Mapping[str, Any]) -> str:
    """The indexed text of one product (title, description, first bullet point, options)."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product["options"].items()]
    bullets = product["BulletPoints"]
    return " ".join([product["Title"], product["Description"], bullets[0] if bullets else "",
                     ", and ".join(option_texts)]).lower()


class Analyzer:
    """Lowercase, split into word tokens, drop stopwords, stem."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("english")
        self._stopwords = frozenset(STOPWORDS_EN)

    def __call__(self, text: str) -> list[str]:
        tokens = [t for t in _TOKEN.findall(text.lower()) if t not in self._stopwords]
        return self._stemmer.stemWords(tokens)


class IndexBuilder:
    """Adds documents one at a time; :meth:`finish` computes the BM25 score matrix.

    Memory: the vocabulary, and per document its distinct term ids and counts (about 8 bytes a
    posting), never the documents' token lists.
    """

    def __init__(self, k1: float = 0.9, b: float = 0.4):
        self.k1, self.b = k1, b
        self.analyze = Analyzer()
        self.vocab: dict[str, int] = {}
        self._terms = array("i")
        self._counts = array("i")
        self._distinct = array("i")
        self._lengths = array("q")

    def add(self, document: str) -> None:
        vocab = self.vocab
        tokens = self.analyze(document)
        counts = Counter([vocab.setdefault(t, len(vocab)) for t in tokens])
        self._terms.extend(counts.keys())
        self._counts.extend(counts.values())
        self._distinct.append(len(counts))
        self._lengths.append(len(tokens))

    def finish(self) -> dict[str, Any]:
        """``{"indptr", "indices", "data", "vocab", "num_docs"}``; the builder is spent after."""
        n_docs, n_vocab = len(self._lengths), len(self.vocab)
        terms = np.frombuffer(self._terms, dtype=np.int32)
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        distinct = np.frombuffer(self._distinct, dtype=np.int32)
        avg = lengths.mean() if n_docs else np.float64(0.0)
        doc_freqs = np.bincount(terms, minlength=n_vocab)
        # bm25s: idf in Python floats, stored as float32
        idf = np.array([math.log(1 + (n_docs - df + 0.5) / (df + 0.5)) for df in doc_freqs.tolist()],
                       dtype=np.float32)
        # bm25s: k1 * ((1 - b) + b * dl / avgdl) in float64, tf float32 promoted to float64
        norm = self.k1 * ((1 - self.b) + (self.b * lengths.astype(np.float64)) / avg)
        tf = np.frombuffer(self._counts, dtype=np.int32).astype(np.float32).astype(np.float64)
        scores = (idf[terms].astype(np.float64)
                  * (tf / (np.repeat(norm, distinct) + tf))).astype(np.float32)
        del tf
        docs = np.repeat(np.arange(n_docs, dtype=np.int32), distinct)
        order = np.argsort(terms, kind="stable")  # per term, documents in catalogue order
        indptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(doc_freqs, out=indptr[1:])
        vocab = sorted(self.vocab, key=self.vocab.__getitem__)
        self._terms = self._counts = self._distinct = self._lengths = array("i")
        return {"indptr": indptr, "indices": docs[order], "data": scores[order],
                "vocab": vocab, "num_docs": n_docs}


class ProductSearchEngine:
    """Ranks products for a free-text query; ``search(query) -> list of product indices``."""

    def __init__(self, documents: Iterable[str] | None = None, k1: float = 0.9, b: float = 0.4,
                 *, index: Mapping[str, Any] | None = None):
        if index is None:
            builder = IndexBuilder(k1, b)
            for document in documents or []:
                builder.add(document)
            index = builder.finish()
        self.analyze = Analyzer()
        self._indptr = index["indptr"]
        self._indices = index["indices"]
        self._data = index["data"]
        self._vocab = {term: i for i, term in enumerate(index["vocab"])}
        self.num_documents = int(index["num_docs"])

    # ----- persistence -------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        np.save(directory / "indptr.npy", np.asarray(self._indptr))
        np.save(directory / "indices.npy", np.asarray(self._indices))
        np.save(directory / "data.npy", np.asarray(self._data))
        vocab = sorted(self._vocab, key=self._vocab.__getitem__)
        (directory / "vocab.json").write_text(
            json.dumps({"num_docs": self.num_documents, "vocab": vocab}, ensure_ascii=False),
            encoding="utf-8")

    @classmethod
    def load(cls, directory: str | Path, mmap: bool = True) -> ProductSearchEngine:
        """The index :meth:`save` wrote; with ``mmap`` the arrays stay on disk (page cache)."""
        directory = Path(directory)
        mode = "r" if mmap else None
        meta = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        return cls(index={
            "indptr": np.load(directory / "indptr.npy", mmap_mode=mode),
            "indices": np.load(directory / "indices.npy", mmap_mode=mode),
            "data": np.load(directory / "data.npy", mmap_mode=mode),
            "vocab": meta["vocab"], "num_docs": meta["num_docs"]})

    # ----- queries -----------------------------------------------------------------------------
    def scores(self, query: str) -> np.ndarray:
        """Every document's score (float32), accumulated over the query's tokens in order."""
        scores = np.zeros(self.num_documents, dtype=np.float32)
        indptr, indices, data = self._indptr, self._indices, self._data
        for term in (self._vocab[t] for t in self.analyze(query) if t in self._vocab):
            start, end = int(indptr[term]), int(indptr[term + 1])
            np.add.at(scores, indices[start:end], data[start:end])
        return scores

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the top ``k`` documents with a positive score, best first."""
        scores = self.scores(query)
        if k <= 0:
            return []
        candidates = None
        blocks = 1024
        if scores.size >= blocks * 64 and k <= blocks:
            # A lower bound of the k-th largest score: the k-th largest of 1,024 block maxima (k
            # blocks each hold a score at least that large). Only documents above it are ranked.
            whole = scores.size // blocks * blocks
            maxima = scores[:whole].reshape(blocks, -1).max(axis=1)
            bound = np.partition(maxima, blocks - k)[blocks - k]
            if bound > 0:
                candidates = np.flatnonzero(scores >= bound)
        if candidates is None:
            candidates = np.flatnonzero(scores > 0)
        if candidates.size > k:
            values = scores[candidates]
            kth = np.partition(values, values.size - k)[values.size - k]  # the k-th largest
            candidates = candidates[values >= kth]
        if candidates.size == 0:
            return []
        # Stable sort on -score keeps catalogue order among equal scores (Lucene breaks ties by
        # document id, which is insertion order); every document scoring at least the k-th
        # largest is a candidate, so the first k equal those of a full stable sort.
        order = candidates[np.argsort(-scores[candidates], kind="stable")]
        return order[:k].tolist()

