"""Properties over random batches (hypothesis): finite outputs, agreement with the per-record
reference implementations, the GiGPO special cases of BiPACE and GAGPO, row-order invariance."""

import dataclasses

import torch
from hypothesis import given, settings, strategies as st

from agentrl.bench._estimators_reference import reference_advantages, reference_clusters
from agentrl.data import StepBatch
from agentrl.estimators import ESTIMATORS, PARAMS, SHARED_KEYS, compute_advantages
from agentrl.estimators.bigpo_clustering import greedy_cosine_clusters

from batches import record

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def batches(draw, constant_reward=False, identity_hidden=False):
    num_groups = draw(st.integers(1, 3))
    recs, traj = [], 0
    observations = ["A", "B", "C", "D"]
    for g in range(num_groups):
        for _ in range(draw(st.integers(1, 4))):
            length = draw(st.integers(1, 5))
            for t in range(length):
                obs = draw(st.sampled_from(observations))
                valid = draw(st.booleans()) or draw(st.booleans())
                reward = 1.0 if constant_reward else draw(st.sampled_from([0.0, 0.0, 1.0, 10.0, -0.5]))
                reward -= 0.0 if valid else 0.1
                if identity_hidden:
                    hidden = [1.0 if k == observations.index(obs) else 0.0 for k in range(4)]
                else:
                    hidden = draw(st.lists(st.floats(-1, 1, allow_nan=False, width=32), min_size=4, max_size=4))
                    hidden[0] += 1.5  # keep vectors away from zero
                action = draw(st.sampled_from(["a", "b", "c"])) if valid else ""
                response = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
                recs.append(record(g, traj, t, obs, reward, t == length - 1, action, valid, hidden, response))
            traj += 1
    return StepBatch.from_records(recs)


PARAM_SETS = [
    {}, {"mode": "mean_norm", "episode_stats": "trajectories"}, {"penalty_mode": "in_reward", "gamma": 0.7},
    {"pace": "first_token", "first_token_len": 2, "norm_by_std": False}, {"pace": "action_tag", "lam": 0.3},
    {"pace": "state_only", "eps": 0.3, "centroid": "mean"}, {"pace_norm_by_std": True, "eps": 0.05},
    {"enable_similarity": True, "similarity_thresh": 0.5},
]


def usable(name, params):
    """The keys of ``params`` that estimator ``name`` accepts."""
    fields = {f.name for f in dataclasses.fields(PARAMS[name])}
    return {k: v for k, v in params.items() if k in fields or k in SHARED_KEYS}


@SETTINGS
@given(batches(), st.sampled_from(PARAM_SETS))
def test_matches_reference_implementation(batch, params):
    for name in ESTIMATORS:
        chosen = usable(name, params)
        fast, diag = compute_advantages(name, batch, **chosen)
        ref = reference_advantages(name, batch, **chosen)
        assert fast.dtype == torch.float32 and fast.shape == (len(batch),)
        assert torch.allclose(fast.double(), ref, atol=1e-4, rtol=1e-5), (name, chosen, fast, ref)
        assert all(v == v for v in diag.values())


@SETTINGS
@given(batches(), st.sampled_from(PARAM_SETS))
def test_collector_anchor_keys_give_the_same_advantages_as_the_strings(batch, params):
    keyed = batch.with_anchor_keys()
    assert batch.anchor_key is None and keyed.anchor_key is not None
    for name in ESTIMATORS:
        chosen = usable(name, params)
        a, diag_a = compute_advantages(name, batch, **chosen)
        b, diag_b = compute_advantages(name, keyed, **chosen)
        assert torch.equal(a, b), name
        assert diag_a == diag_b, name


@SETTINGS
@given(batches(constant_reward=True), st.sampled_from(PARAM_SETS))
def test_constant_rewards_give_finite_advantages(batch, params):
    for name in ESTIMATORS:
        adv, _ = compute_advantages(name, batch, **usable(name, params))
        assert torch.isfinite(adv).all()


@SETTINGS
@given(batches(identity_hidden=True), st.sampled_from(["mean_norm", "mean_std_norm"]),
       st.sampled_from(["steps", "trajectories"]))
def test_bipace_eps_zero_identity_embedding_equals_gigpo(batch, mode, stats):
    params = {"mode": mode, "episode_stats": stats, "gamma": 0.9}
    a, diag = compute_advantages("bipace", batch, eps=0.0, pace="state_only", **params)
    b, gdiag = compute_advantages("gigpo", batch, **params)
    assert torch.equal(a, b)
    assert diag["singleton_rate"] == gdiag["step_group_singleton_rate"]


@SETTINGS
@given(batches(), st.sampled_from(["after_discount", "in_reward"]))
def test_gagpo_lam_one_equals_gigpo_mean_norm_step_term(batch, penalty_mode):
    params = {"mode": "mean_norm", "gamma": 0.8, "penalty_mode": penalty_mode}
    gagpo, _ = compute_advantages("gagpo", batch, lam=1.0, **params)
    with_step, _ = compute_advantages("gigpo", batch, step_advantage_w=1.0, **params)
    without, _ = compute_advantages("gigpo", batch, step_advantage_w=0.0, **params)
    assert torch.allclose(gagpo, with_step - without, atol=1e-5)


@SETTINGS
@given(batches(), st.floats(0.0, 0.6), st.sampled_from(["seed", "mean"]), st.integers(1, 4))
def test_vectorised_clustering_equals_row_by_row_pass(batch, eps, centroid, block):
    group, num_groups = batch.group_segments()
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, eps, centroid, block=block)
    ref = torch.tensor(reference_clusters(batch, eps, centroid))
    # same partition (ids may be numbered differently)
    pairs = torch.unique(torch.stack([labels, ref]), dim=1)
    assert pairs.shape[1] == num == int(torch.unique(ref).numel())


@SETTINGS
@given(batches(), st.randoms(use_true_random=False))
def test_order_invariance_of_hash_based_estimators(batch, rnd):
    perm = list(range(len(batch)))
    rnd.shuffle(perm)
    shuffled = batch.select(perm)
    for name in ("grpo", "rloo", "gigpo", "gagpo"):
        a, _ = compute_advantages(name, batch)
        b, _ = compute_advantages(name, shuffled)
        assert torch.allclose(a[perm], b, atol=1e-5)
