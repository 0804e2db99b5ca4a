"""BM25 product search with Lucene-like settings (the original uses a pyserini Lucene index).

Each product is indexed as one document: ``title description first-bullet options`` lowercased,
with options written ``name: v1, v2, and name2: ...`` as the original's index conversion does.
Scoring is ``bm25s`` with ``method="lucene"``, ``k1=0.9``, ``b=0.4`` (pyserini's defaults), the
33 Lucene English stopwords and PyStemmer's Snowball English stemmer. Like Lucene, only documents
with a positive score are returned; ties keep catalogue order.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

SEARCH_RETURN_N = 50
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def product_document(product: Mapping[str, Any]) -> str:
    """The indexed text of one product (title, description, first bullet point, options)."""
    option_texts = [f"{name}: {', '.join(values)}" for name, values in product["options"].items()]
    bullets = product["BulletPoints"]
    return " ".join([product["Title"], product["Description"], bullets[0] if bullets else "",
                     ", and ".join(option_texts)]).lower()


class ProductSearchEngine:
    """Ranks products for a free-text query; ``search(query) -> list of product indices``."""

    def __init__(self, documents: Sequence[str], k1: float = 0.9, b: float = 0.4):
        self._stemmer = Stemmer.Stemmer("english")
        self._stopwords = frozenset(STOPWORDS_EN)
        self._retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        self._retriever.index([self.analyze(doc) for doc in documents], show_progress=False)
        self._vocab = self._retriever.vocab_dict
        self.num_documents = len(documents)

    def analyze(self, text: str) -> list[str]:
        """Lowercase, split into word tokens, drop stopwords, stem."""
        tokens = [t for t in _TOKEN.findall(text.lower()) if t not in self._stopwords]
        return self._stemmer.stemWords(tokens)

    def scores(self, query: str) -> np.ndarray:
        ids = [self._vocab[t] for t in self.analyze(query) if t in self._vocab]
        if not ids:
            return np.zeros(self.num_documents, dtype=np.float32)
        return self._retriever.get_scores(ids)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Indices of the top ``k`` documents with a positive score, best first."""
        scores = self.scores(query)
        positive = np.flatnonzero(scores > 0)
        if positive.size == 0:
            return []
        # Stable sort on -score keeps catalogue order among equal scores (Lucene breaks ties by
        # document id, which is insertion order).
        order = positive[np.argsort(-scores[positive], kind="stable")]
        return order[:k].tolist()
