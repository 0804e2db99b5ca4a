"""Recipes + ``key=value`` overrides -> a validated :class:`~agentrl.config.schema.Config`.

Order of precedence (later wins): dataclass defaults, the recipe's ``defaults:`` files (in list
order, each resolved recursively), the recipe file's own keys, the command-line overrides.
Values may use OmegaConf interpolation (``${env.max_steps}``). Every problem raises
:class:`~agentrl.errors.UsageError` naming the key path and what is accepted.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentrl.config.modes import training_mode
from agentrl.config.schema import Config
from agentrl.envs.spec import ENVS, env_spec
from agentrl.errors import UsageError
from agentrl.estimators import estimator_class, estimator_from_config, is_import_path
from agentrl.estimators.params import describe, own_fields, violates
from agentrl.generation import AUTO, BACKENDS, builtin_backends
from agentrl.policy_losses import (build_policy_loss, check_composition, is_builtin, policy_loss_class,
                                   policy_loss_values, resolve_agg_mode)
from agentrl.weights.base import WEIGHT_PATHS

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"
BASE_DIR_NAME = "_base"


# ------------------------------------------------------------------------------------- recipes
def env_recipe_dirs() -> list[Path]:
    """The recipe folders the environments found declare (``EnvSpec.recipes_dir``)."""
    return [Path(spec.recipes_dir) for spec in map(env_spec, ENVS.names()) if spec.recipes_dir]


def _recipe_dirs(recipes_dir: Path) -> list[Path]:
    """Where recipes are looked for: ``recipes_dir``, and with the built-in folder the environments' too."""
    return [recipes_dir, *env_recipe_dirs()] if recipes_dir == RECIPES_DIR else [recipes_dir]


