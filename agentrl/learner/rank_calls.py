"""Waiting for a call that every learner rank runs, with a bound on a rank that never returns.

A learner call (``update``, ``save_checkpoint``, ...) is collective: every rank runs it, and the
ranks meet in the process group's collectives. A rank whose process is stopped (SIGSTOP, a swapping
machine, a wedged driver) or stuck outside the collectives never comes; the others wait in a
collective for ``learner.collective_timeout_s`` and then fail with the process group's timeout
(:func:`agentrl.learner.distributed.init_process_group`). :func:`wait_for_ranks` turns that into one
line naming the rank(s) that did not return, instead of waiting for them forever:

* a rank failed with a collective timeout and others have not returned ``min(5 s, timeout)``
  later (the other waiting ranks time out at about the same moment);
* a rank returned and others have not returned ``learner.collective_timeout_s`` later (a rank that
  stopped after the call's last collective: no peer waits for it, so no collective times out).

Any other failure (an exception on a rank, a rank's process or node lost) is raised at once, as
``ray.get`` would, without waiting for the ranks still running.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Sequence

HUNG_PEER_GRACE_S = 5.0     # after a rank's collective timed out: how long the other ranks may take to come back
TIMEOUT_TEXT = re.compile(r"timed out|timeout", re.IGNORECASE)


class LearnerHangError(RuntimeError):
    """A learner rank did not return from a collective call (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class RankPlace:
    """Where a learner rank's process runs: its node's address, its node's custom resources, its pid."""

    rank: int
    node: str
    resources: tuple[str, ...]
    pid: int

    def describe(self) -> str:
        placed = f" [{', '.join(self.resources)}]" if self.resources else ""
        return f"{self.rank} (node {self.node}{placed}, pid {self.pid})"


def describe_ranks(places: Sequence[RankPlace]) -> str:
    """``learner rank 1 (node ..., pid ...)``, or ``learner ranks 1 (...) and 2 (...)``."""
    parts = [p.describe() for p in places]
    return ("learner rank " if len(parts) == 1 else "learner ranks ") + " and ".join(parts)


def is_collective_timeout(error: BaseException) -> bool:
    """Whether a rank's error is its process group's timeout (gloo: "Timed out waiting ... for recv",
    "Application timeout caused pair closure"; NCCL with blocking wait: "... collective operation timeout")."""
    from ray.exceptions import RayActorError

    if isinstance(error, RayActorError):
        return False
    cause = getattr(error, "cause", None) or error
    return bool(TIMEOUT_TEXT.search(str(cause)))


def wait_for_ranks(refs: Sequence[Any], places: Sequence[RankPlace], method: str, timeout_s: float) -> list[Any]:
    """The results of one call per rank (``refs[i]`` on ``places[i]``), in rank order; raises
    :class:`LearnerHangError` naming the ranks that did not return (see the module docstring)."""
    import ray

    started = time.monotonic()
    index_of = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    deadline = None
    why = ""
    timed_out: list[BaseException] = []     # the ranks' collective timeouts
    while pending:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=wait_s)
        if not ready:
            hung = sorted(index_of[ref] for ref in pending)
            raise LearnerHangError(
                f"{describe_ranks([places[i] for i in hung])} did not return from {method} in "
                f"{time.monotonic() - started:.1f} s: {why} (learner.collective_timeout_s={timeout_s:g}); "
                f"{'its process is' if len(hung) == 1 else 'their processes are'} stopped or stuck outside the "
                "learner's collectives")
        index = index_of[ready[0]]
        try:
            results[index] = ray.get(ready[0])
        except Exception as err:  # noqa: BLE001 - a rank's failure, raised below unless its peer hung
            if not is_collective_timeout(err):
                raise
            if not timed_out:
                deadline = min(deadline or float("inf"), time.monotonic() + min(HUNG_PEER_GRACE_S, timeout_s))
                why = f"rank {index} timed out waiting for a peer in a collective"
            timed_out.append(err)
            continue
        if deadline is None:
            deadline = time.monotonic() + timeout_s
            why = f"rank {index} had returned {timeout_s:g} s earlier"
    if timed_out:       # every rank came back: a rank's collective timeout is its own error
        raise timed_out[0]
    return results


__all__ = ["HUNG_PEER_GRACE_S", "LearnerHangError", "RankPlace", "describe_ranks", "is_collective_timeout",
           "wait_for_ranks"]
