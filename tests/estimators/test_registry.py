"""Names, parameters and errors of the public API: the registry, Params, the interface checks."""

import dataclasses

import pytest

from agentrl.errors import UsageError
from agentrl.estimators import (SHARED_FIELDS, Estimator, EstimatorLoadError, build_estimator, builtin_estimators,
                                compute_advantages, estimator_class, param_help, registered_names)
from agentrl.estimators.params import is_shared, own_fields

from estimator_batches import two_trajectory_batch

SHARED = {"gamma": 0.9, "step_advantage_w": 0.5, "mode": "mean_norm", "epsilon": 1e-6, "episode_stats": "steps",
          "penalty_mode": "after_discount"}


def test_registered_names_in_table_order():
    assert registered_names() == ["grpo", "rloo", "reinforce_pp", "gigpo", "gagpo", "bipace"]
    assert [cls.title for cls in builtin_estimators().values()] == [
        "GRPO", "RLOO", "REINFORCE++-baseline", "GiGPO", "GAGPO", "BiPACE"]


def test_unknown_estimator_names_close_matches():
    with pytest.raises(EstimatorLoadError, match=r"unknown advantage estimator 'gipgo'.*did you mean gigpo"):
        compute_advantages("gipgo", two_trajectory_batch())


def test_unknown_param_names_param_and_accepted():
    with pytest.raises(ValueError, match=r"'lamda'.*did you mean lam.*accepted: gamma, mode, epsilon, penalty_mode, lam"):
        compute_advantages("gagpo", two_trajectory_batch(), lamda=0.5)


@pytest.mark.parametrize("name", registered_names())
def test_shared_keys_are_accepted_by_every_estimator(name):
    assert set(SHARED) == set(SHARED_FIELDS)
    adv, diag = compute_advantages(name, two_trajectory_batch(), **SHARED)
    assert adv.shape == (5,) and all(isinstance(v, float) for v in diag.values())


def test_estimator_specific_key_is_rejected_elsewhere():
    with pytest.raises(ValueError, match="'norm_by_std'"):
        compute_advantages("gigpo", two_trajectory_batch(), norm_by_std=True)


@pytest.mark.parametrize("name,key,value", [("gigpo", "mode", "std"), ("grpo", "episode_stats", "rows"),
                                            ("bipace", "pace", "v"), ("gagpo", "lam", 1.5),
                                            ("bipace", "eps_mode", "adaptive"), ("gigpo", "gamma", -0.1),
                                            ("bipace", "first_token_len", 0), ("grpo", "norm_by_std", "yes"),
                                            ("bipace", "calibration_grid", ())])
def test_bad_values(name, key, value):
    with pytest.raises(ValueError, match=key):
        compute_advantages(name, two_trajectory_batch(), **{key: value})


@pytest.mark.parametrize("name", registered_names())
def test_params_are_frozen_with_help_and_shared_keys_defined_once(name):
    cls = estimator_class(name)
    params = cls.Params()
    assert dataclasses.is_dataclass(params)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(params, dataclasses.fields(params)[0].name, None)
    assert all(help_text for _, help_text in param_help(cls.Params).values())
    for f in dataclasses.fields(cls.Params):
        if is_shared(f):    # a shared key carries the one definition of SharedParams
            assert f.default == SHARED_FIELDS[f.name].default
            assert f.metadata["help"] == SHARED_FIELDS[f.name].metadata["help"]
    assert not any(f.name in SHARED_FIELDS for f in own_fields(cls.Params))


def test_defaults_and_declarations():
    assert estimator_class("gigpo").Params().gamma == 0.95
    assert estimator_class("gigpo").Params().mode == "mean_std_norm"
    gagpo = build_estimator("gagpo")
    assert gagpo.params.lam == 0.8 and gagpo.loss_options().action_level_ratio is True
    bipace = build_estimator("bipace")
    bp = bipace.params
    assert (bp.eps, bp.eps_mode, bp.pace, bp.first_token_len, bp.hidden_layer) == (0.10, "fixed", "q", 8, -8)
    assert bipace.row_inputs().hidden_layer == -8 and bipace.new_state() is not None
    for name in ("grpo", "rloo", "reinforce_pp", "gigpo", "gagpo"):
        estimator = build_estimator(name)
        assert estimator.row_inputs().hidden_layer is None and estimator.new_state() is None
    assert build_estimator("grpo").params.norm_by_std is True


def test_state_round_trips_through_a_checkpoint_dict():
    bipace = build_estimator("bipace", eps_mode="calibrate")
    state = bipace.new_state()
    state.eps = 0.05
    restored = bipace.restore_state(state.as_dict())
    assert restored == state and bipace.restore_state(None) == bipace.new_state()
    assert build_estimator("grpo").restore_state({"eps": 1.0}) is None


class _NoAdvantages(Estimator):
    name = "broken"

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass


class _NoParams(Estimator):
    name = "broken"

    def advantages(self, batch, state=None):
        raise NotImplementedError


@pytest.mark.parametrize("path,message", [
    ("nowhere_at_all.module:Thing", r"cannot import 'nowhere_at_all.module'.*PYTHONPATH"),
    ("agentrl.estimators.builtin.grpo:Missing", r"module 'agentrl.estimators.builtin.grpo' has no 'Missing'"),
    ("agentrl.estimators.builtin.grpo", r"unknown advantage estimator"),
    ("agentrl.estimators.builtin.grpo:np", r"is not an estimator class"),
    (f"{__name__}:_NoAdvantages", r"does not define advantages"),
    (f"{__name__}:_NoParams", r"needs a nested frozen dataclass Params"),
])
def test_bad_import_paths_name_the_problem(path, message):
    with pytest.raises(EstimatorLoadError, match=message) as err:
        estimator_class(path)
    assert isinstance(err.value, UsageError) and "\n" not in str(err.value)


def test_a_class_by_import_path_is_loaded_and_checked():
    cls = estimator_class("agentrl.estimators.builtin.reinforce_pp:ReinforcePPBaseline")
    assert cls is builtin_estimators()["reinforce_pp"]
