"""Killing what `ray start` left behind: every process of the sessions it was started in."""

from __future__ import annotations

import os
from typing import Iterable


def kill_sessions(sids: Iterable[int], timeout: float = 30) -> None:
    """SIGKILL every process whose session id is in ``sids`` (the daemons of `ray start` calls made
    with ``start_new_session=True``) and wait for them."""
    import psutil

    sids = set(sids)
    victims = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) in sids:
                victims.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=timeout)
