"""The tiny recipes' pieces: TextCraft's small-pool and depth-2 splits, the SFT loss, the settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.envs import make_env
from agentrl_env_textcraft.recipes import RecipeBook, default_data_dir
from agentrl_env_textcraft.tasks import (POOL_GOALS, POOL_TEST_LAYOUTS, POOL_TRAIN_LAYOUTS, POOL_WIDE_EXTRA_LAYOUTS,
                                         build_splits)


@pytest.fixture(scope="module")
def splits():
    return make_env("textcraft").splits


def test_new_splits_are_deterministic_and_leave_old_ones_alone(splits):
    again = build_splits(RecipeBook(default_data_dir()))
    assert again == splits
    assert {k: len(v) for k, v in splits.items() if k in ("adapt", "depth2", "train", "test")} == {
        "adapt": 200, "depth2": 291, "train": 1340, "test": 249}


def test_depth2_pairs_are_disjoint(splits):
    book = make_env("textcraft").book
    n = len(book.goals)
    goals = {name: {s % n for s in splits[name]} for name in ("train_depth2", "test_depth2", "pool_depth2",
                                                                "pool_depth2_test")}
    assert all(book.goals[s % n][1] == 2 for name in goals for s in splits[name])
    assert not goals["train_depth2"] & goals["test_depth2"]
    assert set(splits["train_depth2"]) == {s for s in splits["train"] if book.goals[s % n][1] == 2}
    assert set(splits["test_depth2"]) == {s for s in splits["test"] if book.goals[s % n][1] == 2}
    # the pool: its goals are training goals; its test layouts are tasks no other split holds
    assert goals["pool_depth2"] == goals["pool_depth2_test"] and len(goals["pool_depth2"]) == POOL_GOALS
    assert {s for s in splits["train_depth2"] if s % n in goals["pool_depth2"]} <= set(splits["pool_depth2"])
    assert len(set(splits["pool_depth2"])) == POOL_TRAIN_LAYOUTS * POOL_GOALS
    others = set().union(*(set(v) for k, v in splits.items() if k != "pool_depth2_test"))
    assert not set(splits["pool_depth2_test"]) & others
    assert len(set(splits["pool_depth2_test"])) == POOL_TEST_LAYOUTS * POOL_GOALS
    # the wide pool: the same goals, every pool_depth2 layout and 48 more, none of the test layouts
    wide = set(splits["pool_depth2_wide"])
    assert {s % n for s in wide} == goals["pool_depth2"] and set(splits["pool_depth2"]) < wide
    assert len(wide) == len(splits["pool_depth2_wide"]) == (POOL_TRAIN_LAYOUTS + POOL_WIDE_EXTRA_LAYOUTS) * POOL_GOALS
    assert not wide & set(splits["pool_depth2_test"])


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "gagpo", "bipace"])
def test_tiny_textcraft_recipes_validate_on_tasks_they_do_not_train_on(estimator):
    cfg = load_config(f"textcraft_{estimator}_tiny", [])
    assert cfg.env.train_split != cfg.env.eval_split
    longest = 28  # the longest expert response in tokens (action + end-of-turn) seen on depth-2 goals
    assert cfg.rollout.max_response_tokens >= longest


def test_sft_loss_matches_the_full_model_loss():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl.warmstart.sft import IGNORE_INDEX, SftExample, _collate, sft_loss

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=64, tie_word_embeddings=True))
    examples = [SftExample(list(range(1, 9)), [IGNORE_INDEX] * 5 + [6, 7, 8]),
                SftExample(list(range(10, 15)), [IGNORE_INDEX] * 3 + [13, 14])]
    batch = _collate(examples, pad_id=0)
    reference = model(**batch, attention_mask=(batch["input_ids"] != 0).long()).loss
    assert torch.allclose(sft_loss(model, batch), reference, atol=1e-6)


def test_expert_episodes_are_played_once_per_process_and_settings(monkeypatch):
    from agentrl.warmstart import demonstrations

    resets = []
    make_env = demonstrations.make_env

    def counting_env(name, **kwargs):
        env = make_env(name, **kwargs)
        reset = env.reset
        env.reset = lambda task: resets.append(task) or reset(task)
        return env

    monkeypatch.setattr(demonstrations, "make_env", counting_env)
    monkeypatch.setattr(demonstrations, "_EPISODE_CACHE", type(demonstrations._EPISODE_CACHE)())
    settings = dict(history_length=2, think=False, style="compact", show_admissible=False)
    first = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0, 1, 2], **settings))
    again = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [2, 1, 3], **settings))
    assert [t.index for t in resets] == [0, 1, 2, 3]          # task 3 is new; 1 and 2 come from the cache
    assert first and [d for d in again if d.task.index == 1] == [d for d in first if d.task.index == 1]
    assert [d.step for d in first if d.task.index == 0] == list(range(len([d for d in first if d.task.index == 0])))
    list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0], **dict(settings, history_length=1)))
    list(demonstrations.expert_episodes("textcraft", {"max_steps": 40}, "pool_depth2", [0], **settings))
    counted = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0],
                                                  **dict(settings, count_repeats=True)))
    assert [t.index for t in resets] == [0, 1, 2, 3, 0, 0, 0]    # other prompt or env settings: played again
    # pool task 0 (respawn anchor) crafts glowstone three times in a row: the counted history says so
    # where the plain one shows only the last two identical steps
    last = [d for d in first if d.task.index == 0][-1].prompt
    assert "(3 times)" in [d for d in counted if d.step == len(counted) - 1][0].prompt and "times)" not in last


def test_demonstrations_played_in_worker_processes_equal_the_serial_ones(monkeypatch):
    from agentrl.warmstart import demonstrations

    settings = dict(history_length=2, think=False, style="compact", show_admissible=False, recovery_variants=1)
    indices = [5, 0, 3, 1, 4, 2, 0]
    monkeypatch.setattr(demonstrations, "_EPISODE_CACHE", type(demonstrations._EPISODE_CACHE)())
    serial = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", indices, **settings))
    monkeypatch.setattr(demonstrations, "_EPISODE_CACHE", type(demonstrations._EPISODE_CACHE)())
    played_here = []
    monkeypatch.setattr(demonstrations, "make_env", lambda *a, **k: played_here.append(a) or pytest.fail("serial"))
    parallel = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", indices,
                                                   workers=2, **settings))
    # same demonstrations in the same order (the repeated index too), none played in this process
    assert serial and parallel == serial and not played_here
    assert [d.task.index for d in parallel if d.step == 0 and not d.recovery] == indices


NO_GUARD_SCRIPT = """
from agentrl.warmstart.demonstrations import expert_episodes
demos = list(expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0, 1, 2, 3], history_length=2,
                             think=False, style="compact", workers=2))
