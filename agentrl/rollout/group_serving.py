"""A rollout worker's side of the group stream (``trainer.mode=async``): whole groups handed back as
they finish.

The driver (:class:`~agentrl.rollout.sources.streaming.StreamingRollout`) starts one ``serve`` call per
worker and numbers it (a *session*); ``add`` gives it groups (they may arrive before it starts),
``take`` hands back the ones finished, ``stop`` asks it to finish the groups it started and give back
the others. ``serve`` plays the groups in a :class:`~agentrl.rollout.group_pool.GroupPool`, each
started as soon as ``group_size`` env instances are free; its pool steps are rollouts for the
worker's :class:`~agentrl.rollout.weight_staging.WeightStaging` (weights that arrive meanwhile wait
for a step boundary).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from agentrl.generation.base import SamplingParams
from agentrl.rollout.engine import RolloutResult
from agentrl.rollout.group_pool import GroupPool
from agentrl.rollout.weight_staging import WeightStaging
from agentrl.runtime.denormals import flush_denormals


class GroupServing:
    """The inbox of groups given, the outbox of groups finished, and the stop of each session."""

    def __init__(self, engine: Any, staging: WeightStaging, extra_stats: Callable[[], dict[str, float]]):
        self.engine, self.staging, self.extra_stats = engine, staging, extra_stats
        self.condition = threading.Condition()
        self.inbox: list[tuple[int, Any]] = []              # (session, group spec)
        self.outbox: list[tuple[int, RolloutResult]] = []   # (session, finished group)
        self.stopped_session = 0     # serve calls up to this session number are asked to stop
        self.serving = False

    def serve(self, sampling: SamplingParams, group_size: int, seed: int, expert_guidance: bool = False,
              failure_block: int = 0, session: int = 1) -> list:
        """Play the groups :meth:`add` gives until :meth:`stop`; the groups given but not started (after
        finishing the ones that had started). A stop for this session that arrived first (the stop and
        this call run in different concurrency groups) still stops it; a stop for an older one does not."""
        flush_denormals()
        pool = GroupPool(self.engine, group_size, sampling, seed, expert_guidance=expert_guidance,
                         failure_block=failure_block)
        with self.condition:
            self.serving = True
        unstarted: list = []
        try:
            while True:
                with self.condition:
                    # this session's groups; an older session's leftovers go, a newer one's wait for it
                    pool.add([spec for owner, spec in self.inbox if owner == session])
                    self.inbox = [(owner, spec) for owner, spec in self.inbox if owner > session]
                    stopping = self.stopped_session >= session
                    if stopping:
                        unstarted += pool.take_waiting()
                    if not pool.busy and not pool.waiting:
                        if stopping:
                            break
                        self.condition.wait(timeout=0.2)
                        continue
                self.staging.begin()
                try:
                    finished = pool.step()
                finally:
                    if not pool.busy:
                        self.staging.end()
                        self.engine.mark("idle")
                if finished:
                    stats = {**pool.drain_stats(), **self.extra_stats()}
                    finished[0].stats = {**stats, **finished[0].stats}
                    with self.condition:
                        self.outbox.extend((session, result) for result in finished)
                        self.condition.notify_all()
            return unstarted
        finally:
            self.staging.end(load_staged=False)
            with self.condition:
                self.serving = False
                self.condition.notify_all()

    def add(self, specs: list, session: int = 1) -> None:
        """Groups (:class:`~agentrl.rollout.group_pool.GroupSpec`) for the :meth:`serve` call of ``session``."""
        with self.condition:
            self.inbox.extend((session, spec) for spec in specs)
            self.condition.notify_all()

    def take(self, wait_s: float, session: int = 1) -> list[RolloutResult]:
        """The groups of ``session`` finished since the last call, waiting up to ``wait_s`` for at least
        one (less when serving ends); an older session's leftovers are dropped."""
        deadline = time.monotonic() + wait_s

        def mine() -> bool:
            return any(owner == session for owner, _ in self.outbox)

        with self.condition:
            while not mine() and self.serving and time.monotonic() < deadline:
                self.condition.wait(timeout=max(0.0, deadline - time.monotonic()))
            taken = [result for owner, result in self.outbox if owner == session]
            self.outbox = [(owner, result) for owner, result in self.outbox if owner > session]
        return taken

    def stop(self, session: int = 1) -> None:
        """Ask :meth:`serve` of ``session`` (and older ones) to finish the groups it started and return
        the others."""
        with self.condition:
            self.stopped_session = max(self.stopped_session, int(session))
            self.condition.notify_all()


__all__ = ["GroupServing"]
