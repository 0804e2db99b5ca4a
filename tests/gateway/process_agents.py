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


def late_stepper(task):
    """Episode 0's first attempt resets, outlives rollout.agent_timeout_s, then steps its environment
    (writing what that late call got to $AGENTRL_TEST_LATE_FILE); every other attempt plays one step."""
    import time

    obs, _ = task.env.reset()
    client = task.openai_client(timeout=60)
    client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": obs}])
    late_file = os.environ["AGENTRL_TEST_LATE_FILE"]
    if task.traj_id == 0 and not os.path.exists(late_file):
        with open(late_file, "w") as f:
            f.write("sleeping\n")
        time.sleep(float(os.environ.get("AGENTRL_TEST_LATE_S", "4")))
        try:
            task.env.step("get 5 spruce logs")
            outcome = "stepped"
        except Exception as err:  # noqa: BLE001 - what the late call got is the test's subject
            outcome = f"refused: {err}"
        with open(late_file, "a") as f:
            f.write(outcome + "\n")
        return 1.0
    task.env.step("inventory")
    return 1.0