def recipe_names(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """Names of the runnable recipes (files under ``_base/`` are building blocks)."""
    return sorted({p.stem for folder in _recipe_dirs(recipes_dir) for p in folder.glob("*.yaml")})


def recipe_path(name: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """Resolve a recipe name, or a path to a YAML file, to a file."""
    as_path = Path(name)
    if as_path.suffix in (".yaml", ".yml") and as_path.is_file():
        return as_path
    for folder in _recipe_dirs(recipes_dir):
        path = folder / f"{name}.yaml"
        if path.is_file():
            return path
    close = difflib.get_close_matches(name, recipe_names(recipes_dir), n=5, cutoff=0.5)
    hint = f" Close names: {', '.join(close)}." if close else ""
    raise UsageError(f"unknown recipe {name!r}.{hint} Run `agentrl recipes` to list them all.")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UsageError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a recipe must be a mapping of config sections")
    return data


# keys that moved: a YAML file written before (a recipe of the user's, a run's saved config.yaml) still
# loads, with one warning line per key; on the command line the old spelling is an unknown key that
# names the new one
MOVED_KEYS = {
    "trainer.sft.dagger_tasks": "trainer.sft.dagger.tasks", "trainer.sft.dagger_rounds": "trainer.sft.dagger.rounds",
    "trainer.sft.dagger_epochs": "trainer.sft.dagger.epochs", "trainer.sft.dagger_lr": "trainer.sft.dagger.lr",
    "trainer.sft.recovery_variants": "trainer.sft.recovery.variants",
    "trainer.sft.action_repeats": "trainer.sft.balance.action_repeats",
}


def move_old_keys(data: dict[str, Any], source: Path) -> dict[str, Any]:
    """``data`` (a YAML layer) with the keys of :data:`MOVED_KEYS` at their new places."""
    for old, new in MOVED_KEYS.items():
        *parents, leaf = old.split(".")
        section = data
        for name in parents:
            section = section.get(name) if isinstance(section, dict) else None
        if not isinstance(section, dict) or leaf not in section:
            continue
        value = section.pop(leaf)
        *new_parents, new_leaf = new.split(".")
        target = data
        for name in new_parents:
            target = target.setdefault(name, {})
        target.setdefault(new_leaf, value)
        print(f"agentrl: warning: {source}: config key `{old}` is now `{new}`", file=sys.stderr)
    return data


def _base_file(root: Path, entry: str) -> Path | None:
    """The building block ``entry`` (``env/textcraft``): in the recipe's own ``_base/``, else in the
    built-in one, else in an environment's (its package ships ``_base/env/<name>.yaml``)."""
    for folder in (root, RECIPES_DIR):
        if (folder / BASE_DIR_NAME / f"{entry}.yaml").is_file():
            return folder / BASE_DIR_NAME / f"{entry}.yaml"
    for folder in env_recipe_dirs():
        if (folder / BASE_DIR_NAME / f"{entry}.yaml").is_file():
            return folder / BASE_DIR_NAME / f"{entry}.yaml"
    return None


def compose_recipe(path: Path, _seen: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """The recipe's layers in merge order: its defaults (recursively), then its own keys."""
    if path in _seen:
        chain = " -> ".join(p.name for p in _seen + (path,))
        raise UsageError(f"recipe defaults form a cycle: {chain}")
    data = move_old_keys(_read_yaml(path), path)
    defaults = data.pop("defaults", []) or []
    if not isinstance(defaults, list):
        raise UsageError(f"{path}: `defaults` must be a list of base file names")
    root = next((d for d in path.parents if (d / BASE_DIR_NAME).is_dir()), path.parent)
    layers: list[dict[str, Any]] = []
    for entry in defaults:
        base = _base_file(root, entry)
        if base is None:
            raise UsageError(f"{path}: default {entry!r} not found (looked for {root / BASE_DIR_NAME / entry}.yaml, "
                             "in the built-in recipes and in the environments' recipes_dir; is its environment "
                             "installed?)")
        layers.extend(compose_recipe(base, _seen + (path,)))
    layers.append(data)
    return layers


# ----------------------------------------------------------------------------------- overrides
def parse_overrides(items: Iterable[str]) -> tuple[str | None, list[str]]:
    """Split ``recipe=NAME`` from the ``key=value`` overrides; reject malformed arguments."""
    recipe = None
    overrides: list[str] = []
    for item in items:
        if "=" not in item:
            raise UsageError(f"argument {item!r} is not key=value (e.g. learner.lr=2e-6 or recipe=NAME)")
        key, _, _value = item.partition("=")
        key = key.strip()
        if not key:
            raise UsageError(f"argument {item!r} has an empty key")
        if key == "recipe":
            recipe = _value.strip()
        else:
            overrides.append(f"{key}={_value}")
    return recipe, overrides


def _dotlist(overrides: list[str]) -> dict[str, Any]:
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(overrides))  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise UsageError(f"cannot parse overrides {overrides}: {err}") from None


def _merge(into: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    for key, value in layer.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


# ---------------------------------------------------------------------------------- validation
def _field_paths(cls: type, prefix: str = "") -> list[str]:
    paths = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        paths.append(path)
        if dataclasses.is_dataclass(hints[f.name]):
            paths.extend(_field_paths(hints[f.name], path + "."))
    return paths


ALL_KEYS = _field_paths(Config)


def _unknown_key(path: str) -> UsageError:
    close = difflib.get_close_matches(path, ALL_KEYS, n=1, cutoff=0.6)
    if not close:
        leaf = path.rsplit(".", 1)[-1]
        close = [k for k in ALL_KEYS if k.rsplit(".", 1)[-1] == leaf][:1]
    hint = f"; did you mean `{close[0]}`?" if close else ""
    return UsageError(f"unknown config key `{path}`{hint} (`agentrl config --keys` lists every key)")




def _coerce(path: str, value: Any, typ: Any, meta: dict[str, Any]) -> Any:
    origin = typing.get_origin(typ)
    optional = origin is typing.Union and type(None) in typing.get_args(typ)
    if optional:
        if value is None:
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    accepted = describe(meta, typ) + (" or null" if optional else "")
    bad = UsageError(f"config key `{path}` = {value!r} is invalid: expected {accepted}")
    if typ is bool:
        if not isinstance(value, bool):
            raise bad
    elif typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
    elif typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        value = float(value)
    elif typ is str:
        if isinstance(value, bool) and {"yes", "no"} <= set(meta.get("choices", ())):
            value = "yes" if value else "no"  # YAML reads a bare yes/no as a boolean
        if isinstance(value, (dict, list, bool)) or value is None:
            raise bad
        value = str(value)
    elif typ is dict:
        if not isinstance(value, dict):
            raise bad
    elif typ is list:
        if not isinstance(value, list):
            raise bad
    elif typ is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad
        value = tuple(value)
    if violates(value, meta):
        raise bad
    return value


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Instantiate ``cls`` from nested dicts, checking every key, type and range."""
    if not isinstance(data, dict):
        raise UsageError(f"config section `{prefix.rstrip('.') or '<root>'}` must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key(f"{prefix}{key}")
    kwargs = {}
    for name, value in data.items():
        typ, path = hints[name], f"{prefix}{name}"
        if dataclasses.is_dataclass(typ):
            kwargs[name] = build_dataclass(typ, value if value is not None else {}, path + ".")
        else:
            kwargs[name] = _coerce(path, value, typ, dict(names[name].metadata))
    return cls(**kwargs)


# ------------------------------------------------------------------------------------- the API
def load_config(recipe: str | None, overrides: list[str] | None = None, *, training: bool = True) -> Config:
    """Compose ``recipe`` (a name or a YAML path; None = defaults only) with ``overrides``. ``training=False``
    (``agentrl eval``) leaves out the refusals that only training needs (an outside agent with
    ``trainer.mode=async`` or ``rollout.expert_guidance``: evaluation uses neither)."""
    merged: dict[str, Any] = dataclasses.asdict(Config())
    if recipe:
        for layer in compose_recipe(recipe_path(recipe)):
            _merge(merged, layer)
    _merge(merged, _dotlist(list(overrides or [])))
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    except OmegaConfBaseException as err:
        raise UsageError(f"cannot resolve an interpolation in the config: {err}") from None
    cfg = build_dataclass(Config, resolved)
    env_spec(cfg.env.name)      # a bad env.name or spec fails here, before anything starts
    check_estimator(cfg.algorithm)
    check_backend(cfg.rollout)
    check_training_mode(cfg, training)
    check_learner(cfg.learner)
    check_policy_loss(cfg)
    if cfg.rollout.weight_sync != "auto":
        WEIGHT_PATHS.get(cfg.rollout.weight_sync)
    return cfg  # type: ignore[return-value]


def check_training_mode(cfg, training: bool = True) -> None:
    """``trainer.mode`` against the settings it changes the meaning of (``learner.rollout_is_cap=null``
    puts the off-policy correction on when the rollout runs ahead: LossSettings.from_config)."""
    learner, trainer = cfg.learner, cfg.trainer
    mode = training_mode(trainer.mode)
    if mode.overlapped and not learner.recompute_logprobs:
        raise UsageError(f"trainer.mode={mode.name} with learner.recompute_logprobs=false centres the PPO clip on the "
                         f"rollout's policy, up to {mode.versions_ahead(trainer)} version(s) older than the learner's, "
                         "with no off-policy correction: set learner.recompute_logprobs=true (the decoupled objective, "
                         "docs/async.md) or trainer.mode=sync")
    if training and cfg.rollout.agent and (not mode.outside_agents or cfg.rollout.expert_guidance):
        key = f"trainer.mode={mode.name}" if not mode.outside_agents else "rollout.expert_guidance=true"
        raise UsageError(f"{key} is not available with rollout.agent (an outside agent plays whole episodes in waves): "
                         "use trainer.mode=sync or one_step_off, without expert guidance")
    if not mode.streams_groups and (trainer.filter_groups or trainer.oversample > 1):
        key = "trainer.filter_groups" if trainer.filter_groups else "trainer.oversample"
        raise UsageError(f"{key} works on the group stream of trainer.mode=async (filtered groups are replaced "
                         f"from it); with trainer.mode={mode.name} unset it, or use learner.skip_zero_advantage to leave out "
                         "rows with advantage 0")


def check_learner(learner) -> None:
    """``learner.*`` settings that contradict each other."""
    if not learner.recompute_logprobs and learner.rollout_is_cap:
        raise UsageError("learner.rollout_is_cap weights by pi_old / pi_rollout, which is 1 when "
                         "learner.recompute_logprobs=false takes the old log-probs from the rollout: set "
                         "learner.rollout_is_cap=0, or learner.recompute_logprobs=true")


def _checked_params(prefix: str, params: dict, params_cls, fields, owner: str, listed_as: str) -> dict:
    """``params`` (the ``prefix.<key>`` values of a plug-in loaded by import path) checked against the
    plug-in's own dataclass ``params_cls`` (its ``fields``) and coerced to their types; an unknown key is
    one line naming the closest one."""
    by_name = {f.name: f for f in fields}
    hints = typing.get_type_hints(params_cls) if params_cls is not None else {}
    for key in params:
        if key not in by_name:
            close = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.5)
            hint = f"; did you mean `{prefix}.{close[0]}`?" if close else ""
            raise UsageError(f"unknown config key `{prefix}.{key}` for {owner}{hint} "
                             f"({listed_as}: {', '.join(by_name) or 'none'})")
    return {key: _coerce(f"{prefix}.{key}", value, hints[key], dict(by_name[key].metadata))
            for key, value in params.items()}


def check_policy_loss(cfg) -> None:
    """Load the configured policy loss (a built-in name or an import path), check its parameters
    (``learner.policy_loss_params``, the keys of one loaded by import path, is coerced in place), its
    aggregation and what it must compose with: the estimator's action-level ratio and the behaviour
    weight (``learner.rollout_is_cap``, on by default when the rollout runs ahead)."""
    learner = cfg.learner
    cls = policy_loss_class(learner.policy_loss)
    if is_builtin(cls):
        if learner.policy_loss_params:
            own = (f"reads learner.{cls.name}.<key> (`agentrl config --keys` lists them)"
                   if dataclasses.fields(cls.Params) else "has no parameters of its own")
            raise UsageError(f"learner.policy_loss_params is for a policy loss loaded by import path; the built-in "
                             f"{cls.name!r} {own}")
    else:
        learner.policy_loss_params = _checked_params("learner.policy_loss_params", learner.policy_loss_params,
                                                     cls.Params, dataclasses.fields(cls.Params),
                                                     learner.policy_loss, "its parameters")
    build_policy_loss(learner.policy_loss, policy_loss_values(learner))
    resolve_agg_mode(cls, learner.loss_agg_mode)
    cap = learner.rollout_is_cap
    behaviour_weight = bool(cap) if cap is not None else training_mode(cfg.trainer.mode).overlapped
    check_composition(cls, action_level_ratio=estimator_from_config(cfg.algorithm).loss_options().action_level_ratio,
                      behaviour_weight=behaviour_weight)


def check_estimator(algorithm) -> None:
    """Load the configured estimator (a built-in name or an import path) and check its parameters;
    ``algorithm.params`` (an import-path estimator's own keys) is coerced in place."""
    cls = estimator_class(algorithm.estimator)
    if not is_import_path(algorithm.estimator):
        if algorithm.params:
            raise UsageError(f"algorithm.params is for an estimator loaded by import path; the built-in "
                             f"{algorithm.estimator!r} reads algorithm.{algorithm.estimator}.<key> "
                             f"(`agentrl config --keys` lists them)")
    else:
        algorithm.params = _checked_params("algorithm.params", algorithm.params, cls.Params, own_fields(cls.Params),
                                           algorithm.estimator, "its parameters")
    estimator_from_config(algorithm)


def check_backend(rollout) -> None:
    """Load the configured back end (``auto``, a name or an import path) and check its settings:
    ``rollout.backend_params`` (the keys of one loaded by import path) is coerced in place, and a
    ``rollout.weight_sync`` it declares it cannot receive is refused."""
    cls = None if rollout.backend == AUTO else BACKENDS.get(rollout.backend)
    if cls is None or builtin_backends().get(cls.name) is cls:
        if rollout.backend_params:
            where = f"rollout.{cls.name}.<key>" if cls is not None else "rollout.<back end>.<key>"
            raise UsageError(f"rollout.backend_params is for a back end loaded by import path; rollout.backend="
                             f"{rollout.backend} reads {where} (`agentrl config --keys` lists them)")
    else:
        settings = cls.Settings
        rollout.backend_params = _checked_params("rollout.backend_params", rollout.backend_params, settings,
                                                 dataclasses.fields(settings) if settings is not None else (),
                                                 rollout.backend, "its settings")
        if settings is not None:
            settings(**rollout.backend_params)      # its own checks across fields (__post_init__)
    if cls is not None and cls.weight_paths is not None and rollout.weight_sync not in ("auto", *cls.weight_paths):
        raise UsageError(f"rollout.weight_sync={rollout.weight_sync}: the {cls.name} back end receives weights only "
                         f"by {', '.join(cls.weight_paths)}; set rollout.weight_sync=auto or one of those")


def config_to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def config_to_yaml(cfg: Any) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=False)


def recipe_description(name: str) -> str:
    """A recipe's one-line description (its own `description:` or one of its layers')."""
    description = ""
    for layer in compose_recipe(recipe_path(name)):
        description = layer.get("description", description)
    return str(description)
