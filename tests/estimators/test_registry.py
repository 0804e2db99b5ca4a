"""Names, parameters and errors of the public API."""

import dataclasses

import pytest

from agentrl.estimators import ESTIMATORS, PARAMS, SHARED_KEYS, compute_advantages, param_help

from batches import two_trajectory_batch

SHARED = {"gamma": 0.9, "step_advantage_w": 0.5, "mode": "mean_norm", "epsilon": 1e-6, "episode_stats": "steps",
          "invalid_action_penalty": 0.1, "penalty_mode": "after_discount"}


def test_registered_names():
    assert set(ESTIMATORS) == {"grpo", "rloo", "gigpo", "gagpo", "bipace"} == set(PARAMS)


def test_unknown_estimator_names_close_matches():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gipgo'.*did you mean gigpo"):
        compute_advantages("gipgo", two_trajectory_batch())


def test_unknown_param_names_param_and_accepted():
    with pytest.raises(ValueError, match=r"'lamda'.*did you mean lam.*accepted: gamma, lam"):
        compute_advantages("gagpo", two_trajectory_batch(), lamda=0.5)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_shared_keys_are_accepted_by_every_estimator(name):
    assert set(SHARED) == SHARED_KEYS
    adv, diag = compute_advantages(name, two_trajectory_batch(), **SHARED)
    assert adv.shape == (5,) and all(isinstance(v, float) for v in diag.values())


def test_estimator_specific_key_is_rejected_elsewhere():
    with pytest.raises(ValueError, match="'norm_by_std'"):
        compute_advantages("gigpo", two_trajectory_batch(), norm_by_std=True)


@pytest.mark.parametrize("name,key,value", [("gigpo", "mode", "std"), ("grpo", "episode_stats", "rows"),
                                            ("bipace", "pace", "v"), ("gagpo", "lam", 1.5),
                                            ("bipace", "eps_mode", "adaptive")])
def test_bad_values(name, key, value):
    with pytest.raises(ValueError, match=key):
        compute_advantages(name, two_trajectory_batch(), **{key: value})


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_params_are_frozen_with_help(name):
    params = PARAMS[name]()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.epsilon = 1.0  # type: ignore[misc]
    assert all(help_text for _, help_text in param_help(PARAMS[name]).values())


def test_defaults():
    assert PARAMS["gigpo"]().gamma == 0.95 and PARAMS["gigpo"]().mode == "mean_std_norm"
    assert PARAMS["gagpo"]().lam == 0.8 and PARAMS["gagpo"]().action_level_ratio is True
    bp = PARAMS["bipace"]()
    assert (bp.eps, bp.eps_mode, bp.pace, bp.first_token_len) == (0.10, "fixed", "q", 8)
    assert PARAMS["gigpo"]().episode_stats == "steps" and PARAMS["grpo"]().norm_by_std is True
