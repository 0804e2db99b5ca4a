"""Ports and stores where processes meet (a learner's ranks, the weight-broadcast group).

A port this project chooses is never closed between being chosen and being served: the group's
master store is bound on a port the OS picks (:func:`reserve_store`) and held in this process until
the group is built (:func:`store_at`), so nothing starting in between (a Ray worker, another
learner, a child run) can take it. A port the user sets is used as it is.
"""

from __future__ import annotations

import datetime
import threading

import torch.distributed as dist


_held_stores: dict[int, dist.TCPStore] = {}     # port -> a master store bound by reserve_store, not used yet
_held_lock = threading.Lock()


def reserve_store(world_size: int) -> int:
    """Bind a rendezvous store (this process serves it) on a port the OS picks, and hold it until
    :func:`store_at` hands it out; returns the port. The store listens on every interface, so ranks
    on other nodes reach it at this node's address."""
    store = dist.TCPStore("0.0.0.0", 0, world_size, is_master=True, wait_for_workers=False)
    with _held_lock:
        _held_stores[store.port] = store
    return int(store.port)


def holds_store(port: int) -> bool:
    """Whether this process holds a reserved store for ``port`` that no group has used yet."""
    with _held_lock:
        return int(port) in _held_stores


def store_at(host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta) -> dist.TCPStore:
    """The store of a group at ``host:port``: the one :func:`reserve_store` holds for ``port`` in
    this process (the master), else a new client, or a new master bound on ``port`` (a port the user
    set: a clash raises torch's EADDRINUSE error)."""
    with _held_lock:
        store = _held_stores.pop(int(port), None) if is_master else None
    if store is not None:
        store.set_timeout(timeout)
        return store
    return dist.TCPStore(host, int(port), world_size, is_master, timeout=timeout, wait_for_workers=False)
