"""One mechanism for every axis a user extends: built-in plug-ins found by discovery, installed ones
by entry point, a user's own by import path.

Each axis (policy losses, training modes, generation back ends, weight paths, environments) owns one
:class:`PluginRegistry`::

    POLICY_LOSSES = PluginRegistry("policy loss", key="learner.policy_loss",
                                   package="agentrl.policy_losses.builtin", check=check_policy_loss_class)

    @POLICY_LOSSES.register
    class ClippedPG(PolicyLoss):
        name = "clipped_pg"

    POLICY_LOSSES.get("clipped_pg")                 # a built-in, by name
    POLICY_LOSSES.get("my_pkg.my_module:MyLoss")    # a user's, by import path

* **Built-in**: every module (or subpackage) of ``package`` is imported on first use and registers
  its plug-ins with the decorator, so adding one is adding a module: nothing to list elsewhere.
* **Installed**: an entry point in the group ``agentrl.<group>`` (``group`` defaults to the
  registry's package's last name) names an object in a separately installed distribution; it is
  listed beside the built-ins.
* **Import path**: ``package.module:Name`` (``Name`` may be dotted) loads an object from the user's
  own code, which must be importable (installed or on ``PYTHONPATH``).

Every plug-in is checked by the registry's ``check(obj, where)`` before it is used; a bad name, an
import that fails, a missing attribute or a plug-in that fails its check is a :class:`PluginError`
(a :class:`~agentrl.errors.UsageError`: one line naming the problem and the fix, exit code 2).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import pkgutil
import threading
from typing import Any, Callable, Generic, TypeVar

from agentrl.errors import UsageError

T = TypeVar("T")


class PluginError(UsageError):
    """A plug-in named in the config cannot be found, imported or used."""


def is_import_path(spec: Any) -> bool:
    """``package.module:Name`` rather than a registered name."""
    return ":" in str(spec)


def import_object(path: str, key: str) -> Any:
    """The object ``package.module:Name`` names (``Name`` may be dotted), or a :class:`PluginError`
    that says which part is wrong; ``key`` is the config key that named it (for the message)."""
    module_name, _, attr = str(path).partition(":")
    if not module_name or not attr:
        raise PluginError(f"{key}={path!r} is not an import path: write package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise PluginError(f"{key}={path!r}: cannot import {module_name!r} ({err}); install its package or put its "
                          "directory on PYTHONPATH") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{key}={path!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


class PluginRegistry(Generic[T]):
    """The plug-ins of one axis; see the module docstring.

    ``kind`` names the axis in messages ("policy loss"); ``key`` is the config key that selects one
    (``learner.policy_loss``); ``name_of(obj)`` reads a plug-in's registered name (its ``name``
    attribute by default); ``check(obj, where)`` returns the plug-in or raises :class:`PluginError`;
    ``order(obj)`` sorts the built-in plug-ins in lists and messages (registration order by default);
    ``extra()`` returns more ``name -> package.module:Name`` entries, listed like installed ones (a
    source checkout's, for instance)."""

    def __init__(self, kind: str, *, key: str, package: str | None = None,
                 check: Callable[[Any, str], T] | None = None, entry_point_group: str | None = None,
                 name_of: Callable[[Any], str] | None = None, order: Callable[[Any], Any] | None = None,
                 extra: Callable[[], dict[str, str]] | None = None):
        self.kind, self.key, self.package = kind, key, package
        self._extra = extra   # more ``name -> package.module:Name`` entries, found after the entry points
        self._check = check or (lambda obj, where: obj)
        self._name_of = name_of or (lambda obj: getattr(obj, "name", ""))
        self._order = order
        self.entry_point_group = entry_point_group
        self._builtin: dict[str, T] = {}
        self._installed: dict[str, str] = {}        # name -> entry point value, loaded on use
        self._loaded: dict[str, T] = {}             # import path or installed name -> checked object
        self._discovered = False
        self._discovering = False
        self._lock = threading.RLock()        # threads that look up at once wait for one discovery

    # ----- registering -------------------------------------------------------------------------
    def register(self, obj: T) -> T:
        """Decorator: make ``obj`` a built-in plug-in under its name (checked now)."""
        name = self._name_of(obj)
        where = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', name)}"
        checked = self._check(obj, where)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{where}: a {self.kind} needs a name")
        if name in self._builtin and self._builtin[name] is not checked:
            raise ValueError(f"two {self.kind} plug-ins are named {name!r}: "
                             f"{getattr(self._builtin[name], '__module__', '?')} and {getattr(obj, '__module__', '?')}")
        self._builtin[name] = checked
        return obj

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered or self._discovering:     # done meanwhile, or a module being imported asks
                return
            self._discovering = True
            try:
                self._find_plugins()
            finally:
                self._discovering = False
            self._discovered = True     # only now: another thread never sees a half-filled registry

    def _find_plugins(self) -> None:
        if self.package:
            package = importlib.import_module(self.package)
            for module in pkgutil.iter_modules(package.__path__):
                if not module.name.startswith("_"):
                    importlib.import_module(f"{package.__name__}.{module.name}")
        if self.entry_point_group:
            for point in importlib.metadata.entry_points(group=self.entry_point_group):
                if point.name not in self._builtin:
                    self._installed.setdefault(point.name, point.value)
        if self._extra:
            for name, value in self._extra().items():
                if name not in self._builtin:
                    self._installed.setdefault(name, value)

    # ----- looking up --------------------------------------------------------------------------
    def builtin(self) -> dict[str, T]:
        """The plug-ins that ship in ``package``, by name (registration order)."""
        self._discover()
        if self._order is None:
            return dict(self._builtin)
        return dict(sorted(self._builtin.items(), key=lambda item: self._order(item[1])))

    def names(self) -> list[str]:
        """Every name :meth:`get` accepts without an import path: built-in, then installed."""
        return list(self.builtin()) + sorted(self._installed)

    def get(self, spec: str) -> T:
        """The plug-in ``spec`` names: a registered or installed name, or ``package.module:Name``."""
        spec = str(spec)
        if spec in self._loaded:
            return self._loaded[spec]
        if is_import_path(spec):
            return self._load(spec, import_object(spec, self.key), spec)
        self._discover()
        if spec in self._builtin:
            return self._builtin[spec]
        if spec in self._installed:
            return self._load(spec, import_object(self._installed[spec], self.key), spec)
        known = self.names()
        close = difflib.get_close_matches(spec, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise PluginError(f"unknown {self.kind} {self.key}={spec!r}{hint} (available: {', '.join(known) or 'none'}; "
                          "or an import path package.module:Name)")

    def _load(self, spec: str, obj: Any, where: str) -> T:
        checked = self._check(obj, where)
        name = self._name_of(checked)
        builtin = self.builtin()
        if is_import_path(spec) and name in builtin and builtin[name] is not checked:
            raise PluginError(f"{self.key}={spec!r} is named {name!r}, the name of a built-in {self.kind}: choose "
                              "another name")
        self._loaded[spec] = checked
        return checked


__all__ = ["PluginError", "PluginRegistry", "import_object", "is_import_path"]
