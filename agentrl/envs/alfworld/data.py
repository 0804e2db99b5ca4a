"""Where ALFWorld games come from: the official data, or a generated set cached per version.

Resolution order (:func:`resolve_data_dir`):

1. an explicit ``data_dir`` (must hold ``json_2.1.1/<split>/...``);
2. ``$ALFWORLD_DATA`` when it holds the official layout (``alfworld-download`` puts it there);
3. a generated set under ``$AGENTRL_CACHE_DIR/alfworld/<key>`` (default
   ``~/.cache/agentrl/alfworld/<key>``), created on first use. The key hashes the generator
   version, the ``alfworld`` version, the domain and grammar texts and the recipe (counts, seed),
   so a new engine or generator never reuses stale games.

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
import tempfile
import time

from agentrl.envs.alfworld.tasks import has_official_layout

# The generated set made on first use: small enough for CPU runs and tests, all six types per split.
DEFAULT_GENERATED_COUNTS = {"train": 144, "valid_seen": 36, "valid_unseen": 36}
DEFAULT_GENERATED_SEED = 0


def cache_root() -> str:
    base = os.environ.get("AGENTRL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "agentrl")
    return os.path.join(base, "alfworld")


def generated_set_key(counts: dict[str, int], seed: int) -> str:
    from importlib.metadata import version

    from agentrl.envs.alfworld.generate import GENERATOR_VERSION, game_logic

    logic = game_logic()
    payload = json.dumps({"generator": GENERATOR_VERSION, "alfworld": version("alfworld"),
                          "domain": hashlib.sha256(logic["pddl_domain"].encode()).hexdigest(),
                          "grammar": hashlib.sha256(logic["grammar"].encode()).hexdigest(),
                          "counts": dict(sorted(counts.items())), "seed": seed}, sort_keys=True)
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
                         workers: int | None = None, verbose: bool = True) -> str:
    """The directory of the generated set for ``(counts, seed)``, generating it if absent.

    Concurrent callers (several env processes) wait on a file lock; the set is written to a
    temporary directory and renamed into place, so a killed generation leaves nothing half-made.
    """
    from agentrl.envs.alfworld.generate import generate_dataset

    counts = dict(counts or DEFAULT_GENERATED_COUNTS)
    root = os.path.join(cache_root(), generated_set_key(counts, seed))
    if os.path.isfile(os.path.join(root, "COMPLETE")):
        return root
    with _file_lock(root + ".lock"):
        if os.path.isfile(os.path.join(root, "COMPLETE")):
            return root
        total = sum(counts.values())
        if verbose:
            print(f"agentrl: generating {total} ALFWorld games into {root} (first use; one time)",
                  flush=True)
        start = time.perf_counter()
        tmp = tempfile.mkdtemp(prefix=".partial-", dir=os.path.dirname(root))
        try:
            generate_dataset(tmp, counts, seed=seed, workers=workers)
            with open(os.path.join(tmp, "COMPLETE"), "w") as f:
                json.dump({"counts": counts, "seed": seed,
                           "seconds": round(time.perf_counter() - start, 1)}, f)
            if os.path.isdir(root):
                shutil.rmtree(root)
            os.replace(tmp, root)
        finally:
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        if verbose:
            print(f"agentrl: generated {total} ALFWorld games in {time.perf_counter() - start:.0f} s",
                  flush=True)
    return root


def resolve_data_dir(data_dir: str | None = None, generated_counts: dict[str, int] | None = None,
                     generated_seed: int = DEFAULT_GENERATED_SEED) -> str:
    """The root directory (holding ``json_2.1.1``) the env serves games from."""
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
    return ensure_generated_set(generated_counts, generated_seed)
