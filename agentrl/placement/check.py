"""Check a reservation on the live cluster: a stand-in actor in every slot reports where it runs.

``probe_slots(reservation)`` starts one :class:`SlotProbe` per learner rank, rollout engine and env
server, each with the options :func:`agentrl.runtime.actor_slots.actor_options` gives the real role
for that slot (the code path LearnerGroup, RolloutWorkerGroup and the env pool use), and returns
each one's Ray node and ``CUDA_VISIBLE_DEVICES``. ``agentrl plan --reserve`` prints them; the
placement tests check them on a CPU cluster with declared GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from agentrl.placement.reservation import Reservation
from agentrl.runtime.actor_slots import actor_options


class SlotProbe:
    """A stand-in actor: says where it runs."""

    def where(self) -> tuple[str, Optional[str]]:
        import ray

        return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class SlotReport:
    role: str                   # "learner", "rollout" or "env"
    index: int
    node_id: str
    visible_devices: Optional[str]     # CUDA_VISIBLE_DEVICES as the actor saw it

    @property
    def devices(self) -> list[str]:
        return [d for d in (self.visible_devices or "").split(",") if d]

    def line(self) -> str:
        name = {"learner": "learner rank", "rollout": "rollout engine", "env": "env server"}[self.role]
        return f"{name} {self.index}: node {self.node_id[:12]}, CUDA_VISIBLE_DEVICES={self.visible_devices or ''}"


def probe_slots(reservation: Reservation, timeout_s: float = 120.0) -> list[SlotReport]:
    """Where an actor of each role lands in ``reservation`` (the stand-ins are stopped afterwards)."""
    import ray

    probe_class = ray.remote(SlotProbe)
    started = []
    for role, slots in (("learner", reservation.learner_slots), ("rollout", reservation.rollout_slots),
                        ("env", reservation.env_slots)):
        for index, slot in enumerate(slots):
            started.append((role, index, probe_class.options(**actor_options(slot, num_cpus=1, num_gpus=0)).remote()))
    try:
        answers = ray.get([actor.where.remote() for _, _, actor in started], timeout=timeout_s)
    finally:
        for _, _, actor in started:
            ray.kill(actor)
    return [SlotReport(role, index, node, devices) for (role, index, _), (node, devices) in zip(started, answers)]


__all__ = ["SlotProbe", "SlotReport", "probe_slots"]
