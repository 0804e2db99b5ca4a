"""Episodes of agents behind the gateway: each holds its key, its budget, and one recorded step per chat
call (what the learner trains on), and the batcher that puts many agents' calls into one engine call.

A step is the call's prompt ids (token-in/token-out: :mod:`agentrl.gateway.conversation`), the ids the
engine sampled and their log-probs, the policy version that sampled them, the request's messages, and
its anchor state: the observation that the step-level estimators group steps by (the last user or
tool message, or the ``agentrl.anchor`` the agent sends with the request).
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Sequence

from agentrl.gateway.conversation import SampledReply
from agentrl.generation.base import GenerationBackend, SamplingParams


@dataclass
class GatewayStep:
    """One chat call of an episode."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    policy_version: int
    anchor: str
    messages: list[dict[str, Any]]
    tokenized: list[bool]                  # per message: tokenized here (not the sampled ids)
    token_in_token_out: bool
    finish_reason: str                     # stop, length or tool_calls
    invalid_tool_calls: int = 0
    seconds: float = 0.0


@dataclass
class GatewayEpisode:
    """What one agent run did through its key."""

    key: str
    label: str = ""
    max_calls: int | None = None           # calls beyond this are refused (the episode fails)
    max_tokens: int | None = None          # prompt + generated tokens of one call beyond this are refused
    steps: list[GatewayStep] = field(default_factory=list)
    sampled: list[SampledReply] = field(default_factory=list)
    failure: str | None = None             # why the episode is failed (a budget, a malformed request, ...)
    closed: bool = False
    env: Any = None                        # the episode's EnvSession, stepped for an agent in a process of its own
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason


class EpisodeRegistry:
    """Episode keys handed to agents (``Authorization: Bearer <key>``), looked up per call."""

    def __init__(self) -> None:
        self._episodes: dict[str, GatewayEpisode] = {}
        self._lock = threading.Lock()

    def open(self, label: str = "", max_calls: int | None = None, max_tokens: int | None = None) -> GatewayEpisode:
        episode = GatewayEpisode("ep-" + secrets.token_urlsafe(18), label, max_calls, max_tokens)
        with self._lock:
            self._episodes[episode.key] = episode
        return episode

    def get(self, key: str) -> GatewayEpisode | None:
        with self._lock:
            return self._episodes.get(key)

    def close(self, key: str) -> GatewayEpisode:
        """The episode, no longer accepting calls: its steps are final (a call still running when it
        closes is refused when it tries to record its step, under the episode's lock)."""
        with self._lock:
            episode = self._episodes.pop(key)
        with episode.lock:
            episode.closed = True
        return episode

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)


def anchor_of(messages: Sequence[dict[str, Any]], given: Any = None) -> str:
    """The step's anchor state: ``given`` (the agent's ``agentrl.anchor``), else the last user or tool
    message's text."""
    if isinstance(given, str) and given:
        return given
    for message in reversed(messages):
        if message.get("role") in ("user", "tool"):
            return message.get("content") or ""
    return ""


class EnvCallError(RuntimeError):
    """An episode's environment call (``GatewayEpisode.env``) failed: the gateway answers 502 ``env_error``."""


class EngineError(RuntimeError):
    """A request's engine call failed (the backend raised): answered as a server error."""


class Batcher:
    """Generation calls of many requests put together, on a thread of their own (the backend is not
    thread-safe): at most ``max_batch`` requests, collected while they keep coming (each within ``wait_s``
    of the previous one, for at most ``max_wait_s``) and sent at once when every agent that may call is
    waiting (``expected``: the rollout's agents still playing), go into one ``backend.generate_each``
    call where the backend samples per request (vLLM), else into one ``backend.generate`` call per
    sampling setting. Waiting longer for stragglers measured slower (``agentrl bench
    gateway``: the engine then idles while the agents work)."""

    def __init__(self, backend: GenerationBackend, max_batch: int = 256, wait_s: float = 0.005, seed: int = 0,
                 max_wait_s: float = 0.25):
        self.backend, self.max_batch, self.wait_s, self.max_wait_s = backend, int(max_batch), float(wait_s), max_wait_s
        #: how many requests may come at most (the agents still playing; 0: unknown): a batch that has them
        #: all goes at once
        self.expected: Any = lambda: 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.calls = 0          # engine calls so far
        self.next_seed = int(seed)
        #: called before each engine call (the rollout worker loads weights that arrived meanwhile)
        self.before_generate: Any = None
        #: the policy version the backend runs (read after before_generate; stamped on each result)
        self.version: Any = lambda: 0
        self.requests = 0       # requests they served
        #: the first exception an engine call raised (the engine's fault, not an agent's: the rollout
        #: engine raises it after the wave)
        self.error: Exception | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gateway-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, seeded: bool = False) -> Future:
        """A request's ``(generation, policy version)``, as a future. Unless ``seeded`` (the request named its seed) its seed is
        the batcher's: requests of one engine call sample with consecutive seeds, as the rollout's do. A
        named seed is used as given where the backend samples per request (vLLM: the same request with
        the same seed gives the same tokens), else it is the seed of the engine call that the requests
        naming it share."""
        future: Future = Future()
        self._queue.put((prompt_ids, sampling, seeded, future))
        return future

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            # collect while requests keep coming (each arrival waits wait_s more, up to max_wait_s in all)
            # or until every agent that may call is waiting (expected())
            start = time.monotonic()
            while len(batch) < min(self.max_batch, self.expected() or self.max_batch):
                timeout = min(self.wait_s, start + self.max_wait_s - time.monotonic())
                if timeout <= 0:
                    break
                try:
                    item = self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            if getattr(self.backend, "per_request_sampling", False):
                # one call, each request with its own settings: a named seed as given, the others the
                # batcher's next seeds in order
                samplings = []
                for _, sampling, seeded, _ in batch:
                    if not seeded:
                        sampling = sampling.with_seed(self.next_seed)
                        self.next_seed += 1
                    samplings.append(sampling)
                self._call([(p, f) for p, _, _, f in batch],
                           lambda prompts: self.backend.generate_each(prompts, samplings))
                continue
            groups: dict[tuple[SamplingParams, bool], list[tuple[list[int], Future]]] = {}
            for prompt_ids, sampling, seeded, future in batch:
                groups.setdefault((sampling if seeded else sampling.with_seed(0), seeded), []).append(
                    (prompt_ids, future))
            for (sampling, seeded), members in groups.items():
                if not seeded:
                    sampling = sampling.with_seed(self.next_seed)
                    self.next_seed += len(members)
                self._call(members, lambda prompts, sampling=sampling: self.backend.generate(prompts, sampling))

    def _call(self, members: list[tuple[list[int], Future]], generate) -> None:
        """One engine call for ``members`` (prompt ids, future): weights that arrived are loaded first; an
        engine failure is kept in :attr:`error` and handed to each waiting request."""
        try:
            if self.before_generate is not None:
                self.before_generate()
            version = self.version()
            generations = generate([p for p, _ in members])
        except Exception as err:  # noqa: BLE001 - handed to each waiting request
            if self.error is None:
                self.error = err
            for _, future in members:
                future.set_exception(EngineError(f"the generation engine failed: {type(err).__name__}: {err}"))
            return
        self.calls += 1
        self.requests += len(members)
        for (_, future), generation in zip(members, generations):
            future.set_result((generation, version))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)


__all__ = ["Batcher", "EngineError", "EpisodeRegistry", "GatewayEpisode", "GatewayStep", "anchor_of"]
