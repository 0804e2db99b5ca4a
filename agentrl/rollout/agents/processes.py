"""Agents in processes of their own (``rollout.agent_processes=N``), instead of threads of the rollout
worker.

Why: an agent's own work per model call (its HTTP client, the ``openai`` package's request and
response models, its prompt building) is a few milliseconds of Python. In threads of the worker, 128
agents and the gateway share one interpreter lock with the engine's batching thread, so the engine
waits for the agents and every call costs more (``agentrl bench gateway --agent-processes``). In N
spawned processes the agents run beside the engine on other cores.

Each process takes episodes from a queue of its own (round-robin) and plays each in a thread, as
the worker would; the outcome (the agent's return value, or its error) comes back on one result
queue. The episode's environment stays in the worker: the agent's ``task.env`` is a
:class:`RemoteEnv` that steps it through the gateway (``POST /agentrl/env/{reset,step}`` with the
episode's key), so the environment servers, their clients and the transcripts are the same as
with threads. A process that dies fails the episodes it was playing; the others go on.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import orjson

from agentrl.rollout.agents.task import AgentError, AgentTask, load_agent


class RemoteEnv:
    """``task.env`` in an agent process: the worker's environment instance for the episode, reached
    through the gateway with the episode's key (``reset()``, ``step(action)`` as :class:`EnvSession`)."""

    def __init__(self, base_url: str, key: str, timeout: float | None = None):
        self.url = base_url.rsplit("/v1", 1)[0] + "/agentrl/env/"
        self.key, self.timeout = key, timeout

    def _post(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(self.url + what, data=orjson.dumps(body), method="POST",
                                         headers={"Authorization": f"Bearer {self.key}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                return orjson.loads(reply.read())
        except urllib.error.HTTPError as err:
            raise AgentError(f"env {what} failed: {err.read().decode(errors='replace')[:500]}") from None

    def reset(self) -> tuple[str, dict[str, Any]]:
        out = self._post("reset", {})
        return out["obs"], out["info"]

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        out = self._post("step", {"action": action})
        return out["obs"], float(out["reward"]), bool(out["done"]), out["info"]


def _child(spec: str, jobs: Any, results: Any) -> None:
    """An agent process: play each episode it is given in a thread of its own."""
    agent = load_agent(spec)

    def play(job: int, task: AgentTask) -> None:
        try:
            value = agent(task)
            try:
                results.put((job, "value", pickle.dumps(value)))
            except Exception as err:  # noqa: BLE001 - an outcome that does not pickle fails its episode
                results.put((job, "error", f"the agent's return value cannot be sent back: {err}"))
        except BaseException as err:  # noqa: BLE001 - the episode fails, the run goes on
            results.put((job, "error", f"{type(err).__name__}: {err}"))

    while True:
        item = jobs.get()
        if item is None:
            return
        threading.Thread(target=play, args=item, name=f"agent-job-{item[0]}", daemon=True).start()


class AgentRun:
    """One episode played in an agent process: ``join``/``is_alive`` as a thread's, the outcome in ``box``."""

    def __init__(self, process: int):
        self.process, self.box, self.done = process, {}, threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self.done.wait(timeout)

    def is_alive(self) -> bool:
        return not self.done.is_set()


class AgentProcesses:
    """``n`` spawned processes playing episodes of the agent ``spec`` (module docstring)."""

    def __init__(self, spec: str, n: int):
        self._spec = spec
        context = multiprocessing.get_context("spawn")     # no fork of a process with threads and a model
        self._results = context.Queue()
        self._jobs = [context.Queue() for _ in range(n)]
        self._processes = [context.Process(target=_child, args=(spec, jobs, self._results), daemon=True,
                                           name=f"agentrl-agents-{i}") for i, jobs in enumerate(self._jobs)]
        for process in self._processes:
            process.start()
        self._runs: dict[int, AgentRun] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="agent-results", daemon=True)
        self._reader.start()

    def start(self, task: AgentTask) -> AgentRun:
        """Play ``task`` (its ``env`` a :class:`RemoteEnv` or None) in the next process."""
        with self._lock:
            job, self._next = self._next, self._next + 1
            run = self._runs[job] = AgentRun(job % len(self._processes))
        self._jobs[run.process].put((job, task))
        return run

    def _read(self) -> None:
        checked = time.monotonic()
        while not self._closed:
            if time.monotonic() - checked > 0.5:
                self._check_processes()
                checked = time.monotonic()
            try:
                job, kind, payload = self._results.get(timeout=0.5)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            with self._lock:
                run = self._runs.pop(job, None)
            if run is None:
                continue
            if kind == "value":
                try:
                    run.box["value"] = pickle.loads(payload)
                except Exception as err:  # noqa: BLE001
                    run.box["error"] = f"the agent's return value cannot be read: {err}"
            else:
                run.box["error"] = payload
            run.done.set()

    def _check_processes(self) -> None:
        """Episodes of a process that died fail (the process is started again for later episodes)."""
        for i, process in enumerate(self._processes):
            if process.is_alive() or self._closed:
                continue
            with self._lock:
                lost = [job for job, run in self._runs.items() if run.process == i]
                runs = [self._runs.pop(job) for job in lost]
            for run in runs:
                run.box["error"] = f"the agent process died (exit code {process.exitcode})"
                run.done.set()
            context = multiprocessing.get_context("spawn")
            self._jobs[i] = context.Queue()
            self._processes[i] = context.Process(target=_child, args=(self._spec, self._jobs[i], self._results),
                                                 daemon=True, name=process.name)
            self._processes[i].start()

    def cpu_seconds(self) -> float:
        """CPU time the agent processes have used so far (user + system)."""
        import psutil

        total = 0.0
        for process in self._processes:
            try:
                times = psutil.Process(process.pid).cpu_times()
                total += times.user + times.system
            except (psutil.Error, TypeError):
                pass
        return total

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for jobs in self._jobs:
            jobs.put(None)
        for process in self._processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()        # agents still playing (hung): their keys are closed already
        self._reader.join(timeout=2)


__all__ = ["AgentProcesses", "AgentRun", "RemoteEnv"]
