"""Noun extraction for the type factor of the WebShop score.

The original benchmark tags product titles with spaCy and keeps the lowercased tokens whose part
of speech is ``NOUN`` or ``PROPN``. Three taggers implement that contract here
(``tagger(text) -> list of lowercased noun tokens``):

* :class:`LexiconNounTagger`: the generated catalogue knows the part of speech of every word it
  writes into a title, so its titles are tagged exactly, by construction, with no model at all;
  words outside the lexicon go to the heuristic below.
* :class:`SpacyNounTagger`: spaCy with an installed English pipeline (``en_core_web_sm`` by
  default), as the original does; used for the original data files when spaCy is importable.
* :class:`HeuristicNounTagger`: a documented approximation for when spaCy is absent: alphabetic
  tokens of two or more letters that are not closed-class words, common adjectives, colours,
  units or verbs are treated as nouns.
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache
from typing import Callable, Iterable, Mapping

_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")

# Closed-class words, frequent title adjectives and verbs, and measurement units: never nouns.
NON_NOUNS = frozenset("""
a an the and or but nor for of to in on at by with from into onto over under up down out off as
per via than then so too very not no yes all any each every both either neither some many much
more most less least few several own same such only just also even ever
i me my mine we us our you your he him his she her it its they them their this that these those
is are was were be been being am do does did done have has had will would can could shall should
may might must
new best great perfect premium professional classic modern vintage original natural organic pure
fresh free easy simple extra super ultra mini large small medium big little long short tall wide
high low soft hard light heavy dark bright clean comfortable comfy durable portable adjustable
waterproof lightweight breathable stylish elegant cute cozy warm cool hot cold dry wet thin thick
slim full half double single multi multiple non anti compatible wireless rechargeable reusable
washable foldable stretchy flexible sturdy strong safe healthy delicious tasty sweet spicy savory
gentle smooth silky shiny matte glossy quick fast slow real true fine good nice pretty beautiful
handmade assorted mixed quality resistant proof friendly based inspired included ready
black white red blue green yellow pink purple orange brown grey gray navy beige silver gold
ivory khaki teal burgundy maroon olive coral cream tan charcoal mint lavender
inch inches cm mm ft feet oz ounce ounces lb lbs pound pounds ml liter liters gram grams kg count
pcs pc pack x xl xxl
get make use fits fit keeps keep makes made designed design set sets
""".split())


def tokenize_title(text: str) -> list[str]:
    """Lowercased word tokens of a title (letters, digits and in-word apostrophes)."""
    return _TOKEN.findall(text.lower())


class HeuristicNounTagger:
    """Approximate NOUN/PROPN tagging without a model (see the module docstring)."""

    def __init__(self, non_nouns: Iterable[str] = NON_NOUNS):
        self.non_nouns = frozenset(non_nouns)
        self._cached = lru_cache(maxsize=65536)(self._tag)

    def _tag(self, text: str) -> tuple[str, ...]:
        return tuple(t for t in tokenize_title(text)
                     if len(t) >= 2 and t.isalpha() and t not in self.non_nouns)

    def __call__(self, text: str) -> list[str]:
        return list(self._cached(text))


class LexiconNounTagger:
    """Exact tagging for text whose words have a known part of speech.

    ``lexicon`` maps a lowercased word to True (noun or proper noun) or False (anything else).
    Unknown words fall back to ``fallback``'s verdict on that single word.
    """

    def __init__(self, lexicon: Mapping[str, bool],
                 fallback: Callable[[str], list[str]] | None = None):
        self.lexicon = dict(lexicon)
        self.fallback = fallback or HeuristicNounTagger()
        self._cached = lru_cache(maxsize=65536)(self._tag)

    def _is_noun(self, token: str) -> bool:
        known = self.lexicon.get(token)
        if known is not None:
            return known
        return bool(self.fallback(token))

    def _tag(self, text: str) -> tuple[str, ...]:
        return tuple(t for t in tokenize_title(text) if self._is_noun(t))

    def __call__(self, text: str) -> list[str]:
        return list(self._cached(text))


class SpacyNounTagger:
    """The original tagger: spaCy tokens with ``pos_`` in NOUN/PROPN, lowercased."""

    def __init__(self, model: str = "en_core_web_sm"):
        import spacy  # imported only when this tagger is chosen

        self.nlp = spacy.load(model, disable=["parser", "ner", "lemmatizer"])
        self._cached = lru_cache(maxsize=65536)(self._tag)

    def _tag(self, text: str) -> tuple[str, ...]:
        return tuple(t.text.lower() for t in self.nlp(text) if t.pos_ in ("PNOUN", "NOUN", "PROPN"))

    def __call__(self, text: str) -> list[str]:
        return list(self._cached(text))


def spacy_tagger_or_heuristic(model: str | None = "en_core_web_sm") -> Callable[[str], list[str]]:
    """spaCy when it and ``model`` are installed, otherwise (or for ``model=None``) the heuristic."""
    if model is None:
        return HeuristicNounTagger()
    try:
        return SpacyNounTagger(model)
    except (ImportError, OSError) as error:
        warnings.warn(f"WebShop type reward: spaCy pipeline {model!r} unavailable ({error}); "
                      "using the heuristic noun tagger, an approximation of the original",
                      RuntimeWarning, stacklevel=2)
        return HeuristicNounTagger()
