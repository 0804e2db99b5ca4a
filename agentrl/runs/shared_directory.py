"""Whether the run directory is one directory for this process and every learner rank.

Each learner rank writes its share of every checkpoint (its DeepSpeed partition, its RNG state) into
the run directory under ``trainer.output_dir``, and the process that runs the training loop writes
the rest and renames the checkpoint into place. On a cluster whose nodes do not share that
filesystem, each rank would write onto its own node's disk, and the checkpoint on this node would
look complete while missing the other ranks' files (a resume would then fail, or worse, load
another run's partitions). So before the ranks load anything (``LearnerGroup(...,
shared_directory=run_dir)``):

1. this process writes a marker file holding a fresh nonce into the directory;
2. each rank reads it back (waiting up to ``VISIBLE_WITHIN_S`` for a network filesystem's caches)
   and writes a marker of its own next to it;
3. this process reads every rank's marker, then removes them all.

A rank that does not see the marker, cannot write there, or whose marker is not seen here stops the
run with one line naming the ranks, their nodes, and the fix: a filesystem every node mounts at
the same path, or the learner ranks on this node. agentrl refuses rather than gathering each rank's
checkpoint files to one writer: the partitions are as large as the model's optimizer state (~23 GB
per rank at 7B with 4 ranks), and a resume would have to send them back to each rank's node.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from agentrl.errors import UsageError

MARKER_PREFIX = ".agentrl-shared-check-"
VISIBLE_WITHIN_S = 2.0      # how long a marker may take to appear (NFS attribute and lookup caches)
POLL_S = 0.05


def driver_marker(directory: Path, nonce: str) -> Path:
    return directory / f"{MARKER_PREFIX}{nonce}"


def rank_marker(directory: Path, nonce: str, rank: int) -> Path:
    return directory / f"{MARKER_PREFIX}{nonce}-rank{rank}"


def _reads_within(path: Path, text: str, wait_s: float) -> bool:
    """Whether ``path`` holds ``text`` now or within ``wait_s`` (looked up by name: a lookup of a new
    name goes to the server, where a directory listing may be served from a cache)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if path.read_text() == text:
                return True
        except OSError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def view_of_directory(directory: str, nonce: str, rank: int) -> dict[str, Any]:
    """What learner rank ``rank`` sees (run on the rank): ``problem`` is None when it reads the marker
    with ``nonce`` in ``directory`` and wrote its own; else what went wrong, in a few words."""
    path = Path(directory)
    if not _reads_within(driver_marker(path, nonce), nonce, VISIBLE_WITHIN_S):
        where = "no directory of that path on its node" if not path.is_dir() else "a different directory of that path"
        return {"rank": rank, "problem": f"does not see the marker this process wrote there ({where})"}
    try:
        rank_marker(path, nonce, rank).write_text(nonce)
    except OSError as err:
        return {"rank": rank, "problem": f"sees it but cannot write there ({err.strerror})"}
    return {"rank": rank, "problem": None}


def check_shared_directory(directory: str, places: Sequence[Any],
                           views_of: Callable[[str, str], list[dict[str, Any]]]) -> None:
    """Refuse (``UsageError``, one line) unless every rank sees ``directory`` as this process does.

    ``places``: each rank's :class:`~agentrl.learner.rank_calls.RankPlace` (anything with ``describe()``);
    ``views_of(directory, nonce)``: every rank's :func:`view_of_directory`, in rank order."""
    path = Path(directory).absolute()
    nonce = uuid.uuid4().hex
    marker = driver_marker(path, nonce)
    marker.write_text(nonce)
    problems: list[str] = []
    try:
        for view, place in zip(views_of(str(path), nonce), places):
            problem: Optional[str] = view["problem"]
            if problem is None and not _reads_within(rank_marker(path, nonce, view["rank"]), nonce, VISIBLE_WITHIN_S):
                problem = "wrote a marker there that this process does not see"
            if problem is not None:
                problems.append(f"learner rank {place.describe()} {problem}")
    finally:
        marker.unlink(missing_ok=True)
        for rank in range(len(places)):
            rank_marker(path, nonce, rank).unlink(missing_ok=True)
    if problems:
        raise UsageError(f"trainer.output_dir is not one directory for every learner rank: in {path}, "
                         f"{'; '.join(problems)}. Each rank writes its share of every checkpoint there, so the "
                         f"checkpoints on this node ({this_node()}) would lack those ranks' files; put "
                         "trainer.output_dir on a filesystem that every node mounts at the same path (e.g. NFS), or "
                         "run the learner ranks on this node (placement.learner naming a resource of this node)")


def this_node() -> str:
    """This process's node address (Ray's view of it when Ray runs here) and host name."""
    try:
        import ray

        address = ray.util.get_node_ip_address() if ray.is_initialized() else None
    except ImportError:
        address = None
    host = socket.gethostname()
    return f"{address}, host {host}" if address else f"host {host}"


__all__ = ["VISIBLE_WITHIN_S", "check_shared_directory", "view_of_directory"]
