"""trainer.sft.cache_dir: one warm start per set of settings it depends on, reused by later runs."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.models import load_model
from agentrl.runs.directory import RunDirectory
from agentrl.warmstart.cache import cache_entry, cache_key, warm_start_settings
from agentrl.warmstart.starting_policy import starting_policy

SMALL_SFT = ["trainer.sft.tasks=8", "trainer.sft.epochs=1", "trainer.sft.batch_size=8", "trainer.sft.max_minutes=0",
             "tokenizer.corpus_tasks=20", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
             "model.tiny.intermediate_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"]


def tiny_config(tmp_path, recipe="textcraft_grpo_tiny", *extra):
    return load_config(recipe, [*SMALL_SFT, f"trainer.output_dir={tmp_path / 'runs'}",
                                f"trainer.sft.cache_dir={tmp_path / 'cache'}", "logging.wandb.mode=disabled", *extra])


def weights(model_dir):
    return {k: v.clone() for k, v in load_model(model_dir, dtype=torch.float32).state_dict().items()}


def test_key_ignores_the_estimator_and_rl_settings_but_not_the_warm_start_ones(tmp_path):
    base = cache_key(tiny_config(tmp_path))
    assert cache_key(tiny_config(tmp_path, "textcraft_bipace_tiny", "learner.lr=1e-3", "rollout.temperature=1.0",
                                 "env.group_size=4")) == base
    for change in ("trainer.seed=1", "trainer.sft.epochs=2", "model.tiny.hidden_size=64",
                   "rollout.max_prompt_tokens=128", "env.history_length=1", "env.history_count_repeats=true",
                   "trainer.sft.recovery.variants=0", "trainer.sft.balance.action_repeats.get=2"):
        assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", change)) != base, change


def test_key_names_the_technique_settings_as_before_each_technique_had_its_section(tmp_path):
    # trainer.sft.dagger.tasks was trainer.sft.dagger_tasks: warm starts cached then keep their keys
    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.dagger.tasks=4",
                      "trainer.sft.balance.action_repeats.get=2")
    sft = warm_start_settings(cfg)["sft"]
    assert {"recovery_variants": 1, "dagger_tasks": 4, "action_repeats": {"get": 2}}.items() <= sft.items()
    assert not set(sft) & {"dagger", "recovery", "balance", "dagger_rounds", "dagger_epochs", "dagger_lr"}


def test_key_does_not_depend_on_how_the_cache_dir_is_spelled(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = cache_key(tiny_config(tmp_path))
    for spelling in ("cache", "./cache", str(tmp_path / "cache") + "/"):
        assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", f"trainer.sft.cache_dir={spelling}")) == base
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.enabled=true")) == base
    # how many processes play the demonstrations does not change them
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.demonstration_workers=2")) == base


def test_time_bounded_sft_is_not_cached(tmp_path):
    assert cache_entry(tiny_config(tmp_path)) is not None
    assert cache_entry(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.max_minutes=1")) is None
    assert cache_entry(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.cache_dir=''")) is None


def test_second_run_copies_the_first_runs_warm_start(tmp_path):
    first_log, second_log = [], []
    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=first")
    first = starting_policy(cfg, RunDirectory.create(cfg, None), log=first_log.append)
    assert any("sft/summary/steps" in m for m in first_log)
    entry = cache_entry(cfg)
    assert (entry / "config.json").is_file()
    assert json.loads((entry / "warm_start_settings.json").read_text())["seed"] == 0

    other = tiny_config(tmp_path, "textcraft_gigpo_tiny", "trainer.run_name=second")
    second = starting_policy(other, RunDirectory.create(other, None), log=second_log.append)
    assert second != first and second.endswith("second/sft_model")
    assert {"sft/cache_hit": 1.0} in second_log and not any("sft/summary/steps" in m for m in second_log)
    a, b = weights(first), weights(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_different_seed_trains_its_own_warm_start(tmp_path):
    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=a")
    starting_policy(cfg, RunDirectory.create(cfg, None))
    log = []
    other = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=b", "trainer.seed=1")
    starting_policy(other, RunDirectory.create(other, None), log=log.append)
    assert any("sft/summary/steps" in m for m in log)
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 2


def test_key_follows_the_split_the_demonstrations_come_from(tmp_path):
    """trainer.sft.split: RL on another split reuses the warm start of the demonstration split, and
    setting it to the split SFT used anyway changes nothing (keys made before the option stay valid)."""
    base = cache_key(tiny_config(tmp_path))  # the recipe trains (SFT and RL) on pool_depth2
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.split=pool_depth2")) == base
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "env.train_split=pool_depth2_wide",
                                 "trainer.sft.split=pool_depth2")) == base
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "env.train_split=pool_depth2_wide")) != base
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.split=pool_depth2_wide")) != base


def test_action_accuracy_script_scores_every_expert_step_by_kind(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    from agentrl.warmstart.demonstrations import expert_episodes
    from agentrl.rollout.parsing import parse_response

    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=acc")
    model_dir = starting_policy(cfg, RunDirectory.create(cfg, None))
    path = Path(__file__).resolve().parents[2] / "scripts" / "sft_action_accuracy.py"
    spec = importlib.util.spec_from_file_location("sft_action_accuracy", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([f"checkpoint={model_dir}", "split=pool_depth2_test", "tasks=6"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    demos = list(expert_episodes("textcraft", {"max_steps": cfg.env.max_steps}, "pool_depth2_test", range(6),
                                 history_length=cfg.env.history_length, think=False, style=cfg.rollout.prompt_style,
                                 show_admissible=cfg.rollout.show_admissible))
    kinds = [parse_response(d.response, "textcraft").action.split()[0] for d in demos]
    accuracy = report["accuracy"]
    assert accuracy["all"]["steps"] == len(demos) and report["split"] == "pool_depth2_test"
    per_kind = {k: v for k, v in accuracy.items() if k != "all" and " after " not in k}
    assert {k: v["steps"] for k, v in per_kind.items()} == {k: kinds.count(k) for k in set(kinds)}
    assert sum(v["right"] for v in per_kind.values()) == accuracy["all"]["right"]
    # each step after the first of its episode also counts under "<kind> after <previous kind>"
    pairs = collections.Counter(f"{kinds[i]} after {kinds[i - 1]}" for i in range(1, len(demos))
                                if demos[i].task == demos[i - 1].task and demos[i].step == demos[i - 1].step + 1)
    assert {k: v["steps"] for k, v in accuracy.items() if " after " in k} == dict(pairs) and pairs
    for kind, pair in per_kind.items():
        assert sum(v["right"] for k, v in accuracy.items() if k.startswith(f"{kind} after ")) <= pair["right"]
        # every step of the kind but an episode's first is counted under exactly one "after" key
        first_steps = sum(1 for d, k in zip(demos, kinds) if k == kind and d.step == 0)
        assert sum(v["steps"] for k, v in accuracy.items() if k.startswith(f"{kind} after ")) == \
            pair["steps"] - first_steps


def test_action_repeats_add_the_repeated_examples_to_each_epoch(tmp_path):
    plain_cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=plain", "trainer.sft.cache_dir=''")
    plain = json.loads((Path(starting_policy(plain_cfg, RunDirectory.create(plain_cfg, None))) /
                        "sft_summary.json").read_text())
    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=more", "trainer.sft.cache_dir=''",
                      "trainer.sft.balance.action_repeats.get=3")
    more = json.loads((Path(starting_policy(cfg, RunDirectory.create(cfg, None))) / "sft_summary.json").read_text())
    assert plain["repeated_examples"] == 0 and more["repeated_examples"] > 0
    assert more["examples"] == plain["examples"] + more["repeated_examples"]
    assert more["episodes"] == plain["episodes"]


def test_dagger_tasks_enter_the_key_only_when_set_and_need_a_step_wise_expert(tmp_path):
    import pytest

    base = cache_key(tiny_config(tmp_path))
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.dagger.tasks=0")) == base
    assert cache_key(tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.sft.dagger.tasks=4")) != base
    cfg = tiny_config(tmp_path, "textcraft_grpo_tiny", "trainer.run_name=dagger", "trainer.sft.cache_dir=''",
                      "trainer.sft.dagger.tasks=4")
    from agentrl.errors import UsageError

    with pytest.raises(UsageError, match="trainer.sft.dagger.tasks=0"):
        starting_policy(cfg, RunDirectory.create(cfg, None))
