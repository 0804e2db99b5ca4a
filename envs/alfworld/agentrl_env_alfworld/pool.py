"""A process pool of ALFWorld envs: the engine is slow per step, so steps run on all cores.

Each worker process hosts several :class:`ALFWorldEnv` instances (env ``i`` lives on worker
``i % workers``) and serves batched ``reset``/``step`` requests over a pipe; the parent sends one
message per worker and then collects the answers, so the workers step in parallel. The number of
workers defaults to the number of cores (capped by the number of envs). ``agentrl bench
alfworld-steps`` measures its steps/s.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

from agentrl.envs.base import TaskRef


def _worker(conn, env_kwargs: dict, env_ids: list[int]) -> None:
    from agentrl_env_alfworld.env import ALFWorldEnv

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
        from agentrl_env_alfworld.data import resolve_data_dir

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

