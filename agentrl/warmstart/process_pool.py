"""Worker processes for the expert demonstrations and the DAgger pass.

Both play environments in ``spawn``-ed processes (a forked ALFWorld or torch state is not safe to
share). A spawned process starts by importing the parent's main module again. A user script that
calls ``agentrl`` at its top level, without an ``if __name__ == "__main__":`` guard, therefore starts
the whole job again in every worker; Python stops that with an error in the worker, and the parent
only sees ``BrokenProcessPool``. :func:`spawned_pool` turns that into a :class:`UsageError` that
names the guard and the one-process setting.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Iterator

from agentrl.runtime.denormals import flush_denormals
from agentrl.errors import UsageError

ONE_PROCESS_SETTING = "trainer.sft.demonstration_workers=1"


@contextmanager
def spawned_pool(workers: int, what: str) -> Iterator[ProcessPoolExecutor]:
    """A ``spawn`` process pool of ``workers`` processes for ``what`` (named in the error). A worker
    that dies, while it starts or later, raises :class:`UsageError` with the two usual causes."""
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                 initializer=flush_denormals) as pool:
            yield pool
    except BrokenProcessPool as exc:
        raise UsageError(
            f"a worker process playing {what} ended abruptly ({exc}). If agentrl is called from your own "
            "script, put the call under `if __name__ == \"__main__\":` (each spawned worker imports the "
            "script again, and without the guard starts the job a second time; the worker's own error above "
            f"says so), or play in this process with {ONE_PROCESS_SETTING}. Otherwise a worker was killed, "
            "most often for memory: use fewer workers.") from exc
