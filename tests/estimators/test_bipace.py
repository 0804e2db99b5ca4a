"""BiGPO clustering and the PACE step terms.

one_cluster_batch: rows 0-3 share a hidden state (returns 10, 0, 4, 2; actions a, a, b, c),
row 4 is alone (return 1). Episode term (mean_norm, one row per trajectory): returns
10, 0, 4, 2, 1 have mean 3.4 -> [6.6, -3.4, 0.6, -1.4, -2.4]. Cluster mean V = 16 / 4 = 4.
"""

import pytest
import torch

from agentrl.data import StepBatch
from agentrl.estimators import compute_advantages
from agentrl.estimators.builtin.bipace.clustering import BiGPOState
from agentrl.estimators.builtin.bipace.clustering import greedy_cosine_clusters

from estimator_batches import angle, one_cluster_batch, record, two_trajectory_batch

EPISODE = [6.6, -3.4, 0.6, -1.4, -2.4]


def close(actual, expected, tol=1e-5):
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), actual


def bipace(batch, **params):
    return compute_advantages("bipace", batch, mode="mean_norm", **params)


def test_q_style():
    # Q(a) = (10 + 0) / 2 = 5 -> +1; Q(b) = 4 -> 0; Q(c) = 2 -> -2; singleton -> 0
    adv, diag = bipace(one_cluster_batch())
    close(adv, [e + s for e, s in zip(EPISODE, [1.0, 1.0, 0.0, -2.0, 0.0])])
    assert diag["singleton_rate"] == pytest.approx(0.2)
    assert diag["distinct_keys_per_cluster"] == pytest.approx(3.0)
    assert diag["num_clusters"] == 2.0 and diag["fallback_rate"] == 0.0


@pytest.mark.parametrize("pace", ["action_tag", "first_token"])
def test_diff_peer(pace):
    # a rows: peers b, c -> mean 3: 10 - 3, 0 - 3; b: peers 10, 0, 2 -> 4: 0; c: peers 10, 0, 4 -> 14/3
    adv, _ = bipace(one_cluster_batch(), pace=pace)
    close(adv, [e + s for e, s in zip(EPISODE, [7.0, -3.0, 0.0, 2 - 14 / 3, 0.0])])


def test_first_token_key_length():
    # with first_token_len = 1 the keys are the first tokens 1, 1, 3, 4: same split as the action tags
    a, _ = bipace(one_cluster_batch(), pace="first_token", first_token_len=1)
    b, _ = bipace(one_cluster_batch(), pace="action_tag")
    assert torch.equal(a, b)


def test_state_only_is_gigpo_style():
    # R - V = [6, -4, 0, -2]; singleton 0
    adv, _ = bipace(one_cluster_batch(), pace="state_only")
    close(adv, [e + s for e, s in zip(EPISODE, [6.0, -4.0, 0.0, -2.0, 0.0])])


@pytest.mark.parametrize("pace", ["q", "action_tag", "first_token"])
def test_leave_one_out_fallback_with_one_key(pace):
    # all actions a: R_i - mean of the other three: 10 - 2, 0 - 16/3, 4 - 4, 2 - 14/3
    adv, diag = bipace(one_cluster_batch(actions=("a", "a", "a", "a")), pace=pace)
    close(adv, [e + s for e, s in zip(EPISODE, [8.0, -16 / 3, 0.0, 2 - 14 / 3, 0.0])])
    assert diag["fallback_rate"] == pytest.approx(0.8)


def test_pace_norm_by_std():
    # cluster returns 10, 0, 4, 2: unbiased variance (36 + 16 + 0 + 4) / 3 = 56 / 3
    adv, _ = bipace(one_cluster_batch(), pace_norm_by_std=True, step_advantage_w=1.0)
    s = (56 / 3) ** 0.5
    close(adv, [e + x for e, x in zip(EPISODE, [1 / s, 1 / s, 0.0, -2 / s, 0.0])])


def test_greedy_clustering_seed_and_mean_centroids():
    # angles 0, 0.3, 0.6, 0.45 (cosine distance 1 - cos of the angle difference), eps = 0.1:
    # seed: 0.3 joins 0 (d 0.045); 0.6 is 0.175 from seed 0 -> new seed; 0.45 is 0.0995 from
    #       seed 0 and 0.011 from seed 0.6 -> the nearer one. Labels 0, 0, 1, 1.
    # mean: after 0 and 0.3 the centroid points at 0.15; 0.6 is 1 - cos(0.45) = 0.0995 away -> joins;
    #       everything ends in one cluster. A row of another group never joins.
    hidden = torch.tensor([angle(0.0), angle(0.3), angle(0.6), angle(0.45), angle(0.0)])
    group = torch.tensor([0, 0, 0, 0, 1])
    seed, k = greedy_cosine_clusters(hidden, group, 2, 0.1, "seed")
    assert seed.tolist() == [0, 0, 1, 1, 2] and k == 3
    mean, k = greedy_cosine_clusters(hidden, group, 2, 0.1, "mean")
    assert mean.tolist() == [0, 0, 0, 0, 1] and k == 2


def test_eps_zero_with_identity_embedding_is_gigpo():
    batch = two_trajectory_batch()  # hidden = one-hot of the observation
    for mode in ("mean_norm", "mean_std_norm"):
        a, diag = compute_advantages("bipace", batch, eps=0.0, pace="state_only", mode=mode, gamma=0.5)
        b, _ = compute_advantages("gigpo", batch, mode=mode, gamma=0.5)
        assert torch.equal(a, b)
        assert diag["singleton_rate"] == diag["obs_hash_singleton_rate"] == pytest.approx(0.2)


def test_calibration_is_done_once_and_frozen():
    # hidden states of one state at angles 0, 0.2, 0.4, 0.6 (distances 0.02, 0.08, 0.18 from the
    # first): the smallest grid eps leaving <= 25 % singletons is 0.02 ({0, 0.2}, {0.4, 0.6})
    recs = [record(0, t, 0, "s", float(t), True, "a", True, angle(0.2 * t)) for t in range(4)]
    batch = StepBatch.from_records(recs)
    state = BiGPOState()
    _, diag = bipace(batch, eps_mode="calibrate", state=state, calibration_singleton_rate=0.25,
                     calibration_grid=(0.01, 0.02, 0.05))
    assert state.eps == diag["eps"] == 0.02
    assert state.calibration["singleton_rate@0.01"] == 1.0
    other = StepBatch.from_records([record(0, 9, 0, "s", 0.0, True, "a", True, (0.0, 1.0))])
    _, diag = bipace(other, eps_mode="calibrate", state=state, calibration_grid=(0.3,))
    assert diag["eps"] == 0.02  # frozen
    assert BiGPOState.from_dict(state.as_dict()) == state


def test_calibration_needs_state_and_bipace_needs_hidden():
    with pytest.raises(ValueError, match="state"):
        bipace(one_cluster_batch(), eps_mode="calibrate")
    no_hidden = StepBatch.from_records([record(0, 0, 0, "s", 1.0, True)])
    with pytest.raises(ValueError, match="batch.hidden"):
        bipace(no_hidden)
