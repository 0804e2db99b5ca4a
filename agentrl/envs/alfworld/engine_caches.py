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
* ``parse_conjunctive_query`` returns one ``Rule`` per query text (its callers only read it);
* ``copy_context`` copies the two dicts one level deep: the copies are what a derivation updates,
  the values are only read;
* ``pddl2sas`` keeps the last 64 translations per ``(domain, problem, options)``; a ``PddlState``
  only reads the task it gets (actions, types, objects, initial facts) and loads the SAS text.

Observations and admissible commands are unchanged: ``tests/envs/test_alfworld.py`` plays the same
random and expert episodes with and without the caches and compares every text. On the benchmark
in ``docs/benchmarks.md`` ("ALFWorld environment", "Engine caches") a step costs ~2 ms instead of ~33 ms.

They are installed when the first engine env is loaded (:func:`agentrl.envs.alfworld.engine.load_engine_env`),
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
ENV_SWITCH = "AGENTRL_ALFWORLD_ENGINE_CACHES"

_lock = threading.Lock()
_originals: dict[str, tuple[Any, str, Any]] = {}   # name -> (owner, attribute, original value)


def engine_caches_installed() -> bool:
    return bool(_originals)


def _model_cache(parser) -> Callable:
    """``parser.parse(text, rule_name=...)`` memoised per (text, rule); other keyword arguments
    (a trace flag) bypass the cache."""
    models: dict[tuple[str, str], Any] = {}

    def parse(text, rule_name=None, trace=False, **kwargs):
        if trace or kwargs or not isinstance(text, str):
            return parser.parse(text, rule_name=rule_name, trace=trace, **kwargs)
        key = (text, rule_name)
        model = models.get(key)
        if model is None:
            model = models[key] = parser.parse(text, rule_name=rule_name)
        return model

    return parse


def _replacements() -> dict[str, tuple[Any, str, Any]]:
    """name -> (owner, attribute, new value); raises AttributeError/ImportError if TextWorld differs."""
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

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
    queries: dict[str, Any] = {}

    def parse_conjunctive_query(cls, expr):
        rule = queries.get(expr)
        if rule is None:
            rule = queries[expr] = parse_query(cls, expr)
        return rule

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

    replacements = {
        "textgen._parse_and_convert": (textgen, "_parse_and_convert", textgen_parse_and_convert),
        "textgen.copy_context": (textgen, "copy_context", copy_context),
        "pddl_logic._parse_and_convert": (pddl_logic, "_parse_and_convert", logic_parse_and_convert),
        "Rule.parse_conjunctive_query": (tw_logic.Rule, "parse_conjunctive_query",
                                         classmethod(parse_conjunctive_query)),
        "fast_downward.pddl2sas": (fast_downward, "pddl2sas", pddl2sas),
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


def uninstall_engine_caches() -> None:
    """Put TextWorld's own functions back (tests compare the engine with and without the caches)."""
    with _lock:
        for owner, attribute, original in _originals.values():
            setattr(owner, attribute, original)
        _originals.clear()
