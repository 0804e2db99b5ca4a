"""Where one Ray actor of a role goes, and the Ray options that put it there.

Every role that starts actors (learner ranks, rollout workers, env pool shards) asks
:func:`actor_options` for each actor's options, with the actor's :class:`ActorSlot` or None:

* None: today's request, the role's CPUs and GPUs plus the custom resource of its ``placement.*``
  entry (:func:`agentrl.runtime.ray_start.placed`); Ray puts the actor wherever that fits;
* a slot: a bundle of a reserved placement group (:mod:`agentrl.placement.reservation` makes them
  from the placement plan). The actor asks its bundle for the slot's CPUs and GPUs; Ray then sets
  ``CUDA_VISIBLE_DEVICES`` to the GPUs it gives the actor. A slot with ``visible_devices`` is an
  actor that shares GPUs others hold (a rollout engine colocated with learner ranks): it asks for
  no GPU and is started with those devices visible.

The slots know nothing of the plan, so the roles need not either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from agentrl.runtime.ray_start import placed


@dataclass(frozen=True)
class ActorSlot:
    """Bundle ``bundle_index`` of ``placement_group``, and what one actor asks from it."""

    placement_group: Any
    bundle_index: int
    num_cpus: float
    num_gpus: float
    #: the GPU ids the actor sees when it asks for none of its own (shared GPUs); None: Ray's choice
    visible_devices: tuple[str, ...] | None = None
    node_id: str = ""       # the Ray node the bundle is on (for reports)


def actor_options(slot: ActorSlot | None, *, num_cpus: float, num_gpus: float,
                  resources: Sequence[str] = (), index: int = 0) -> dict[str, Any]:
    """The ``.options(...)`` of actor ``index`` of a role: in ``slot`` when given, else ``num_cpus``
    and ``num_gpus`` with the ``resources`` entry for it (``placement.*``)."""
    if slot is None:
        return {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": placed(resources, index)}
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    options: dict[str, Any] = {
        "num_cpus": slot.num_cpus, "num_gpus": slot.num_gpus,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(slot.placement_group, slot.bundle_index)}
    if slot.visible_devices is not None:
        options["runtime_env"] = {"env_vars": {"CUDA_VISIBLE_DEVICES": ",".join(slot.visible_devices)}}
    return options


def slot_at(slots: Sequence[ActorSlot] | None, index: int) -> ActorSlot | None:
    """Actor ``index``'s slot, None when the role has no slots (no placement group)."""
    return slots[index] if slots else None


__all__ = ["ActorSlot", "actor_options", "slot_at"]
