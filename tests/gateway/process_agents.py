"""Agents for the agent-process tests, importable by name in a spawned process (rollout.agent_processes)."""

from __future__ import annotations

import os


def steps_then_misbehaves(task):
    """Episode 0 raises, 1 kills its process after a model call, the others play one env step."""
    client = task.openai_client(timeout=60)
    obs, _ = task.env.reset()
    client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": obs}])
    if task.traj_id == 0:
        raise ValueError("agent bug in a process")
    if task.traj_id == 1:
        os._exit(3)
    obs, _, _, _ = task.env.step("inventory")
    return {"reward": 1.0 if obs.startswith("Inventory") else 0.0}
