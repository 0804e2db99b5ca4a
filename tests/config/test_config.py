"""Config: every shipped recipe validates; overrides, unknown keys and bad values fail clearly."""

import dataclasses

import pytest

from agentrl.config import Config, load_config, parse_overrides, recipe_names
from agentrl.config.loading import ALL_KEYS, build_dataclass
from agentrl.errors import UsageError

ENVS, ESTIMATORS, MODELS = ("alfworld", "webshop", "textcraft", "sokoban", "scienceworld"), \
    ("grpo", "gigpo", "gagpo", "bipace"), ("qwen1.5b", "qwen7b", "tiny")


def test_exactly_the_60_recipes_ship():
    expected = {f"{e}_{a}_{m}" for e in ENVS for a in ESTIMATORS for m in MODELS}
    assert set(recipe_names()) == expected


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_loads_and_matches_its_name(name):
    env, estimator, model = name.split("_")
    cfg = load_config(name)
    assert cfg.env.name == env
    assert cfg.algorithm.estimator == estimator
    assert cfg.description
    if model == "tiny":
        assert cfg.model.name_or_path == "tiny" and cfg.rollout.backend == "torch"
    else:
        assert cfg.model.name_or_path.startswith("Qwen/Qwen2.5-")
        # the papers' settings
        assert cfg.env.group_size == 8 and cfg.env.tasks_per_iteration == 16
        assert cfg.learner.lr == 1e-6 and cfg.learner.kl_type == "low_var_kl" and cfg.learner.kl_coef == 0.01
        assert cfg.algorithm.gamma == 0.95 and cfg.env.history_length == 2
        assert cfg.trainer.iterations == 150
        assert cfg.env.max_steps == {"alfworld": 50, "webshop": 15, "textcraft": 40, "sokoban": 15, "scienceworld": 100}[env]


def test_bipace_layer_and_eps_follow_model_size():
    big, small = load_config("alfworld_bipace_qwen7b"), load_config("alfworld_bipace_qwen1.5b")
    assert (big.algorithm.bipace.hidden_layer, big.algorithm.bipace.eps) == (-8, 0.10)
    assert (small.algorithm.bipace.hidden_layer, small.algorithm.bipace.eps) == (-12, 0.05)


def test_override_changes_one_field_and_keeps_the_rest():
    base = load_config("alfworld_bipace_qwen7b")
    cfg = load_config("alfworld_bipace_qwen7b", ["learner.lr=2e-6", "env.kwargs.foo=3"])
    assert cfg.learner.lr == 2e-6
    assert cfg.env.kwargs == {"foo": 3}
    assert dataclasses.replace(cfg.learner, lr=base.learner.lr) == base.learner


def test_interpolation_between_keys():
    cfg = load_config(None, ["eval.num_tasks=${env.tasks_per_iteration}"])
    assert cfg.eval.num_tasks == cfg.env.tasks_per_iteration


def test_unknown_key_names_path_and_closest_key():
    with pytest.raises(UsageError, match=r"`learner\.lrr`.*`learner\.lr`"):
        load_config("alfworld_bipace_qwen7b", ["learner.lrr=1"])
    with pytest.raises(UsageError, match=r"`algorithm\.bipace\.epss`.*`algorithm\.bipace\.eps`"):
        load_config(None, ["algorithm.bipace.epss=0.1"])


@pytest.mark.parametrize("override, field, accepted", [
    ("learner.lr=-1", "learner.lr", "> 0"),
    ("env.group_size=two", "env.group_size", "int"),
    ("learner.zero_stage=5", "learner.zero_stage", "0, 1, 2, 3"),
    ("rollout.top_p=1.5", "rollout.top_p", "<= 1"),
    ("trainer.eval_before_train=3", "trainer.eval_before_train", "bool"),
])
def test_bad_values_name_field_and_what_it_accepts(override, field, accepted):
    with pytest.raises(UsageError) as err:
        load_config(None, [override])
    assert f"`{field}`" in str(err.value) and accepted in str(err.value)


def test_unknown_env_name_lists_the_environments_found():
    with pytest.raises(UsageError) as err:
        load_config(None, ["env.name=minecraft"])
    assert "env.name='minecraft'" in str(err.value) and "alfworld, scienceworld, sokoban, textcraft, webshop" in str(err.value)
    assert "did you mean textcraft" in str(err.value)


def test_unknown_recipe_lists_close_names():
    with pytest.raises(UsageError, match="alfworld_bipace_qwen7b"):
        load_config("alfworld_bipace_qwen8b")


def test_parse_overrides_splits_recipe_and_rejects_non_assignments():
    assert parse_overrides(["recipe=x", "a.b=1"]) == ("x", ["a.b=1"])
    with pytest.raises(UsageError, match="not key=value"):
        parse_overrides(["learner.lr"])


def test_every_field_has_help_text():
    import typing

    def walk(cls):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name])

    walk(Config)
    assert "learner.lr" in ALL_KEYS and "algorithm.bipace.eps" in ALL_KEYS


def test_build_rejects_a_section_that_is_not_a_mapping():
    with pytest.raises(UsageError, match="`learner` must be a mapping"):
        build_dataclass(Config, {"learner": 3})


def test_configuration_reference_is_up_to_date():
    from pathlib import Path

    from agentrl.config.reference import render

    doc = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert doc.read_text() == render(), "regenerate: python -m agentrl.config.reference > docs/configuration.md"


