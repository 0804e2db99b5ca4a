"""The generation back ends by name: built-in ones found by discovery, installed ones by entry point
(group ``agentrl.generation``), a user's by import path (``rollout.backend=my_pkg.my_mod:MyBackend``).

* Built-in: every module or subpackage of :mod:`agentrl.generation` is imported on first use and
  registers its back end with :func:`register_backend` (``torch_engine.py``, ``vllm/``); adding one is
  adding a module (docs/rollout.md, "Add a back end").
* ``rollout.backend=auto``: of the built-in back ends installed here, the one whose
  ``auto_preference(device)`` is highest (vLLM on a GPU, the torch engine otherwise). The placement
  plan, which may run on a laptop for a GPU cluster, asks :func:`planned_backend`: the same choice
  on a GPU with every back end installed.
* Settings: a built-in back end's ``Settings`` are the config section ``rollout.<name>``; one loaded
  by import path (or installed) reads ``rollout.backend_params``, checked against its ``Settings`` when
  the config loads (:func:`backend_settings`).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from agentrl.generation.base import GenerationBackend
from agentrl.plugins import PluginError, PluginRegistry

AUTO = "auto"
PARAMS_SECTION = "rollout.backend_params"      # the settings of a back end that is not built in


def check_backend_class(obj: Any, where: str) -> type[GenerationBackend]:
    """``obj`` if it is a usable back end class, else :class:`PluginError` naming what is wrong."""
    if not (inspect.isclass(obj) and issubclass(obj, GenerationBackend)):
        raise PluginError(f"{where} is not a generation back end: subclass agentrl.generation.GenerationBackend "
                          "(docs/rollout.md, 'Add a back end')")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise PluginError(f"{where} does not define {missing} (agentrl.generation.GenerationBackend)")
    if not isinstance(obj.name, str) or not obj.name.isidentifier() or obj.name == AUTO:
        raise PluginError(f"{where} needs a class attribute name = '<identifier>' other than 'auto' (got {obj.name!r})")
    if obj.build.__func__ is GenerationBackend.build.__func__:
        raise PluginError(f"{where} does not define the classmethod build(model_dir, settings, *, device, dtype, "
                          "max_model_len, seed)")
    settings = obj.Settings
    if settings is not None:
        if not (inspect.isclass(settings) and dataclasses.is_dataclass(settings)):
            raise PluginError(f"{where}.Settings is not a dataclass (fields made with agentrl.generation.setting)")
        for f in dataclasses.fields(settings):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PluginError(f"{where}.Settings.{f.name} has no default: give it one with setting(default, help)")
        names = {f.name for f in dataclasses.fields(settings)}
        for attribute in ("engine_gpus_setting", "sleep_setting"):
            named = getattr(obj, attribute)
            if named is not None and named not in names:
                raise PluginError(f"{where}.{attribute}={named!r} is not a field of its Settings ({', '.join(names)})")
    paths = obj.weight_paths
    if paths is not None and not (isinstance(paths, tuple) and all(isinstance(p, str) and p for p in paths)):
        raise PluginError(f"{where}.weight_paths={paths!r}: None (every path) or a tuple of rollout.weight_sync "
                          "names (packed, ipc, broadcast, or a path's import path)")
    return obj


BACKENDS: PluginRegistry[type[GenerationBackend]] = PluginRegistry(
    "generation back end", key="rollout.backend", package="agentrl.generation", check=check_backend_class,
    entry_point_group="agentrl.generation")


def register_backend(cls: type[GenerationBackend]) -> type[GenerationBackend]:
    """Class decorator: make ``cls`` a built-in back end under ``cls.name`` (its settings: ``rollout.<name>``)."""
    return BACKENDS.register(cls)


def builtin_backends() -> dict[str, type[GenerationBackend]]:
    """The back ends that ship in agentrl.generation, by name."""
    return BACKENDS.builtin()


def is_builtin(cls: type[GenerationBackend]) -> bool:
    return builtin_backends().get(cls.name) is cls


def auto_backend(device: str, *, installed_only: bool = True) -> type[GenerationBackend]:
    """What ``rollout.backend=auto`` builds on ``device``: the built-in back end with the highest
    ``auto_preference(device)`` among those installed here (``installed_only=False``: among all)."""
    ranked = [(cls.auto_preference(device), -order, cls) for order, cls in enumerate(builtin_backends().values())
              if not installed_only or cls.installed()]
    ranked = [entry for entry in ranked if entry[0] > 0]
    if not ranked:
        raise PluginError(f"rollout.backend=auto: no installed back end runs on {device}; name one "
                          f"(rollout.backend={', '.join(builtin_backends())} or package.module:ClassName)")
    return max(ranked, key=lambda entry: entry[:2])[2]


def resolve_backend(spec: str, device: str) -> type[GenerationBackend]:
    """The back end class ``rollout.backend=spec`` builds on ``device`` in this interpreter."""
    return auto_backend(device) if spec == AUTO else BACKENDS.get(spec)


def planned_backend(rollout_cfg: Any) -> type[GenerationBackend]:
    """The back end a GPU run of ``rollout_cfg`` builds where every back end is installed: what the
    placement plan and the checks made before the run starts assume."""
    spec = getattr(rollout_cfg, "backend", AUTO)
    return auto_backend("cuda", installed_only=False) if spec == AUTO else BACKENDS.get(spec)


def backend_settings(rollout_cfg: Any, cls: type[GenerationBackend]) -> Any:
    """The settings ``cls`` is built with: ``rollout.<name>`` for a built-in back end, ``rollout.backend_params``
    (checked against ``cls.Settings``) for any other; None when it declares none."""
    if cls.Settings is None:
        return None
    if is_builtin(cls):
        section = getattr(rollout_cfg, cls.name, None)
        return section if section is not None else cls.Settings()
    params = dict(getattr(rollout_cfg, "backend_params", None) or {})
    names = {f.name for f in dataclasses.fields(cls.Settings)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise PluginError(f"unknown config key `{PARAMS_SECTION}.{unknown[0]}` for rollout.backend="
                          f"{getattr(rollout_cfg, 'backend', cls.name)} (its settings: {', '.join(sorted(names)) or 'none'})")
    return cls.Settings(**params)


def setting_key(cls: type[GenerationBackend], field: str | None) -> str | None:
    """The config key of the field ``field`` of ``cls.Settings`` (``rollout.vllm.sleep_level``)."""
    if field is None:
        return None
    return f"rollout.{cls.name}.{field}" if is_builtin(cls) else f"{PARAMS_SECTION}.{field}"


def engine_gpus(rollout_cfg: Any, device: str) -> int:
    """GPUs each rollout engine of ``rollout_cfg`` takes on ``device`` (0 off a GPU): a rollout worker's Ray
    request, as the placement plan reserves them (``auto`` is resolved where the worker runs, which may
    have packages the driver lacks)."""
    if not device.startswith("cuda"):
        return 0
    cls = planned_backend(rollout_cfg)
    return cls.engine_gpus(backend_settings(rollout_cfg, cls))


def make_backend(spec: str, model_dir: str, rollout_cfg: Any = None, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, max_model_len: int = 4096, seed: int = 0) -> GenerationBackend:
    """Build the back end ``spec`` (``auto``, a name, or ``package.module:ClassName``) over the model
    directory, with its settings from ``rollout_cfg`` (None: the defaults of its ``Settings``)."""
    cls = resolve_backend(spec, device)
    return cls.build(model_dir, backend_settings(rollout_cfg, cls), device=device, dtype=dtype,
                     max_model_len=max_model_len, seed=seed)


__all__ = ["AUTO", "BACKENDS", "PARAMS_SECTION", "auto_backend", "backend_settings",
           "builtin_backends", "check_backend_class", "engine_gpus", "is_builtin", "make_backend", "planned_backend",
           "register_backend", "resolve_backend", "setting_key"]
