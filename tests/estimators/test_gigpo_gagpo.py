"""GiGPO and GAGPO on the worked example (batches.two_trajectory_batch), gamma = 0.5.

Step returns (clean rewards discounted, the penalty charged to the invalid row afterwards):
traj 0: rewards 0, 10 -> G = 5, 10; traj 1: clean rewards 0, 0, 0 -> G = 0, 0, 0, and the
invalid row (1, C) gets -0.1. Per row: G' = [5, 10, 0, -0.1, 0].
Anchor groups: A = rows {0, 2} (G 5, 0), B = rows {1, 4} (G 10, 0), C = row {3} (singleton).
"""

import math

import torch

from agentrl.estimators import build_estimator, compute_advantages
from agentrl.learner.losses import action_level_ratio

from agentrl.data import StepBatch

from estimator_batches import record, two_trajectory_batch

EPISODE_MEAN_NORM = [6.02, 6.02, -3.98, -4.08, -3.98]      # s - 3.98 (see test_episode_estimators)
EPISODE_STD = [x / math.sqrt(30.202) for x in EPISODE_MEAN_NORM]


def close(actual, expected, tol=1e-5):
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), actual


def test_gigpo_mean_norm():
    # step term: A: 5 - 2.5, 0 - 2.5; B: 10 - 5, 0 - 5; C: 0 -> [2.5, 5, -2.5, 0, -5]
    adv, diag = compute_advantages("gigpo", two_trajectory_batch(), gamma=0.5, mode="mean_norm")
    step = [2.5, 5.0, -2.5, 0.0, -5.0]
    close(adv, [e + s for e, s in zip(EPISODE_MEAN_NORM, step)])
    assert diag["num_step_groups"] == 3.0 and abs(diag["step_group_singleton_rate"] - 0.2) < 1e-12


def test_gigpo_step_weight():
    adv, _ = compute_advantages("gigpo", two_trajectory_batch(), gamma=0.5, mode="mean_norm", step_advantage_w=0.5)
    close(adv, [6.02 + 1.25, 6.02 + 2.5, -3.98 - 1.25, -4.08, -3.98 - 2.5])


def test_gigpo_mean_std_norm():
    # A: values 5, 0 -> unbiased std sqrt(12.5); B: 10, 0 -> sqrt(50): both give +-1/sqrt(2)
    adv, _ = compute_advantages("gigpo", two_trajectory_batch(), gamma=0.5)
    h = 1 / math.sqrt(2)
    close(adv, [e + s for e, s in zip(EPISODE_STD, [h, h, -h, 0.0, -h])])


def test_gigpo_penalty_in_reward_propagates():
    # the penalty as a reward: traj 1 = 0, -0.1, 0 -> G = -0.05, -0.1, 0; episode scores all -0.1 in traj 1
    adv, _ = compute_advantages("gigpo", two_trajectory_batch(), gamma=0.5, mode="mean_norm", penalty_mode="in_reward")
    # episode: mean (20 - 0.3) / 5 = 3.94; step A: 5, -0.05 -> mean 2.475; B: 10, 0 -> mean 5
    close(adv, [6.06 + 2.525, 6.06 + 5.0, -4.04 - 2.525, -4.04, -4.04 - 5.0])


def test_gigpo_similarity_groups_near_duplicates():
    base = "You arrive at cabinet 1. On the cabinet 1, you see a mug 1."
    recs = [record(0, 0, 0, base, 10.0, True), record(0, 1, 0, base.replace("mug 1", "mug 2"), 0.0, True),
            record(0, 2, 0, "Nothing happens.", 4.0, True)]
    batch = StepBatch.from_records(recs)
    exact, _ = compute_advantages("gigpo", batch, mode="mean_norm")
    similar, diag = compute_advantages("gigpo", batch, mode="mean_norm", enable_similarity=True, similarity_thresh=0.9)
    # episode term: returns 10, 0, 4, mean 14/3. Exact anchors are all singletons: step term 0.
    episode = [10 - 14 / 3, -14 / 3, 4 - 14 / 3]
    close(exact, episode)
    # similar: rows 0 and 1 form one group (mean 5) -> +5, -5; row 2 alone -> 0
    close(similar, [episode[0] + 5, episode[1] - 5, episode[2]])
    assert diag["num_step_groups"] == 2.0


