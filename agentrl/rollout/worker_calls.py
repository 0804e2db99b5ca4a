"""A rollout call in flight on the Ray rollout workers, and the watch for workers that hang.

The workers' Ray concurrency groups are named here too: weight loads and status requests reach a
worker in ``weights`` while a rollout call runs; ``stream`` feeds a serving worker groups and takes
them back (:mod:`agentrl.rollout.workers`)."""

from __future__ import annotations

import time
from typing import Any, Sequence

from agentrl.rollout.engine import RolloutResult

WEIGHTS_GROUP = "weights"   # the Ray concurrency group of weight loads: they reach a worker during a rollout
STREAM_GROUP = "stream"     # the Ray concurrency group that feeds a serving worker groups and takes them back
STATUS_TIMEOUT_S = 30.0     # at most this long for a status answer (at least 5 s, else the hang timeout)


class RolloutHangError(RuntimeError):
    """A rollout worker made no progress for ``rollout.hang_timeout_s`` (or did not answer at all)."""


class PendingRollout:
    """A rollout call in flight on the workers (:meth:`RolloutWorkerGroup.submit`).

    :meth:`result` watches the workers while it waits: one that has made no progress for
    ``hang_timeout_s`` (no generate call, env step or reset finished; see ``RolloutEngine.mark``),
    or that does not answer a status request, raises :class:`RolloutHangError` naming the worker,
    its node and process, and what it was doing with which env instances."""

    def __init__(self, calls: list, submitted_at: float, workers: Sequence[tuple[int, Any]] = (),
                 hang_timeout_s: float = 0.0):
        self.calls = calls
        self.submitted_at = submitted_at
        self.workers = list(workers)        # (index, actor) of each call, in the same order
        self.hang_timeout_s = hang_timeout_s

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait(self.calls, num_returns=len(self.calls), timeout=0)
        return len(ready) == len(self.calls)

    def result(self) -> RolloutResult:
        """The merged result (waits for every worker's part); ``stats["wall_s"]``: from submission on."""
        import ray

        if self.hang_timeout_s > 0 and self.workers:
            poll = min(30.0, max(0.5, self.hang_timeout_s / 4))
            while True:
                _, waiting = ray.wait(self.calls, num_returns=len(self.calls), timeout=poll)
                if not waiting:
                    break
                self.check_progress([self.workers[self.calls.index(ref)] for ref in waiting])
        result = RolloutResult.merge(ray.get(self.calls))
        result.stats["wall_s"] = time.perf_counter() - self.submitted_at
        return result

    def check_progress(self, workers: Sequence[tuple[int, Any]]) -> None:
        check_progress(workers, self.hang_timeout_s)


def check_progress(workers: Sequence[tuple[int, Any]], hang_timeout_s: float) -> None:
    """Raise :class:`RolloutHangError` for the first of ``workers`` (index, actor) that made no progress
    for ``hang_timeout_s`` while rolling out, or that does not answer a status request."""
    import ray

    asked = [actor.status.options(concurrency_group=WEIGHTS_GROUP).remote() for _, actor in workers]
    answer_s = min(STATUS_TIMEOUT_S, max(5.0, hang_timeout_s))
    ready, _ = ray.wait(asked, num_returns=len(asked), timeout=answer_s)
    for (index, _), ref in zip(workers, asked):
        if ref not in ready:
            raise RolloutHangError(
                f"rollout worker {index} did not answer a status request within {answer_s:.0f} s (its process "
                "is stopped or stuck in native code); check that node's processes and GPU")
        status = ray.get(ref)
        if status["rolling_out"] and status["for_s"] > hang_timeout_s:
            raise RolloutHangError(
                f"rollout worker {index} (node {status['node']}, pid {status['pid']}) made no progress for "
                f"{status['for_s']:.1f} s, more than rollout.hang_timeout_s={hang_timeout_s:g}: "
                f"{status['doing']}")


__all__ = ["PendingRollout", "RolloutHangError", "STATUS_TIMEOUT_S", "STREAM_GROUP", "WEIGHTS_GROUP", "check_progress"]
