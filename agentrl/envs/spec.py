"""What an environment declares about itself, and the registry that finds the declarations.

An environment is a package of its own (``envs/<name>/`` in this repository, an installable
distribution ``agentrl-env-<name>`` whose import name is ``agentrl_env_<name>``). Its top-level
module holds one :class:`EnvSpec`, conventionally named ``SPEC``, that says everything the shared
code needs to know about it: how to build an instance, how its prompts read, how its actions are
parsed, which columns its results have, where its recipe building blocks are. Shared modules
(rollout, evaluation, config) read the spec and never the environment's name::

    SPEC = EnvSpec(
        name="textcraft",
        make_env=make_textcraft,                       # (**env.kwargs, max_steps=...) -> TextEnv
        splits=("train", "test"),
        prompt=PromptSpec(preamble="You are an expert agent crafting items in a Minecraft-like environment.",
                          task_source="first_observation"),
        actions=ActionSpec(lowercase=False, fallback_chars=30),
        results=ResultSpec(title="TextCraft (success % by depth)"),
        recipes_dir=str(Path(__file__).with_name("recipe_files")),
    )

:data:`ENVS` finds a spec by ``env.name``:

* an **installed** distribution's entry point in the group ``agentrl.envs``
  (``textcraft = "agentrl_env_textcraft:SPEC"``);
* in a **source checkout** (``agentrl`` imported from a clone that has ``envs/<name>/``), every
  ``envs/<name>/agentrl_env_<name>/`` not installed: its folder is put on ``sys.path`` and its
  ``SPEC`` is used, so a clone runs its environments without installing them;
* an **import path** ``package.module:SPEC`` (an :class:`EnvSpec`) or ``package.module:make_env``
  (a bare factory: every other field takes its default and the environment is named by the path).

A bad name, a module without the named object, or a spec that fails :func:`check_env_spec` is a
:class:`~agentrl.plugins.PluginError` (one line: the problem and the fix).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from agentrl.plugins import PluginError, PluginRegistry

ENTRY_POINT_GROUP = "agentrl.envs"
DISTRIBUTION_PREFIX = "agentrl-env-"      # distribution name: agentrl-env-<name>
IMPORT_PREFIX = "agentrl_env_"            # import name: agentrl_env_<name>
SPEC_ATTRIBUTE = "SPEC"                   # the module attribute holding the EnvSpec
ADMISSIBLE_LAYOUTS = ("quoted", "lines")
TASK_SOURCES = ("info", "first_observation")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class PromptSpec:
    """How the step prompt (:mod:`agentrl.rollout.prompts`) shows this environment.

    ``preamble``: the first sentence of the ``full`` prompt style (``... Your task is to: <task>``).
    ``advice``: text appended to the answer instruction (starts with a space), "" for none.
    ``task_source``: ``info`` = the task line is ``info["task"]`` of the current step (else of the
    reset); ``first_observation`` = the task line is the whole reset observation (an environment
    whose first observation carries the commands every later step needs).
    ``admissible_layout``: ``quoted`` = ``'a', 'b', 'c'``; ``lines`` = one action per line.
    """

    preamble: str = "You are an expert agent."
    advice: str = ""
    task_source: str = "info"
    admissible_layout: str = "quoted"


@dataclass(frozen=True)
class ActionSpec:
    """How a model response becomes an action (:mod:`agentrl.rollout.parsing`).

    ``lowercase``: lower-case the text inside ``<action>...</action>`` (environments whose commands
    are lower case). ``fallback_chars``: an invalid response still sends its last N characters.
    """

    lowercase: bool = False
    fallback_chars: int = 30


@dataclass(frozen=True)
class ResultSpec:
    """The environment's table in ``agentrl table`` (:mod:`agentrl.evaluation`).

    ``title``: the table's heading ("" = ``<name> (success %)``).
    ``columns``: a fixed column order; empty = one column per task type found (natural order:
    ``depth2`` before ``depth10``), then ``success_column``.
    ``success_column``: the column holding the success rate (``All``).
    ``score_column``: the column holding the mean task score (``info["task_score"]``), "" for none.
    ``per_type``: a column per task type (from ``info["task_type"]``).
    ``type_columns``: task type -> column name, for types whose column is named otherwise.
    ``published``: a YAML file of published numbers (``sources:`` and ``rows:`` as in
    ``agentrl/evaluation/published.yaml``), "" for none; shown as reference rows.
    """

    title: str = ""
    columns: tuple[str, ...] = ()
    success_column: str = "All"
    score_column: str = ""
    per_type: bool = True
    type_columns: Mapping[str, str] = field(default_factory=dict)
    published: str = ""


@dataclass(frozen=True)
class EnvSpec:
    """Everything shared code knows about one environment; see the module docstring.

    ``name``: what ``env.name`` says (lower case letters, digits, ``_``, ``-``; an import path for a
    bare factory). ``make_env(**kwargs)``: one :class:`~agentrl.envs.base.TextEnv` (``max_steps``
    and the recipe's ``env.kwargs`` are passed as keywords). ``splits``: the main split names its
    tasks are addressed by (documentation, shown by ``agentrl envs list``; an environment may accept
    more). ``recipes_dir``: a folder of recipes (``*.yaml``, runnable) and building blocks
    (``_base/env/<name>.yaml``, ``_base/tiny/<name>.yaml``) that ``agentrl recipes`` lists beside
    the built-in ones; "" for none. ``cli``: a module defining ``add_cli(subparsers)`` for
    ``agentrl envs <name> ...`` subcommands, "" for none. ``switches``: ``(switch, default, what it
    does)`` rows of the environment's machine-specific settings (environment variables) for the
    configuration reference. The expert solver is the environment's
    :meth:`~agentrl.envs.base.TextEnv.expert_actions` (optional: raise NotImplementedError).
    """

    name: str
    make_env: Callable[..., Any]
    splits: tuple[str, ...] = ()
    prompt: PromptSpec = field(default_factory=PromptSpec)
    actions: ActionSpec = field(default_factory=ActionSpec)
    results: ResultSpec = field(default_factory=ResultSpec)
    recipes_dir: str = ""
    cli: str = ""
    description: str = ""
    switches: tuple[tuple[str, str, str], ...] = ()

    @property
    def title(self) -> str:
        return self.results.title or f"{self.name} (success %)"


def check_env_spec(obj: Any, where: str) -> EnvSpec:
    """``obj`` as a checked :class:`EnvSpec` (a bare callable becomes a spec named ``where``), or a
    :class:`PluginError` naming the field that is wrong."""
    if not isinstance(obj, EnvSpec):
        if isinstance(obj, type) or not callable(obj):
            raise PluginError(f"env.name={where!r} is a {type(obj).__name__}, not an EnvSpec or a factory function: "
                              "point it at the package's SPEC (agentrl.envs.spec.EnvSpec) or at a make_env function")
        obj = EnvSpec(name=where, make_env=obj)
    problems = []
    if not isinstance(obj.name, str) or not (_NAME.match(obj.name) or ":" in obj.name):
        problems.append(f"name {obj.name!r} is not lower case letters, digits, _ and -")
    if not callable(obj.make_env):
        problems.append("make_env is not callable")
    if obj.prompt.admissible_layout not in ADMISSIBLE_LAYOUTS:
        problems.append(f"prompt.admissible_layout {obj.prompt.admissible_layout!r} is not one of "
                        f"{', '.join(ADMISSIBLE_LAYOUTS)}")
    if obj.prompt.task_source not in TASK_SOURCES:
        problems.append(f"prompt.task_source {obj.prompt.task_source!r} is not one of {', '.join(TASK_SOURCES)}")
    if not isinstance(obj.actions.fallback_chars, int) or obj.actions.fallback_chars < 1:
        problems.append("actions.fallback_chars must be a positive int")
    if obj.results.columns and obj.results.success_column not in obj.results.columns:
        problems.append(f"results.success_column {obj.results.success_column!r} is not in results.columns")
    for label, path in (("recipes_dir", obj.recipes_dir), ("results.published", obj.results.published)):
        if path and not Path(path).exists():
            problems.append(f"{label} {path!r} does not exist")
    if problems:
        raise PluginError(f"env.name={where!r}: its EnvSpec is not valid: {'; '.join(problems)} (fix the declaration; "
                          "fields in agentrl/envs/spec.py)")
    if isinstance(obj.splits, list):
        obj = replace(obj, splits=tuple(obj.splits))
    return obj


def source_checkout_envs() -> dict[str, str]:
    """``name -> agentrl_env_<name>:SPEC`` for each ``envs/<name>/`` of the source checkout that
    ``agentrl`` was imported from (none for an installed ``agentrl``); their folders go on ``sys.path``."""
    root = Path(__file__).resolve().parents[2] / "envs"
    found: dict[str, str] = {}
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        module = f"{IMPORT_PREFIX}{folder.name}"
        if (folder / module / "__init__.py").is_file() and (folder / "pyproject.toml").is_file():
            if str(folder) not in sys.path:
                sys.path.append(str(folder))
            found[folder.name] = f"{module}:{SPEC_ATTRIBUTE}"
    return found


def new_registry() -> PluginRegistry[EnvSpec]:
    """A registry of environments (the process has one, :data:`ENVS`; tests make fresh ones)."""
    return PluginRegistry("environment", key="env.name", check=check_env_spec, entry_point_group=ENTRY_POINT_GROUP,
                          name_of=lambda spec: spec.name, extra=source_checkout_envs)


ENVS: PluginRegistry[EnvSpec] = new_registry()


def register_env(name: str, **fields: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``factory`` in this process as the environment ``name`` (the other
    :class:`EnvSpec` fields as keywords). For environments built in a program or a test; a package
    declares a ``SPEC`` and an entry point instead."""
    def decorator(factory: Callable[..., Any]) -> Callable[..., Any]:
        ENVS.register(EnvSpec(name=name, make_env=factory, **fields))
        return factory

    return decorator


def env_spec(name: str) -> EnvSpec:
    """The spec ``env.name`` names (a registered name or an import path)."""
    return ENVS.get(str(name))


_NO_ENV = EnvSpec(name="", make_env=lambda **kwargs: None)


def env_spec_or_default(name: str) -> EnvSpec:
    """:func:`env_spec`, or a spec with every default for ``""`` (text handled without an environment)."""
    return _NO_ENV if not name else env_spec(name)


def env_names() -> list[str]:
    """Every environment name found (installed or in the source checkout), without import paths."""
    return ENVS.names()


__all__ = ["ADMISSIBLE_LAYOUTS", "ENTRY_POINT_GROUP", "ENVS", "ActionSpec", "EnvSpec", "PromptSpec", "ResultSpec",
           "TASK_SOURCES", "check_env_spec", "env_names", "env_spec", "env_spec_or_default", "new_registry",
           "register_env", "source_checkout_envs"]