def test_gagpo_hand_computed():
    # V: A 2.5, B 5, C -0.1. Implied rewards r' = G'_t - 0.5 G'_{t+1}: traj 0: 0, 10; traj 1: 0.05, -0.1, 0.
    # delta = r' + 0.5 V(next) - V: traj 0: 0 + 2.5 - 2.5 = 0, 10 - 5 = 5;
    #         traj 1: 0.05 - 0.05 - 2.5 = -2.5, -0.1 + 2.5 + 0.1 = 2.5, 0 - 5 = -5.
    # lam = 0.5 -> gamma * lam = 0.25; backwards: traj 0: 5, 0 + 1.25 = 1.25;
    #         traj 1: -5, 2.5 - 1.25 = 1.25, -2.5 + 0.3125 = -2.1875.
    # raw = [1.25, 5, -2.1875, 1.25, -5], mean 0.0625 -> mean_norm subtracts it.
    adv, _ = compute_advantages("gagpo", two_trajectory_batch(), gamma=0.5, lam=0.5, mode="mean_norm")
    close(adv, [1.1875, 4.9375, -2.25, 1.1875, -5.0625])


def test_gagpo_lam_one_is_gigpo_step_term():
    # lam = 1 telescopes to G' - V: [2.5, 5, -2.5, 0, -5], whose mean is 0
    adv, _ = compute_advantages("gagpo", two_trajectory_batch(), gamma=0.5, lam=1.0, mode="mean_norm")
    close(adv, [2.5, 5.0, -2.5, 0.0, -5.0])


def test_gagpo_lam_zero_is_one_step_td():
    # lam = 0: raw = delta = [0, 5, -2.5, 2.5, -5], mean 0
    adv, _ = compute_advantages("gagpo", two_trajectory_batch(), gamma=0.5, lam=0.0, mode="mean_norm")
    close(adv, [0.0, 5.0, -2.5, 2.5, -5.0])


def test_action_level_ratio_flag_and_value():
    assert build_estimator("gagpo").loss_options().action_level_ratio
    assert not build_estimator("gagpo", action_level_ratio=False).loss_options().action_level_ratio
    assert not build_estimator("gigpo", gamma=0.9, mode="mean_norm").loss_options().action_level_ratio
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]])
    old = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # row 0: mean(0.5, 0, -1) = -1/6; row 1: only the first token counts: 1
    close(action_level_ratio(logp, old, mask), [math.exp(-1 / 6), math.e])


def test_similarity_grouping_uses_difflib_where_the_lcs_bound_passes():
    """'babcaacbbcca' vs 'bacbcacacbca': the LCS-based Indel similarity (0.83) passes 0.8, difflib's
    ratio (0.5) does not, so they stay apart; a near duplicate and the first clusters still join,
    and the cluster ids follow first appearance across groups."""
    import difflib

    from rapidfuzz.distance import Indel

    from agentrl.estimators.builtin.gigpo import similar_anchor_segments

    a, b = "babcaacbbcca", "bacbcacacbca"
    assert Indel.normalized_similarity(a, b) >= 0.8 > difflib.SequenceMatcher(None, b, a).ratio()
    obs = [a, "zzzz", b, a + "c", "zzzz", a]
    group = torch.tensor([0, 1, 0, 0, 1, 1])
    seg, num = similar_anchor_segments(obs, group, 0.8)
    # group 0: a -> 0, b -> new (difflib 0.5), a + "c" joins a (difflib 0.96); group 1: "zzzz", a
    assert seg.tolist() == [0, 1, 2, 0, 1, 3] and num == 4


def test_gigpo_similarity_groups_anchors_at_exactly_the_threshold():
    # "abcde" and "abcdX": difflib's ratio is exactly 0.8, so at threshold 0.8 they share a step
    # group (difflib's >=). The old pre-filter dropped such ties: two singleton groups, step term 0
    batch = StepBatch.from_records([record(0, 0, 0, "abcde", 0.0, True), record(0, 1, 0, "abcdX", 1.0, True)])
    adv, diag = compute_advantages("gigpo", batch, enable_similarity=True, similarity_thresh=0.8)
    # episode term: returns 0 and 1 -> -+1/sqrt(2); step term in one group -> -+1/sqrt(2): sum -+1.414
    h = 1 / math.sqrt(2)
    close(adv, [-2 * h, 2 * h])
    assert diag["num_step_groups"] == 1.0
