"""The real ALFWorld engine: TextWorld's ``PddlEnv`` with ALFWorld's own wrappers.

This is the stack ALFWorld's ``AlfredTWEnv.init_env`` builds for one game, minus the gym batching:
``PddlEnv`` -> ``AlfredDemangler`` (PDDL ids -> ``cabinet 1`` names; no shuffling, as in
evaluation) -> ``AlfredInfos`` (adds the game file). Imported lazily: ``textworld`` takes about
two seconds to import. The first load installs :mod:`agentrl_env_alfworld.engine_caches` (the same
texts, ~15x faster steps); every load goes through :func:`load_game`, which keeps TextWorld's memo
of logic objects bounded.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

ENGINE_LOCK = threading.RLock()
"""Held around every call into the engine (:class:`~agentrl_env_alfworld.env.ALFWorldEnv` takes it):
the engine is not thread-safe. TextWorld's grammar and logic parsers are module-level TatSu parsers
that keep the parse in progress on themselves, and a Fast Downward translation sets the translator's
module-level options, ``sys.argv`` and ``sys.stdout``. Two threads loading games at once corrupted
each other's parses (``IndexError: pop from empty list``, ``FailedToken``: 11 of 12 resets on two
threads); an env server pool that hands the rest of a batch to another thread past a slow call runs
ALFWorld calls on two threads at once."""


def engine_available() -> bool:
    """True when the ``alfworld`` and ``textworld`` packages (with Fast Downward) can be imported."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("alfworld", "textworld", "fast_downward"))


def load_engine_env(game: str | Mapping[str, Any], policy_commands: bool = False):
    """A loaded ALFWorld engine env for one ``game.tw-pddl`` (path or parsed content).

    ``reset()`` returns TextWorld's ``GameState`` (``feedback``, ``admissible_commands``, ``won``,
    ``extra.gamefile``; with ``policy_commands`` also the planner's plan from that state) and
    ``step(cmd)`` returns ``(state, score, done)``.
    """
    import textworld
    from textworld.envs import PddlEnv
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    from agentrl_env_alfworld.engine_caches import install_engine_caches

    install_engine_caches()
    infos = textworld.EnvInfos(won=True, admissible_commands=True, policy_commands=policy_commands,
                               extras=["gamefile"])
    env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
    load_game(env, game)
    return env


def load_game(env, game: str | Mapping[str, Any]) -> None:
    """Load a game into an engine env from :func:`load_engine_env` (TextWorld's memo of
    logic objects emptied first when it is over its bound: it grows with every distinct game)."""
    from agentrl_env_alfworld.engine_caches import bound_textworld_memo

    bound_textworld_memo()
    env.load(game)