print("demonstrations", len(demos))
"""


def test_worker_processes_started_from_a_script_without_a_main_guard_name_the_guard(tmp_path):
    """A spawned worker imports the calling script again; without the guard it dies at start, and the
    error names the guard and the one-process setting, not only BrokenProcessPool."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD_SCRIPT)
    failed = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode != 0
    # the error is the traceback's last line; a loaded machine may have the multiprocessing resource
    # tracker's exit-time warning about the dead workers' semaphores printed after it
    lines = [line for line in failed.stderr.strip().splitlines()
             if "resource_tracker" not in line and "warnings.warn(" not in line]
    last_line = lines[-1]
    assert last_line.startswith("agentrl.errors.UsageError: a worker process playing textcraft's expert")
    assert 'if __name__ == "__main__":' in last_line and "trainer.sft.demonstration_workers=1" in last_line
    guarded = tmp_path / "guarded.py"
    body = "".join("    " + line + "\n" for line in NO_GUARD_SCRIPT.strip().splitlines())
    guarded.write_text('if __name__ == "__main__":\n' + body)
    ran = subprocess.run([sys.executable, str(guarded)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert int(ran.stdout.split()[-1]) > 0


def test_a_spawned_worker_that_is_killed_raises_a_usage_error_naming_what_it_played():
    import os

    from agentrl.warmstart.process_pool import spawned_pool
    from agentrl.errors import UsageError

    with pytest.raises(UsageError, match=r"playing the DAgger pass ended abruptly.*fewer workers"):
        with spawned_pool(1, "the DAgger pass") as pool:
            pool.submit(os._exit, 9).result()


def test_action_repeats_balance_rare_decisions_and_reject_bad_settings():
    from agentrl.warmstart import demonstrations
    from agentrl.errors import UsageError

    settings = dict(history_length=2, think=False, style="compact", show_admissible=False)
    demos = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0, 1, 2], **settings))
    kinds = [d.response.removeprefix("<action>").split()[0] for d in demos]
    assert "get" in kinds and "craft" in kinds
    repeated = demonstrations.repeat_by_action(demos, {"get": 3}, "textcraft")
    assert len(repeated) == len(demos) + 2 * kinds.count("get")
    expected = [d for d, kind in zip(demos, kinds) for _ in range(3 if kind == "get" else 1)]
    assert repeated == expected and demonstrations.repeat_by_action(demos, {}, "textcraft") == demos
    for bad, match in (({"get": 0}, "whole number"), ({"get": 1.5}, "whole number"), ({"take": 2}, "take"),
                       ({"get after inventory": 2}, "get after inventory")):
        with pytest.raises(UsageError, match=match):
            demonstrations.repeat_by_action(demos, bad, "textcraft")
    # each demonstration knows the action taken before its state; "<kind> after <kind>" keys use it and
    # win over the plain kind
    assert [d.previous_action for d in demos if d.step == 0] == ["", "", ""]
    for before, demo in zip(demos, demos[1:]):
        if demo.step > 0:
            assert demo.previous_action == before.response.removeprefix("<action>").removesuffix("</action>")
    pairs = [f"{kind} after {prev}" if demo.step else None
             for demo, kind, prev in zip(demos, kinds, [""] + kinds[:-1])]
    assert "craft after get" in pairs
    repeated = demonstrations.repeat_by_action(demos, {"craft after get": 4, "craft": 2}, "textcraft")
    expected = [d for d, kind, pair in zip(demos, kinds, pairs)
                for _ in range(4 if pair == "craft after get" else 2 if kind == "craft" else 1)]
    assert repeated == expected


