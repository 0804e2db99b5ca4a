"""A process pool of ALFWorld envs: the engine is slow per step, so steps run on all cores.

Each worker process hosts several :class:`ALFWorldEnv` instances (env ``i`` lives on worker
``i % workers``) and serves batched ``reset``/``step`` requests over a pipe; the parent sends one
message per worker and then collects the answers, so the workers step in parallel. The number of
workers defaults to the number of cores (capped by the number of envs).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from typing import Any

from agentrl.envs.base import TaskRef


def _worker(conn, env_kwargs: dict, env_ids: list[int]) -> None:
    from agentrl.envs.alfworld.env import ALFWorldEnv

    envs = {i: ALFWorldEnv(**env_kwargs) for i in env_ids}
    while True:
        kind, payload = conn.recv()
        if kind == "close":
            conn.close()
            return
        try:
            if kind == "reset":
                result = [(i, envs[i].reset(task)) for i, task in payload]
            elif kind == "step":
                result = [(i, envs[i].step(action)) for i, action in payload]
            elif kind == "expert":
                result = [(i, envs[i].expert_actions()) for i in payload]
            else:
                raise ValueError(f"unknown request {kind!r}")
            conn.send(("ok", result))
        except Exception as err:  # report, keep serving
            conn.send(("error", f"{type(err).__name__}: {err}"))


class ALFWorldPool:
    """``num_envs`` ALFWorld envs spread over ``workers`` processes."""

    def __init__(self, num_envs: int, workers: int | None = None, **env_kwargs: Any):
        from agentrl.envs.alfworld.data import resolve_data_dir

        if num_envs <= 0:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        # resolve (and generate, if needed) once here, not in every worker
        generation = {key: env_kwargs.pop(key) for key in list(env_kwargs) if key.startswith("generated_")}
        env_kwargs["data_dir"] = resolve_data_dir(env_kwargs.get("data_dir"), **generation)
        self.num_envs = num_envs
        self.workers = max(1, min(workers or os.cpu_count() or 1, num_envs))
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(method)
        self._conns, self._procs = [], []
        for w in range(self.workers):
            parent, child = ctx.Pipe()
            ids = list(range(w, num_envs, self.workers))
            proc = ctx.Process(target=_worker, args=(child, env_kwargs, ids), daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def _call(self, kind: str, items: list[tuple[int, Any]] | list[int]) -> dict[int, Any]:
        per_worker: dict[int, list] = {}
        for item in items:
            env_id = item[0] if isinstance(item, tuple) else item
            per_worker.setdefault(env_id % self.workers, []).append(item)
        for w, payload in per_worker.items():
            self._conns[w].send((kind, payload))
        results: dict[int, Any] = {}
        errors = []
        for w in per_worker:
            status, value = self._conns[w].recv()
            if status == "ok":
                results.update(dict(value))
            else:
                errors.append(f"worker {w}: {value}")
        if errors:
            raise RuntimeError("; ".join(errors))
        return results

    def reset(self, tasks: dict[int, TaskRef]) -> dict[int, tuple[str, dict]]:
        """Reset the given envs (``{env_id: TaskRef}``); returns ``{env_id: (obs, info)}``."""
        return self._call("reset", list(tasks.items()))

    def step(self, actions: dict[int, str]) -> dict[int, tuple]:
        """Step the given envs (``{env_id: action}``); returns ``{env_id: step tuple}``."""
        return self._call("step", list(actions.items()))

    def expert_actions(self, env_ids: list[int]) -> dict[int, list[str]]:
        return self._call("expert", list(env_ids))

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs):
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        self._conns, self._procs = [], []

    def __enter__(self) -> "ALFWorldPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def benchmark(workers: int, data_dir: str | None, split: str = "valid_seen", episodes: int = 6,
              steps: int = 20, seed: int = 0) -> dict[str, Any]:
    """Random admissible play on ``workers`` envs, one per process; steps/s and resets/s overall.

    Step time and reset time (loading a game) are timed separately; both are wall-clock over the
    whole pool, so with ``workers`` processes they count the steps of all of them.
    """
    from agentrl.envs.alfworld.data import resolve_data_dir
    from agentrl.envs.alfworld.tasks import list_split_games

    data_dir = resolve_data_dir(data_dir)
    n_games = len(list_split_games(data_dir, split))
    rng = random.Random(seed)
    total_steps = total_resets = 0
    reset_seconds = step_seconds = 0.0
    start = time.perf_counter()
    with ALFWorldPool(workers, workers=workers, data_dir=data_dir) as pool:
        for episode in range(episodes):
            tasks = {i: TaskRef(split, (episode * workers + i) % n_games) for i in range(workers)}
            t0 = time.perf_counter()
            infos = {i: info for i, (_, info) in pool.reset(tasks).items()}
            reset_seconds += time.perf_counter() - t0
            total_resets += workers
            active = set(infos)
            for _ in range(steps):
                if not active:
                    break
                actions = {i: rng.choice(infos[i]["admissible_actions"]) for i in sorted(active)}
                t0 = time.perf_counter()
                results = pool.step(actions)
                step_seconds += time.perf_counter() - t0
                total_steps += len(actions)
                for i, (_, _, term, trunc, info) in results.items():
                    infos[i] = info
                    if term or trunc:
                        active.discard(i)
    return {"workers": workers, "steps": total_steps, "resets": total_resets,
            "steps_per_s": total_steps / step_seconds if step_seconds else 0.0,
            "resets_per_s": total_resets / reset_seconds if reset_seconds else 0.0,
            "seconds": time.perf_counter() - start, "split": split}
