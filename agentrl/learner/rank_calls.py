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
  stopped after the call's last collective: no peer waits for it, so no collective times out);
* a rank's process ended while others still run, and no Ray node is lost within ``died_wait_s``
  (45 s, as long as a lost node may take to be marked dead): NCCL's watchdog ends a rank that waited
  ``learner.collective_timeout_s`` in a collective, so the rank still running is the one it waited for.
  A lost node raises the rank's ``RayActorError`` (the trainer names the node), as does a rank
  process that ended once every other rank has come back.

Any other failure (an exception on a rank) is raised at once, as ``ray.get`` would, without waiting
for the ranks still running.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, Sequence

from agentrl.runtime.ray_start import NODE_DEATH_WAIT_S, lost_nodes

HUNG_PEER_GRACE_S = 5.0     # after a rank's collective timed out: how long the other ranks may take to come back
NODE_POLL_S = 1.0           # after a rank's process ended: how often Ray's node list is read
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


def wait_for_ranks(refs: Sequence[Any], places: Sequence[RankPlace], method: str, timeout_s: float,
                   died_wait_s: float = NODE_DEATH_WAIT_S) -> list[Any]:
    """The results of one call per rank (``refs[i]`` on ``places[i]``), in rank order; raises
    :class:`LearnerHangError` naming the ranks that did not return (see the module docstring)."""
    import ray
    from ray.exceptions import RayActorError

    started = time.monotonic()
    index_of = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    deadline = None
    why = ""
    timed_out: list[BaseException] = []     # the ranks' collective timeouts
    died: list[BaseException] = []          # the ranks whose process ended
    while pending:
        if died and lost_nodes():
            raise died[0]       # a node was lost: the trainer names it
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=min(wait_s, NODE_POLL_S) if died else wait_s)
        if not ready and time.monotonic() < deadline:
            continue            # (after a death) read the node list again
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
        except RayActorError as err:
            if not died:
                deadline = min(deadline or float("inf"), time.monotonic() + died_wait_s)
                why = (f"rank {index}'s process ended meanwhile ({type(err).__name__}) and no Ray node was lost, "
                       "as when NCCL's watchdog ends a rank that waited for a peer in a collective")
            died.append(err)
            continue
        except Exception as err:  # noqa: BLE001 - a rank's failure, raised below unless its peer hung
            if died:
                raise died[0] from None     # a peer's process ended first: the trainer names its node
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
    if died or timed_out:       # every rank came back: a rank's own failure
        raise (died or timed_out)[0]
    return results


__all__ = ["HUNG_PEER_GRACE_S", "LearnerHangError", "RankPlace", "describe_ranks", "is_collective_timeout",
           "wait_for_ranks"]