def test_overshoot_points_take_the_longest_runs_first():
    from agentrl.warmstart.demonstrations import overshoot_points

    plan = ["get 9 a", "craft 1 b using 3 a", "craft 1 b using 3 a", "craft 1 b using 3 a", "get 1 c",
            "craft 1 d using 1 c", "craft 1 goal using 3 b, 1 d"]
    assert overshoot_points(plan, 1) == [4]                 # after the three identical crafts
    assert overshoot_points(plan, 3) == [4, 6, 5]           # then the single steps, latest first
    assert overshoot_points(plan, 0) == [] and overshoot_points(plan[:1], 2) == []


def test_recovery_variants_train_only_the_steps_after_the_overshoot():
    from agentrl.warmstart import demonstrations

    settings = dict(history_length=2, think=False, style="compact", show_admissible=False)
    plain = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0], **settings))
    both = list(demonstrations.expert_episodes("textcraft", {"max_steps": 12}, "pool_depth2", [0],
                                               **dict(settings, recovery_variants=1)))
    # pool task 0 (respawn anchor): get, get, three glowstone crafts, the anchor (6 steps)
    assert len(plain) == 6 and not any(d.recovery for d in plain)
    assert both[:6] == plain
    recovery = both[6:]
    assert [d.step for d in recovery] == [6] and all(d.recovery for d in recovery)
    # the environment rejected the fourth glowstone craft; the demonstration is the anchor craft, and
    # the rejected craft itself is never a response to learn
    assert "Observation: Could not find enough items to craft minecraft:glowstone" in recovery[0].prompt
    assert "Last 2 of 6 steps" in recovery[0].prompt
    assert recovery[0].response == plain[-1].response and "respawn anchor" in recovery[0].response
    # with no room for the extra step the variant cannot win and is dropped
    tight = list(demonstrations.expert_episodes("textcraft", {"max_steps": 6}, "pool_depth2", [0],
                                                **dict(settings, recovery_variants=1)))
    assert tight == plain


