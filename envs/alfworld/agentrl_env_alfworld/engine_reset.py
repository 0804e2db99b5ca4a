"""A cheaper ``PddlState`` for the ALFWorld engine's load and reset, with the same game state.

Loading a game (``PddlEnv.load``) and resetting it (``PddlEnv.reset``) each build a TextWorld
``PddlState``; the first load of an engine env also loads a private copy of Fast Downward's
library. Profiled on 64 envs (8 games x 8, what one worker of the 16 x 8 batch holds), most of
that work is the same for every instance of a game, or never used:

* **The planner's translation.** TextWorld's ``PddlState.__init__`` translates the game's PDDL to
  Fast Downward's SAS format twice: plain (the task the game is played on) and optimised
  (``sas_replan``, the task Fast Downward's planner searches). Only ``PddlState.replan`` uses the
  optimised one (TextWorld's ``policy_commands``, and a walkthrough asked for but not stored in the
  game), and the library only stores its text on ``load_sas_replan``: ``replan`` reads it when
  called, starting from the current state of the plain task. Here ``sas_replan`` starts as a
  :class:`DeferredTranslation` (empty); :func:`replan_with_translation` translates on the first
  ``replan`` and hands the text to the library before every ``replan``, so plans are the ones
  the engine as shipped makes. The envs never replan (game generation with ``--solver planner``
  does); a reset of a game new to the process translated for ~0.2 s twice, now once.
* **The initial facts.** ``__init__`` then turns the task's initial atoms into ``Proposition``
  objects and reads the initial state back from the library (one 1 KB ``ctypes`` record per
  state variable, each name parsed again): ~7 ms per state, two states per reset, the same facts
  for every instance of a game. :func:`pddl_state_init` keeps both lists per translated task (the
  last ``INITIAL_FACTS_CACHE_SIZE``) and adds them in the same order, so the state's fact sets are
  built by the same insertions (their iteration order, which the grammar's texts follow, is the
  same). Everything else is TextWorld 1.7.0's ``__init__`` line for line, and it replaces
  TextWorld's only when that ``__init__`` is the one it was written from
  (``TEXTWORLD_STATE_INIT_SHA256``).
* **Collections of the cyclic garbage collector.** A translation allocates millions of objects, and
  CPython's collector runs its full collections over every object alive, so the more games a
  process holds (the translation caches, the envs' states) the longer each reset: over four
  rounds of 8 new games on 64 envs, 0.5 -> 2.7 s of a 3-8 s batch were collections.
  :func:`collector_paused` holds the collector off during a game's load and reset (what they
  leave is collected after, by the next collection).
* **The debug information in each library copy.** ``fast_downward.load_lib`` copies
  ``libdownward.so`` to a temporary file for every engine env (the library keeps its task in
  globals, and ``dlopen`` shares one file between callers). 32.7 of its 33.8 MB are DWARF sections
  the loader never maps: 128 envs wrote 4.3 GB, kept on disk while the process lives (the deleted
  copies stay mapped). :func:`loadable_library` is the file cut where its last segment ends, with
  the section header table dropped, as ``sstrip`` does (1.1 MB; the loaded bytes are the same);
  the copies are made from it.

:mod:`agentrl_env_alfworld.engine_caches` installs the ``PddlState`` and library parts with its
caches (one switch, ``AGENTRL_ALFWORLD_ENGINE_CACHES=0``, runs the engine as shipped);
:class:`~agentrl_env_alfworld.env.ALFWorldEnv` loads and resets games inside
:func:`collector_paused`.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import inspect
import os
import struct
import threading
import warnings
from collections import Counter, defaultdict
from typing import Any, Callable, Iterator, NamedTuple

INITIAL_FACTS_CACHE_SIZE = 64
# sha256 of inspect.getsource(PddlState.__init__) in textworld 1.7.0: the code pddl_state_init follows
TEXTWORLD_STATE_INIT_SHA256 = "e94c2d7361e302c7259e5acb6d1772e160bdaca531ee0499f324a5528b85a963"


class DeferredTranslation(str):
    """The optimised SAS text not made yet: an empty string that keeps what to translate."""

    def __new__(cls, domain: str, problem: str, verbose: bool) -> "DeferredTranslation":
        text = super().__new__(cls, "")
        text.request = (domain, problem, verbose)
        return text


class CacheInfo(NamedTuple):
    """What ``functools.lru_cache``'s ``cache_info()`` reports."""
    hits: int
    misses: int
    maxsize: int
    currsize: int


class InitialFacts(NamedTuple):
    declared: list      # the problem's initial atoms as Propositions (``task.init``), in order
    reached: list       # the library's initial state, negations left out, in order


def _initial_facts(task, downward_lib, name2type: dict) -> InitialFacts:
    """What TextWorld's ``PddlState.__init__`` adds to a new state, right after ``load_sas``."""
    import fast_downward
    from textworld.envs.pddl.logic import Atom
    from textworld.logic import Proposition, Variable

    def atom_to_proposition(atom):
        if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
            if atom.predicate == "=":
                return None
            return Proposition(atom.predicate, [Variable(arg, name2type[arg]) for arg in atom.args])
        if isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
            if atom.fluent.symbol == "total-cost":
                return None
            name = "{}".format(atom.expression.value)
            if str.isdigit(name):  # distance relations are left out
                return None
            return Proposition(name, [Variable(arg, name2type[arg]) for arg in atom.fluent.args])
        return None

    declared = [fact for fact in map(atom_to_proposition, task.init) if fact]
    atoms = (Atom * downward_lib.get_state_size())()
    downward_lib.get_state(atoms)
    reached = [fact for fact in (atom.get_fact(name2type) for atom in atoms) if not fact.is_negation]
    return InitialFacts(declared, reached)


