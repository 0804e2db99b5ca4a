"""Work a reset of the ALFWorld engine does that nothing played on it uses, left out.

Loading a game (``PddlEnv.load``) and resetting it (``PddlEnv.reset``) each build a TextWorld
``PddlState``, and the first load of an engine env loads a private copy of Fast Downward's library.
Two parts of that are never used by an env that plays the game:

* **The planner's translation.** ``PddlState.__init__`` translates the game's PDDL to Fast
  Downward's SAS format twice: plain (the task the game is played on) and optimised
  (``sas_replan``, the task Fast Downward's planner searches). Only ``PddlState.replan`` uses the
  optimised one (TextWorld's ``policy_commands``, and a walkthrough asked for but not stored in the
  game), and the library only stores its text on ``load_sas_replan``: ``replan`` reads it when
  called, starting from the current state of the plain task. :func:`defer_planner_translation`
  makes a ``PddlState`` built inside it skip that translation (``sas_replan`` is a
  :class:`DeferredTranslation`, empty); :func:`replan_with_translation` translates on the first
  ``replan`` and hands the text to the library before every ``replan``, so plans are the ones the
  engine as shipped makes. The envs never replan (game generation with ``--solver planner`` does);
  a reset of a game new to the process translated for ~0.2 s twice, now once.
* **The debug information in each library copy.** ``fast_downward.load_lib`` copies
  ``libdownward.so`` to a temporary file for every engine env (the library keeps its task in
  globals, and ``dlopen`` shares one file between callers). 32.7 of its 33.8 MB are DWARF sections
  the loader never maps: 128 envs wrote 4.3 GB, kept on disk while the process lives (the deleted
  copies stay mapped). :func:`loadable_library` is the file cut where its last segment ends, with
  the section header table dropped, as ``sstrip`` does (1.1 MB; the loaded bytes are the same);
  the copies are made from it.

:mod:`agentrl.envs.alfworld.engine_caches` installs both with its caches (one switch,
``AGENTRL_ALFWORLD_ENGINE_CACHES=0``, runs the engine as shipped).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import struct
import warnings
from typing import Any, Callable, Iterator

_deferring = contextvars.ContextVar("agentrl_alfworld_defer_planner_translation", default=False)


class DeferredTranslation(str):
    """The optimised SAS text not made yet: an empty string that keeps what to translate."""

    def __new__(cls, domain: str, problem: str, verbose: bool) -> "DeferredTranslation":
        text = super().__new__(cls, "")
        text.request = (domain, problem, verbose)
        return text


def planner_translation_deferred(optimize: bool) -> bool:
    """True for the optimised translation asked for inside :func:`defer_planner_translation`."""
    return bool(optimize) and _deferring.get()


@contextlib.contextmanager
def defer_planner_translation() -> Iterator[None]:
    token = _deferring.set(True)
    try:
        yield
    finally:
        _deferring.reset(token)


def state_init_deferring_planner_translation(original_init: Callable) -> Callable:
    """``PddlState.__init__`` that leaves the optimised translation for the first ``replan``."""

    def __init__(self, downward_lib, pddl_problem, logic):
        with defer_planner_translation():
            original_init(self, downward_lib, pddl_problem, logic)

    return __init__


def replan_with_translation(original_replan: Callable, translate: Callable) -> Callable:
    """``PddlState.replan`` that makes a deferred optimised translation (``translate``:
    ``fast_downward.pddl2sas``) and loads this state's text into the library before planning."""

    def replan(self, infos):
        if isinstance(self.sas_replan, DeferredTranslation):
            domain, problem, verbose = self.sas_replan.request
            _, self.sas_replan = translate(domain, problem, verbose=verbose, optimize=True)
        self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
        return original_replan(self, infos)

    return replan


# ----- the library without its debug sections ----------------------------------------------------
def loadable_extent(elf: bytes) -> int:
    """Bytes of a 64-bit little-endian ELF file that its program headers cover (what the dynamic
    loader reads); ValueError for any other file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    if phnum == 0 or phentsize < 0x38 or phoff + phnum * phentsize > len(elf):
        raise ValueError("no program headers")
    end = phoff + phnum * phentsize
    for i in range(phnum):
        offset, _, _, filesz = struct.unpack_from("<QQQQ", elf, phoff + i * phentsize + 8)
        end = max(end, offset + filesz)
    if end > len(elf):
        raise ValueError("a segment ends past the end of the file")
    return end


def strip_to_loaded_segments(elf: bytes) -> bytes:
    """``elf`` cut after its last segment, with no section header table (``e_shoff``,
    ``e_shentsize``, ``e_shnum``, ``e_shstrndx`` zeroed): what ``sstrip`` leaves."""
    out = bytearray(elf[:loadable_extent(elf)])
    struct.pack_into("<Q", out, 0x28, 0)
    struct.pack_into("<HHH", out, 0x3A, 0, 0, 0)
    return bytes(out)


def loadable_library(path: str) -> str:
    """A path to ``path``'s library without debug sections: an in-memory file of this process
    (``/proc/self/fd/N``, inherited by forked children; ``memfd_create``). OSError/ValueError when
    the file or the platform does not allow it."""
    with open(path, "rb") as f:
        stripped = strip_to_loaded_segments(f.read())
    fd = os.memfd_create("libdownward-loadable.so")     # AttributeError where there is none
    os.write(fd, stripped)
    return f"/proc/self/fd/{fd}"


def reset_replacements(translate: Callable) -> dict[str, tuple[Any, str, Any]]:
    """name -> (owner, attribute, new value) for :mod:`~agentrl.envs.alfworld.engine_caches`
    (``translate``: its ``pddl2sas``); raises AttributeError/ImportError when this TextWorld is laid
    out differently. The library path is left as it is, with a warning, where the library cannot
    be stripped (not a 64-bit ELF file, no ``memfd_create``)."""
    import fast_downward.interface as downward_interface
    import textworld.envs.pddl.logic as pddl_logic

    state = pddl_logic.PddlState
    for attribute in ("__init__", "replan"):
        if attribute not in vars(state):
            raise AttributeError(f"PddlState.{attribute} not found")
    if "DOWNWARD_LIB_PATH" not in vars(downward_interface):
        raise AttributeError("fast_downward.interface.DOWNWARD_LIB_PATH not found")
    replacements = {
        "PddlState.__init__": (state, "__init__", state_init_deferring_planner_translation(vars(state)["__init__"])),
        "PddlState.replan": (state, "replan", replan_with_translation(vars(state)["replan"], translate)),
    }
    try:
        library = loadable_library(downward_interface.DOWNWARD_LIB_PATH)
    except (OSError, ValueError, AttributeError) as err:
        warnings.warn(f"alfworld: Fast Downward's library is copied whole for every engine env "
                      f"({type(err).__name__}: {err})", RuntimeWarning, stacklevel=3)
    else:
        replacements["fast_downward.DOWNWARD_LIB_PATH"] = (downward_interface, "DOWNWARD_LIB_PATH", library)
    return replacements
