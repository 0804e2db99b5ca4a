"""Placement: which GPU of which node holds each learner rank and rollout engine, and the Ray
placement group that reserves them.

* :mod:`agentrl.placement.plan`: the plan from the config and the cluster's shape (layouts split and
  colocated), refused in one line when it cannot work;
* :mod:`agentrl.placement.memory`: the per-GPU memory estimates it checks (no GPU needed);
* :mod:`agentrl.placement.reservation`: the plan's bundles, one Ray placement group for all of them
  (granted whole or not at all, within ``placement.wait_s``), and the slots the roles' actors go in;
* :mod:`agentrl.placement.report`: the plan as text or JSON (``agentrl plan``).

It sits above ``config`` (it reads the whole config) and below ``training`` and ``cli`` (which use
it); the roles never import it: they take :class:`agentrl.runtime.actor_slots.ActorSlot` objects.
"""

from agentrl.placement.plan import InfeasiblePlan, PlacementPlan, plan_placement

__all__ = ["InfeasiblePlan", "PlacementPlan", "plan_placement"]
