"""Where ALFWorld games come from: the official data, or a generated set cached per version.

Resolution order (:func:`resolve_data_dir`):

1. an explicit ``data_dir`` (must hold ``json_2.1.1/<split>/...``);
2. ``$ALFWORLD_DATA`` when it holds the official layout (``alfworld-download`` puts it there);
3. a generated set under ``$AGENTRL_CACHE_DIR/alfworld/<key>`` (default
   ``~/.cache/agentrl/alfworld/<key>``), created on first use. The key hashes the generator
   version, the ``alfworld`` version, the domain and grammar texts and the recipe (counts, seed,
   and the solver, room kinds and task families when they are not the defaults), so a new engine
   or generator never reuses stale games.

Importing the ``alfworld`` package sets ``ALFWORLD_DATA`` to ``~/.cache/alfworld`` when it is
unset, so the variable alone does not mean the data is there: the layout is checked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time

from agentrl_env_alfworld.tasks import has_official_layout

# The generated set made on first use: small enough for CPU runs and tests, all six types per split.
DEFAULT_GENERATED_COUNTS = {"train": 144, "valid_seen": 36, "valid_unseen": 36}
DEFAULT_GENERATED_SEED = 0
DEFAULT_GENERATED_SOLVER = "expert"


def generation_options(solver: str = DEFAULT_GENERATED_SOLVER, rooms=None, task_types=None) -> dict:
    """The generator's options beyond counts and seed, checked and in canonical form (tuples without
    repeats, ``None`` for "all"; task families keep their order, which deals them to the games):
    env kwargs ``generated_solver``, ``generated_rooms`` and
    ``generated_task_types`` select the solver whose walkthroughs are stored and restrict the
    room kinds and task families of a generated set."""
    from agentrl_env_alfworld.generate import SOLVERS
    from agentrl_env_alfworld.scenes import ROOM_KINDS
    from agentrl_env_alfworld.tasks import TASK_TYPES

    def checked(values, allowed, key):
        if values is None:
            return None
        values = (values,) if isinstance(values, str) else tuple(values)
        unknown = sorted(set(values) - set(allowed))
        if unknown or not values:
            raise ValueError(f"env.kwargs.{key}: unknown {unknown or 'empty list'}; choose from {list(allowed)} "
                             "or leave it unset for all")
        return tuple(dict.fromkeys(values))

    if solver not in SOLVERS:
        raise ValueError(f"env.kwargs.generated_solver: unknown solver {solver!r}; choose from {list(SOLVERS)}")
    return {"solver": solver, "rooms": checked(rooms, ROOM_KINDS, "generated_rooms"),
            "task_types": checked(task_types, TASK_TYPES, "generated_task_types")}


def cache_root() -> str:
    base = os.environ.get("AGENTRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "agentrl")
    return os.path.join(base, "alfworld")


def generated_set_key(counts: dict[str, int], seed: int, options: dict | None = None) -> str:
    from importlib.metadata import version

    from agentrl_env_alfworld.generate import GENERATOR_VERSION
    from agentrl_env_alfworld.scenes import game_logic

    logic = game_logic()
    fields = {"generator": GENERATOR_VERSION, "alfworld": version("alfworld"),
              "domain": hashlib.sha256(logic["pddl_domain"].encode()).hexdigest(),
              "grammar": hashlib.sha256(logic["grammar"].encode()).hexdigest(),
              "counts": dict(sorted(counts.items())), "seed": seed}
    # only options that differ from the defaults enter the key, so sets made before they existed keep theirs
    defaults = generation_options()
    fields.update({k: v for k, v in (options or defaults).items() if v != defaults[k]})
    payload = json.dumps(fields, sort_keys=True)
    return f"gen{GENERATOR_VERSION}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def _file_lock(path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_generated_set(counts: dict[str, int] | None = None, seed: int = DEFAULT_GENERATED_SEED,
                         workers: int | None = None, verbose: bool = True, options: dict | None = None) -> str:
    """The directory of the generated set for ``(counts, seed, options)`` (options: see
    :func:`generation_options`), generating it if absent.

    Concurrent callers (several env processes) wait on a file lock; the set is written to
    ``<dir>.partial`` and renamed into place when complete, so a killed generation leaves no
    half-made set, and the next call resumes it (finished games are kept, see
    :func:`agentrl_env_alfworld.generate.generate_games`).
    """
    from agentrl_env_alfworld.generate import generate_games

    counts = dict(counts or DEFAULT_GENERATED_COUNTS)
    options = options or generation_options()
    root = os.path.join(cache_root(), generated_set_key(counts, seed, options))
    if os.path.isfile(os.path.join(root, "COMPLETE")):
        return root
    with _file_lock(root + ".lock"):
        if os.path.isfile(os.path.join(root, "COMPLETE")):
            return root
        total = sum(counts.values())
        tmp = root + ".partial"
        if verbose:
            resumed = " (resuming an interrupted generation)" if os.path.isdir(tmp) else ""
            print(f"agentrl: generating {total} ALFWorld games into {root} (first use; one time){resumed}",
                  flush=True)
        start = time.perf_counter()
        generate_games(tmp, counts, seed=seed, workers=workers, **options)
        with open(os.path.join(tmp, "COMPLETE"), "w") as f:
            json.dump({"counts": counts, "seed": seed, **options,
                       "seconds": round(time.perf_counter() - start, 1)}, f)
        if os.path.isdir(root):
            shutil.rmtree(root)
        os.replace(tmp, root)
        if verbose:
            print(f"agentrl: generated {total} ALFWorld games in {time.perf_counter() - start:.0f} s",
                  flush=True)
    return root


def resolve_data_dir(data_dir: str | None = None, generated_counts: dict[str, int] | None = None,
                     generated_seed: int = DEFAULT_GENERATED_SEED, generated_solver: str = DEFAULT_GENERATED_SOLVER,
                     generated_rooms=None, generated_task_types=None) -> str:
    """The root directory (holding ``json_2.1.1``) the env serves games from."""
    options = generation_options(generated_solver, generated_rooms, generated_task_types)
    if data_dir is not None:
        data_dir = os.path.expanduser(os.path.expandvars(data_dir))
        if not has_official_layout(data_dir):
            raise FileNotFoundError(
                f"{data_dir} does not hold ALFWorld games (expected {data_dir}/json_2.1.1/"
                "{train,valid_seen,valid_unseen}/...); generate some with "
                "`agentrl envs alfworld generate --out DIR`")
        return data_dir
    env_dir = os.environ.get("ALFWORLD_DATA")
    if env_dir and has_official_layout(os.path.expanduser(env_dir)):
        return os.path.expanduser(env_dir)
    return ensure_generated_set(generated_counts, generated_seed, options=options)