def initial_facts_cache(maxsize: int) -> Callable:
    """``lookup(task, downward_lib, name2type)``: the task's :class:`InitialFacts`, read from the
    library (which must have just loaded the task's SAS text) the first time; the last ``maxsize``
    tasks (``lookup.cache_info()`` as ``functools.lru_cache`` gives it). Keyed by the task object:
    the engine caches hand every state of a game the same translated task, and a task translated
    anew is a new entry (an entry holds its task, so no other task can take its ``id``)."""
    cache: dict[int, tuple[Any, InitialFacts]] = {}
    counts = {"hits": 0, "misses": 0}
    lock = threading.Lock()

    def lookup(task, downward_lib, name2type: dict) -> InitialFacts:
        with lock:
            entry = cache.pop(id(task), None)
            if entry is None:
                counts["misses"] += 1
                entry = (task, _initial_facts(task, downward_lib, name2type))
            else:
                counts["hits"] += 1
            cache[id(task)] = entry             # most recent last
            while len(cache) > maxsize:
                del cache[next(iter(cache))]
            return entry[1]

    lookup.cache_info = lambda: CacheInfo(counts["hits"], counts["misses"], maxsize, len(cache))
    return lookup


def pddl_state_init(initial_facts: Callable) -> Callable:
    """``PddlState.__init__`` as in TextWorld 1.7.0, less the optimised translation and with the
    initial facts from ``initial_facts`` (:func:`initial_facts_cache`)."""
    import fast_downward
    import textworld.logic
    from textworld.utils import check_flag

    def __init__(self, downward_lib, pddl_problem: str, logic):
        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        verbose = check_flag("TW_PDDL_DEBUG")
        self.task, self.sas = fast_downward.pddl2sas(logic.domain, pddl_problem, verbose=verbose)
        self.sas_replan = DeferredTranslation(logic.domain, pddl_problem, verbose)
        self._actions = {a.name: a for a in self.task.actions}
        for type_ in self.task.types:
            try:
                self._logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
            except ValueError:
                pass
        self.downward_lib.load_sas(self.sas.encode("utf-8"))
        self.name2type = {o.name: o.type_name for o in self.task.objects}
        facts = initial_facts(self.task, self.downward_lib, self.name2type)
        self.add_facts(facts.declared)
        self.add_facts(facts.reached)

    __init__.cache_info = initial_facts.cache_info
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


# ----- the garbage collector held off ------------------------------------------------------------
_collector_lock = threading.Lock()
_collector_pauses = 0           # loads and resets running now, in any thread
_collector_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector disabled inside (``gc.disable``), and enabled again when the
    last of the threads inside leaves, if it was enabled when the first came in."""
    global _collector_pauses, _collector_was_enabled
    with _collector_lock:
        if _collector_pauses == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_pauses += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_pauses -= 1
            if _collector_pauses == 0 and _collector_was_enabled:
                gc.enable()


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


# ----- installed by engine_caches -----------------------------------------------------------------
def reset_replacements(translate: Callable) -> dict[str, tuple[Any, str, Any]]:
    """name -> (owner, attribute, new value) for :mod:`~agentrl_env_alfworld.engine_caches`
    (``translate``: its ``pddl2sas``). Each part is left out, with a warning, where TextWorld or the
    platform is not the one it was written for."""
    import fast_downward.interface as downward_interface
    import textworld.envs.pddl.logic as pddl_logic

    replacements: dict[str, tuple[Any, str, Any]] = {}
    state = pddl_logic.PddlState
    try:
        source = inspect.getsource(vars(state)["__init__"])
        if hashlib.sha256(source.encode()).hexdigest() != TEXTWORLD_STATE_INIT_SHA256:
            raise ValueError("it is not TextWorld 1.7.0's")
        replan = vars(state)["replan"]
    except (KeyError, OSError, TypeError, ValueError) as err:
        warnings.warn(f"alfworld: PddlState.__init__ left as shipped ({type(err).__name__}: {err}); a reset "
                      f"translates each new game twice", RuntimeWarning, stacklevel=3)
    else:
        lookup = initial_facts_cache(INITIAL_FACTS_CACHE_SIZE)
        replacements["PddlState.__init__"] = (state, "__init__", pddl_state_init(lookup))
        replacements["PddlState.replan"] = (state, "replan", replan_with_translation(replan, translate))
    try:
        library = loadable_library(downward_interface.DOWNWARD_LIB_PATH)
    except (OSError, ValueError, AttributeError) as err:
        warnings.warn(f"alfworld: Fast Downward's library is copied whole for every engine env "
                      f"({type(err).__name__}: {err})", RuntimeWarning, stacklevel=3)
    else:
        replacements["fast_downward.DOWNWARD_LIB_PATH"] = (downward_interface, "DOWNWARD_LIB_PATH", library)
    return replacements
