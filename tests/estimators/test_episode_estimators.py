"""GRPO and RLOO on the worked example (tests/helpers/estimator_batches.py, two_trajectory_batch).

Episode scores per row with the default penalty handling (after_discount, c = 0.1):
traj 0 has return 10; traj 1 has return 0 without its penalty, and its invalid row (invalid_penalty
0.1) is charged: s = [10, 10, 0, -0.1, 0].
Over the 5 rows: mean = 19.9 / 5 = 3.98; deviations 6.02, 6.02, -3.98, -4.08, -3.98;
unbiased variance = (2 * 36.2404 + 2 * 15.8404 + 16.6464) / 4 = 30.202.
"""

import math

import pytest
import torch

from agentrl.estimators import compute_advantages

from estimator_batches import two_trajectory_batch

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
    # returns 10 and 0: mean 5, unbiased std sqrt(50); the invalid row's penalty 0.1 is charged after
    # the division (divided by a std it takes no part in, it would grow without bound as the std -> 0)
    adv, _ = compute_advantages("grpo", two_trajectory_batch(), episode_stats="trajectories")
    s = math.sqrt(50.0)
    close(adv, [5 / s, 5 / s, -5 / s, -5 / s - 0.1, -5 / s])


def test_grpo_trajectory_stats_stay_bounded_when_returns_are_equal():
    # every trajectory returns 0 and one row is invalid: the old code divided that row's penalty by
    # the std of equal returns, -0.125 / 1e-6 = -1.25e5; now the row gets exactly -c
    batch = two_trajectory_batch().with_columns(env_reward=torch.zeros(5), invalid_penalty=torch.tensor(
        [0.0, 0.0, 0.0, 0.125, 0.0]))
    for name in ("grpo", "gigpo"):
        adv, _ = compute_advantages(name, batch, episode_stats="trajectories", gamma=0.5)
        close(adv, [0.0, 0.0, 0.0, -0.125, 0.0])  # gigpo: every anchor group has equal step returns


def test_grpo_penalty_in_reward():
    # the penalty is one more reward: episode returns 10, 10, -0.1, -0.1, -0.1 -> mean 19.7 / 5 = 3.94
    adv, _ = compute_advantages("grpo", two_trajectory_batch(), norm_by_std=False, penalty_mode="in_reward")
    close(adv, [6.06, 6.06, -4.04, -4.04, -4.04])


def test_grpo_without_penalties_both_modes_agree():
    batch = two_trajectory_batch().with_columns(invalid_penalty=torch.zeros(5))
    a, _ = compute_advantages("grpo", batch)
    b, _ = compute_advantages("grpo", batch, penalty_mode="in_reward")
    assert torch.equal(a, b)


def test_noop_penalty_is_an_ordinary_reward_in_both_modes():
    # a no-op penalty of 1 on row (0, A): traj 0 returns 9 in both penalty modes
    batch = two_trajectory_batch().with_columns(noop_penalty=torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]))
    adv, _ = compute_advantages("grpo", batch, norm_by_std=False)
    # scores 9, 9, 0, -0.1, 0: mean 17.9 / 5 = 3.58
    close(adv, [5.42, 5.42, -3.58, -3.68, -3.58])


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
    batch = two_trajectory_batch().select([0, 1])  # one trajectory, return 10
    adv, _ = compute_advantages(name, batch, episode_stats="trajectories")
    close(adv, [10.0, 10.0])
