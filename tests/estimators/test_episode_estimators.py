"""GRPO and RLOO on the worked example (tests/estimators/batches.py, two_trajectory_batch).

Episode scores per row with the default penalty handling (after_discount, c = 0.1):
traj 0 has return 10; traj 1 has clean return 0 (its -0.1 is the penalty, added back), and its
invalid row is charged again: s = [10, 10, 0, -0.1, 0].
Over the 5 rows: mean = 19.9 / 5 = 3.98; deviations 6.02, 6.02, -3.98, -4.08, -3.98;
unbiased variance = (2 * 36.2404 + 2 * 15.8404 + 16.6464) / 4 = 30.202.
"""

import math

import pytest
import torch

from agentrl.estimators import compute_advantages

from batches import two_trajectory_batch

STD = math.sqrt(30.202)


def close(actual, expected, tol=1e-5):
    assert actual.dtype == torch.float32
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), actual


def test_grpo_steps_std():
    adv, diag = compute_advantages("grpo", two_trajectory_batch())
    close(adv, [6.02 / STD, 6.02 / STD, -3.98 / STD, -4.08 / STD, -3.98 / STD])
    assert diag["num_groups"] == 1.0


def test_grpo_without_std():
    adv, _ = compute_advantages("grpo", two_trajectory_batch(), norm_by_std=False)
    close(adv, [6.02, 6.02, -3.98, -4.08, -3.98])


def test_grpo_trajectory_stats():
    # returns 10 and 0: mean 5, unbiased std sqrt(50); the invalid row scores -0.1
    adv, _ = compute_advantages("grpo", two_trajectory_batch(), episode_stats="trajectories")
    s = math.sqrt(50.0)
    close(adv, [5 / s, 5 / s, -5 / s, -5.1 / s, -5 / s])


def test_grpo_penalty_in_reward():
    # episode_return as stored: 10, 10, -0.1, -0.1, -0.1 -> mean 19.7 / 5 = 3.94
    adv, _ = compute_advantages("grpo", two_trajectory_batch(), norm_by_std=False, penalty_mode="in_reward")
    close(adv, [6.06, 6.06, -4.04, -4.04, -4.04])


def test_grpo_no_penalty_coefficient_uses_rewards_as_given():
    a, _ = compute_advantages("grpo", two_trajectory_batch(), invalid_action_penalty=0.0)
    b, _ = compute_advantages("grpo", two_trajectory_batch(), penalty_mode="in_reward")
    assert torch.equal(a, b)


def test_rloo_steps():
    # s_j - (19.9 - s_j) / 4
    adv, _ = compute_advantages("rloo", two_trajectory_batch())
    close(adv, [10 - 9.9 / 4, 10 - 9.9 / 4, -19.9 / 4, -0.1 - 20.0 / 4, -19.9 / 4])


def test_rloo_trajectories():
    # leave the row's own trajectory out: traj 0 rows 10 - 0, traj 1 rows s - 10
    adv, _ = compute_advantages("rloo", two_trajectory_batch(), episode_stats="trajectories")
    close(adv, [10.0, 10.0, -10.0, -10.1, -10.0])


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_single_member_group_keeps_raw_score(name):
    batch = two_trajectory_batch().select([0])  # one row, return 10
    adv, _ = compute_advantages(name, batch)
    close(adv, [10.0])
