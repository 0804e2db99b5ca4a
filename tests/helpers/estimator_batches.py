"""Small StepBatches for the estimator tests."""

from __future__ import annotations

import math

from agentrl.data import StepBatch


def record(group, traj, step, obs, reward, done, action="a", valid=True, hidden=None, response=(5, 6), penalty=0.1,
           noop=0.0):
    """One step record; ``reward`` is the env reward, an invalid row is charged ``penalty`` and any
    row the no-op penalty ``noop``."""
    rec = dict(group_id=group, traj_id=traj, step=step, prompt_ids=[1, 2], response_ids=list(response),
               env_reward=reward, invalid_penalty=0.0 if valid else penalty, noop_penalty=noop, done=done,
               success=False, anchor_obs=obs, action=action, action_valid=valid)
    if hidden is not None:
        rec["hidden"] = list(hidden)
    return rec


def two_trajectory_batch() -> StepBatch:
    """One group, two trajectories (the worked example of the tests).

    traj 0: A -(x)-> B -(y, reward 10, done)
    traj 1: A -(z)-> C -(invalid: env reward 0, invalid_penalty 0.1)-> B -(w, done)
    Rows are stored in this order: (0,A) (0,B) (1,A) (1,C) (1,B). Hidden states are one-hot per
    observation (A, B, C).
    """
    one_hot = {"A": (1.0, 0.0, 0.0), "B": (0.0, 1.0, 0.0), "C": (0.0, 0.0, 1.0)}
    rows = [
        (0, 0, "A", 0.0, False, "x", True), (0, 1, "B", 10.0, True, "y", True),
        (1, 0, "A", 0.0, False, "z", True), (1, 1, "C", 0.0, False, "", False), (1, 2, "B", 0.0, True, "w", True),
    ]
    return StepBatch.from_records(record(0, t, s, o, r, d, a, v, one_hot[o]) for t, s, o, r, d, a, v in rows)


def one_cluster_batch(actions=("a", "a", "b", "c")) -> StepBatch:
    """One group of one-step trajectories: four share a hidden state, a fifth stands alone.

    Returns (= rewards, one step each): 10, 0, 4, 2 in the shared state; 1 alone.
    First response tokens follow the action: a -> [1, 2], b -> [3], c -> [4, 5].
    """
    tokens = {"a": (1, 2), "b": (3,), "c": (4, 5)}
    rewards = (10.0, 0.0, 4.0, 2.0)
    recs = [record(0, t, 0, f"obs{t}", r, True, act, True, (1.0, 0.0), tokens[act])
            for t, (r, act) in enumerate(zip(rewards, actions))]
    recs.append(record(0, 4, 0, "obs4", 1.0, True, "a", True, (0.0, 1.0), tokens["a"]))
    return StepBatch.from_records(recs)


def angle(theta: float) -> tuple[float, float]:
    return (math.cos(theta), math.sin(theta))