def test_sft_split_chooses_the_demonstrations_and_tokenizer_corpus(tmp_path):
    """trainer.sft.split overrides env.train_split for SFT and the tokenizer corpus (not for RL); a
    split the env lacks is a usage error naming the key that set it."""
    from agentrl.warmstart.demonstrations import corpus_texts, demonstration_split
    from agentrl.errors import UsageError
    from agentrl.warmstart.starting_policy import corpus_builder

    def cfg(*extra):
        return load_config("textcraft_grpo_tiny", ["tokenizer.corpus_tasks=3", f"trainer.output_dir={tmp_path}",
                                                   *extra])

    assert demonstration_split(cfg()) == "pool_depth2"
    rl_elsewhere = cfg("env.train_split=pool_depth2_test", "trainer.sft.split=pool_depth2")
    assert demonstration_split(rl_elsewhere) == "pool_depth2"
    assert rl_elsewhere.env.train_split == "pool_depth2_test"
    settings = dict(history_length=2, think=False, style="compact", show_admissible=False, recovery_variants=1)
    on_pool = corpus_texts("textcraft", {"max_steps": 12}, "pool_depth2", 3, **settings)
    on_test = corpus_texts("textcraft", {"max_steps": 12}, "pool_depth2_test", 3, **settings)
    assert on_pool != on_test  # other layouts, other texts: the comparison below can tell them apart
    assert corpus_builder(rl_elsewhere)() == on_pool
    assert corpus_builder(cfg("env.train_split=pool_depth2_test"))() == on_test
    for bad, key in ((("trainer.sft.split=pool_depth3",), "trainer.sft.split='pool_depth3'"),
                     (("env.train_split=pool_depth3",), "env.train_split='pool_depth3'")):
        with pytest.raises(UsageError, match=f"{key} is not a split of textcraft; available: .*pool_depth2"):
            demonstration_split(cfg(*bad))


@pytest.mark.parametrize("estimator", ["grpo", "gigpo", "gagpo", "bipace"])
def test_tiny_alfworld_recipes_generate_the_games_they_train_and_validate_on(estimator):
    from agentrl_env_alfworld.data import generation_options

    cfg = load_config(f"alfworld_{estimator}_tiny", [])
    kwargs, sft = cfg.env.kwargs, cfg.trainer.sft
    options = generation_options(kwargs["generated_solver"], kwargs["generated_rooms"], kwargs["generated_task_types"])
    assert options["solver"] == "search", "only the searching expert's episodes can be imitated by the tiny model"
    counts = kwargs["generated_counts"]
    assert cfg.env.train_split != cfg.env.eval_split and cfg.eval.num_tasks <= counts[cfg.env.eval_split]
    assert max(sft.tasks, sft.dagger.tasks, cfg.tokenizer.corpus_tasks) <= counts[cfg.env.train_split]
    assert sft.dagger.rounds >= 1 and sft.dagger.tasks > 0 and cfg.env.history_count_repeats
    assert sft.max_minutes == 0, "a step-bounded warm start: the same on any machine, and cacheable"
    # guided runs from the recipe's 20 % start fell to 2.5-16.3 %; unguided ones stayed >= 16.9 % (docs/benchmarks.md, ALFWorld tiny)
    assert not cfg.rollout.expert_guidance and cfg.rollout.noop_penalty > 0