def test_bare_yes_no_values_are_read_as_the_words_not_booleans():
    assert load_config(None, ["trainer.sft.enabled=no"]).trainer.sft.enabled == "no"
    assert load_config(None, ["trainer.sft.enabled=yes"]).trainer.sft.enabled == "yes"
    with pytest.raises(UsageError, match="`rollout.backend`"):
        load_config(None, ["rollout.backend=true"])


@pytest.mark.parametrize("key, bad, good", [("learner.rollout_is_cap", ["0.5", "-1"], ["0", "1", "2.0"]),
                                            ("learner.dual_clip_c", ["0.5", "1", "-3"], ["0", "3.0"])])
def test_settings_that_are_off_at_zero_refuse_values_below_their_bound(key, bad, good):
    for value in bad:
        with pytest.raises(UsageError, match=rf"`{key}` = .* expected float 0 \(off\) or"):
            load_config(None, [f"{key}={value}"])
    for value in good:
        section, name = key.split(".")
        assert getattr(getattr(load_config(None, [f"{key}={value}"]), section), name) == float(value)


def test_warm_start_techniques_are_generated_sections_of_trainer_sft():
    import typing

    from agentrl.config.sft_options import TECHNIQUES, DaggerOptions

    sft_hints = typing.get_type_hints(type(Config().trainer.sft))
    assert set(TECHNIQUES) == {"dagger", "recovery", "balance"}
    for name, options in TECHNIQUES.items():
        assert sft_hints[name] is options and getattr(Config().trainer.sft, name) == options()
        for f in dataclasses.fields(options):
            assert f"trainer.sft.{name}.{f.name}" in ALL_KEYS and f.metadata["help"]
    assert {"trainer.sft.dagger.tasks", "trainer.sft.dagger.rounds", "trainer.sft.dagger.epochs",
            "trainer.sft.dagger.lr", "trainer.sft.recovery.variants", "trainer.sft.balance.action_repeats",
            "trainer.sft.epochs", "trainer.sft.cache_dir"} <= set(ALL_KEYS)
    assert Config().trainer.sft.dagger == DaggerOptions(tasks=0, rounds=0, epochs=1.0, lr=1e-3)
    cfg = load_config(None, ["trainer.sft.dagger.tasks=4", "trainer.sft.balance.action_repeats.take=5",
                             "trainer.sft.recovery.variants=2"])
    sft = cfg.trainer.sft
    assert (sft.dagger.tasks, sft.balance.action_repeats, sft.recovery.variants) == (4, {"take": 5}, 2)
    assert load_config("alfworld_grpo_tiny").trainer.sft.dagger == DaggerOptions(480, 1, 0.5, 1e-3)
    assert load_config("textcraft_grpo_tiny").trainer.sft.recovery.variants == 1
    for override, accepted in (("trainer.sft.dagger.tasks=-1", "int >= 0"), ("trainer.sft.dagger.lr=0", "float > 0"),
                               ("trainer.sft.recovery.variants=-2", "int >= 0"),
                               ("trainer.sft.balance.action_repeats=5", "dict")):
        with pytest.raises(UsageError, match=rf"`{override.split('=')[0]}` = .* expected {accepted}"):
            load_config(None, [override])


OLD_WARM_START_KEYS = {"dagger_tasks": "dagger.tasks", "dagger_rounds": "dagger.rounds",
                       "dagger_epochs": "dagger.epochs", "dagger_lr": "dagger.lr",
                       "recovery_variants": "recovery.variants", "action_repeats": "balance.action_repeats"}


@pytest.mark.parametrize("old, new", OLD_WARM_START_KEYS.items())
def test_old_warm_start_keys_fail_in_one_line_naming_the_new_key_on_the_command_line(old, new):
    value = "{take: 5}" if old == "action_repeats" else "1"
    with pytest.raises(UsageError) as err:
        load_config(None, [f"trainer.sft.{old}={value}"])
    message = str(err.value)
    assert f"unknown config key `trainer.sft.{old}`; did you mean `trainer.sft.{new}`?" in message
    assert "\n" not in message


@pytest.mark.parametrize("old, new", OLD_WARM_START_KEYS.items())
def test_a_yaml_file_written_with_an_old_warm_start_key_still_loads_with_a_warning(old, new, tmp_path, capsys):
    # a run's saved config.yaml (agentrl eval/export read it) or a user's recipe from before the move
    value, expected = ("{take: 5}", {"take": 5}) if old == "action_repeats" else ("2", 2)
    saved = tmp_path / "config.yaml"
    saved.write_text(f"trainer:\n  sft:\n    {old}: {value}\n    dagger_tasks: 8\n" if old == "dagger_rounds"
                     else f"trainer:\n  sft:\n    {old}: {value}\n")
    cfg = load_config(str(saved))
    section, leaf = new.split(".")
    assert getattr(getattr(cfg.trainer.sft, section), leaf) == expected
    assert f"config key `trainer.sft.{old}` is now `trainer.sft.{new}`" in capsys.readouterr().err


def test_dagger_rounds_need_dagger_tasks_when_the_config_loads():
    with pytest.raises(UsageError) as err:
        load_config(None, ["trainer.sft.dagger.rounds=2"])
    assert str(err.value) == ("trainer.sft.dagger.rounds=2 needs the tasks each round's policy plays: set "
                              "trainer.sft.dagger.tasks=N (e.g. 480), or trainer.sft.dagger.rounds=0")
    cfg = load_config(None, ["trainer.sft.dagger.rounds=2", "trainer.sft.dagger.tasks=8"])
    assert (cfg.trainer.sft.dagger.rounds, cfg.trainer.sft.dagger.tasks) == (2, 8)
