"""Caches that take the repeated parsing and copying out of the ALFWorld engine's step and reset.

TextWorld's PDDL engine spends most of a step re-deriving the same text: every step it derives the
command of every applicable action (``_gather_infos``), and each derivation

* parses its template string again with the grammar parser (TatSu), although the templates are the
  same few hundred strings all game long;
* parses each condition of the grammar (``Rule.parse_conjunctive_query``) again;
* deep-copies the derivation context's ``variables`` and ``mapping`` dicts at every symbol, values
  included (entity infos, placeholders and variables that no derivation changes).

A reset translates the same PDDL problem to Fast Downward's SAS format four times (``load`` and
``reset`` each build a ``PddlState``, which translates once plain and once optimised), and the
eight envs of a group load the same game.

:func:`install_engine_caches` replaces those four functions with equivalent ones:

* grammar and logic parses keep the parser's model per ``(text, rule)`` and convert it to fresh
  symbols on every call (the conversion builds new objects; the callers then mutate those, never
  the model);
* ``parse_conjunctive_query`` returns one ``Rule`` per query text (its callers only read it;
  the last ``QUERY_CACHE_SIZE`` texts);
* ``copy_context`` copies the two dicts one level deep: the copies are what a derivation updates,
  the values are only read;
* ``pddl2sas`` keeps the last 64 translations per ``(domain, problem, options)``; a ``PddlState``
  only reads the task it gets (actions, types, objects, initial facts) and loads the SAS text.

Every cache is bounded, so a process that meets thousands of games (a pool worker over the 3,553
train games, a generation worker) stays at a fixed size: the parser models keep the last
``MODEL_CACHE_SIZE`` texts per parser (a game's whole grammar is one text, ~100 KB of model), and
:func:`bound_textworld_memo`, called before every game load, empties TextWorld's own memo of every
``Proposition`` and ``Signature`` ever built (``mementos``' ``_memento_cache``, ~0.7 MB per game and
never emptied by TextWorld) once it holds over ``MEMO_LIMIT`` entries. The memo only shares equal
objects (they compare and hash by value), so emptying it changes no text (``tests/envs/test_alfworld.py``
plays the same episodes with it emptied before every load).

Observations and admissible commands are unchanged: ``tests/envs/test_alfworld.py`` plays the same
random and expert episodes with and without the caches and compares every text. On the benchmark
in ``docs/benchmarks.md`` ("ALFWorld environment", "Engine caches") a step costs ~2 ms instead of ~33 ms.

With them go :mod:`agentrl_env_alfworld.engine_reset`'s ``PddlState.__init__`` and ``replan`` (one
translation per game instead of two, the initial facts kept per translated task) and its library
path (Fast Downward's library copied without debug sections).

They are installed when the first engine env is loaded (:func:`agentrl_env_alfworld.engine.load_engine_env`),
once per process. ``AGENTRL_ALFWORLD_ENGINE_CACHES=0`` leaves the engine as it is. A TextWorld
whose functions are not where this module expects them is left alone, with a warning.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Any, Callable

PDDL2SAS_CACHE_SIZE = 64
MODEL_CACHE_SIZE = 128      # parser models per parser (grammar templates: ~80; a game's grammar: one each, ~120 KB)
QUERY_CACHE_SIZE = 4096    # grammar conditions (a few hundred texts per game logic)
MEMO_LIMIT = 100_000        # TextWorld memo entries (~330 bytes each) before it is emptied
ENV_SWITCH = "AGENTRL_ALFWORLD_ENGINE_CACHES"

_lock = threading.Lock()
_originals: dict[str, tuple[Any, str, Any]] = {}   # name -> (owner, attribute, original value)


def engine_caches_installed() -> bool:
    return bool(_originals)


def _textworld_memo() -> dict | None:
    """TextWorld's memo of logic objects (``mementos``' module-level dict), once TextWorld is imported."""
    return getattr(sys.modules.get("mementos.core"), "_memento_cache", None)


def bound_textworld_memo(limit: int | None = None) -> bool:
    """Empty TextWorld's memo of logic objects when it holds over ``limit`` (default
    ``MEMO_LIMIT``) entries; True if it did. Called before every game load."""
    memo = _textworld_memo()
    if memo is None or len(memo) <= (MEMO_LIMIT if limit is None else limit):
        return False
    memo.clear()
    return True


def _model_cache(parser) -> Callable:
    """``parser.parse(text, rule_name=...)`` memoised per (text, rule), the last
    ``MODEL_CACHE_SIZE``; other keyword arguments (a trace flag) bypass the cache."""

    @functools.lru_cache(maxsize=MODEL_CACHE_SIZE)
    def model(text, rule_name):
        return parser.parse(text, rule_name=rule_name)

    def parse(text, rule_name=None, trace=False, **kwargs):
        if trace or kwargs or not isinstance(text, str):
            return parser.parse(text, rule_name=rule_name, trace=trace, **kwargs)
        return model(text, rule_name)

    parse.cache_info = model.cache_info
    return parse


def _replacements() -> dict[str, tuple[Any, str, Any]]:
    """name -> (owner, attribute, new value); raises AttributeError/ImportError if TextWorld differs."""
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    from agentrl_env_alfworld.engine_reset import reset_replacements

    grammar_parse = _model_cache(textgen._PARSER)
    symbol_converter = textgen._Converter

    def textgen_parse_and_convert(text, rule_name=None, **kwargs):
        return symbol_converter().walk(grammar_parse(text, rule_name=rule_name, **kwargs))

    logic_parse = _model_cache(pddl_logic._PARSER)
    logic_converter = pddl_logic._ModelConverter

    def logic_parse_and_convert(text, rule_name=None, **kwargs):
        return logic_converter().walk(logic_parse(text, rule_name=rule_name, **kwargs))

    def copy_context(context):
        return {"state": context["state"], "facts": context["facts"], "variables": dict(context["variables"]),
                "mapping": dict(context["mapping"]), "entity_infos": context["entity_infos"]}

    parse_query = tw_logic.Rule.parse_conjunctive_query.__func__

    @functools.lru_cache(maxsize=QUERY_CACHE_SIZE)
    def parse_conjunctive_query(cls, expr):
        return parse_query(cls, expr)

    translate = fast_downward.pddl2sas

    @functools.lru_cache(maxsize=PDDL2SAS_CACHE_SIZE)
    def cached_translation(domain, problem, verbose, optimize):
        argv = sys.argv     # fast_downward sets sys.argv for its option parser: give the caller's back
        try:
            return translate(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv = argv

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        return cached_translation(domain, problem, bool(verbose), bool(optimize))

    textgen_parse_and_convert.cache_info = grammar_parse.cache_info
    logic_parse_and_convert.cache_info = logic_parse.cache_info
    pddl2sas.cache_info = cached_translation.cache_info

    replacements = {
        "textgen._parse_and_convert": (textgen, "_parse_and_convert", textgen_parse_and_convert),
        "textgen.copy_context": (textgen, "copy_context", copy_context),
        "pddl_logic._parse_and_convert": (pddl_logic, "_parse_and_convert", logic_parse_and_convert),
        "Rule.parse_conjunctive_query": (tw_logic.Rule, "parse_conjunctive_query",
                                         classmethod(parse_conjunctive_query)),
        "fast_downward.pddl2sas": (fast_downward, "pddl2sas", pddl2sas),
        **reset_replacements(pddl2sas),
    }
    for name, (owner, attribute, _) in replacements.items():
        if attribute not in vars(owner):    # a TextWorld laid out differently: replace nothing
            raise AttributeError(f"{name} not found")
    return replacements


def install_engine_caches() -> bool:
    """Install the caches (idempotent); False when switched off or this TextWorld is not the one
    they were written against."""
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    with _lock:
        if _originals:
            return True
        try:
            replacements = _replacements()
        except (ImportError, AttributeError) as err:
            warnings.warn(f"alfworld: engine caches not installed ({type(err).__name__}: {err}); the engine runs "
                          f"as shipped, ~15x slower per step", RuntimeWarning, stacklevel=2)
            return False
        for name, (owner, attribute, value) in replacements.items():
            _originals[name] = (owner, attribute, vars(owner)[attribute])
            setattr(owner, attribute, value)
        return True


def engine_cache_sizes() -> dict[str, int]:
    """Entries each installed cache holds now, and TextWorld's memo (``textworld_memo``)."""
    sizes = {}
    with _lock:
        for name, (owner, attribute, _) in _originals.items():
            value = vars(owner)[attribute]
            info = getattr(getattr(value, "__func__", value), "cache_info", None)
            if info is not None:
                sizes[name] = info().currsize
    memo = _textworld_memo()
    sizes["textworld_memo"] = len(memo) if memo is not None else 0
    return sizes


def uninstall_engine_caches() -> None:
    """Put TextWorld's own functions back (tests compare the engine with and without the caches)."""
    with _lock:
        for owner, attribute, original in _originals.values():
            setattr(owner, attribute, original)
        _originals.clear()
