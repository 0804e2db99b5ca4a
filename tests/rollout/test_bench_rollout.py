"""``agentrl bench rollout`` measures the tiny recipe's workload, the naive baseline on the same prompts."""

from __future__ import annotations

import argparse

from agentrl.bench import rollout as bench
from agentrl.bench._common import parse_target_args


def _args(*argv: str) -> argparse.Namespace:
    return parse_target_args(bench, argv)


def test_workload_is_the_tiny_textcraft_recipe():
    cfg = bench.workload(_args())
    tiny = cfg.model.tiny
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.num_kv_heads) == (4, 128, 4, 2)
    assert (cfg.rollout.max_prompt_tokens, cfg.rollout.prompt_truncation, cfg.rollout.max_response_tokens) == \
        (192, "left", 28)
    assert (cfg.env.max_steps, cfg.env.train_split, cfg.env.tasks_per_iteration, cfg.env.group_size) == \
        (12, "pool_depth2", 16, 8)
    assert cfg.rollout.temperature == 0.4
    small = bench.workload(_args("--tasks", "2", "--group-size", "3", "--max-steps", "4", "--split", "depth2",
                                 "--temperature", "1.0"))
    assert (small.env.tasks_per_iteration, small.env.group_size, small.env.max_steps, small.env.train_split) == \
        (2, 3, 4, "depth2")
    assert small.rollout.temperature == 1.0


def test_every_variant_plays_the_same_steps_on_left_truncated_prompts():
    report = bench._measure(_args("--tasks", "1", "--group-size", "2", "--max-steps", "3", "--backends", "torch",
                                  "--override", "model.tiny.num_layers=2"))     # reaches the model it builds
    meta, rows = report["meta"], report["results"]
    assert meta["max_prompt_tokens"] == 192 and meta["prompt_truncation"] == "left" and "2 layers" in meta["model"]
    assert set(rows) == {"naive", "engine", "engine-no-prefix-sharing", "engine-hidden"}
    assert {row["env_steps"] for row in rows.values()} == {6}
    for row in rows.values():  # every prompt kept at most its last 192 tokens, in the baseline too
        assert row["prompt_tokens"] <= 192 * row["env_steps"]
    assert rows["engine"]["truncated_prompts"] > 0  # the TextCraft task text alone is longer than 192
    assert rows["naive"]["speedup_vs_naive"] == rows["naive"]["cpu_speedup_vs_naive"] == 1.0
    assert all(row["cpu_s"] > 0 and row["env_steps_per_cpu_s"] > 0 for row in rows.values())


def test_paper_recipes_run_their_shape_with_random_weights_on_a_gpu_only():
    import pytest

    with pytest.raises(ValueError, match="--device cuda"):
        bench.workload(_args("--recipe", "alfworld_bipace_qwen7b"))
    cfg = bench.workload(_args("--recipe", "alfworld_bipace_qwen7b", "--device", "cuda", "--tasks", "4"))
    assert cfg.model.random_init and cfg.model.name_or_path == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.env.tasks_per_iteration == 4 and cfg.trainer.device == "cuda"
    assert not cfg.rollout.vllm.enforce_eager and cfg.rollout.prompt_truncation == "error"
    eager = bench.workload(_args("--recipe", "textcraft_grpo_qwen1.5b", "--device", "cuda", "--override",
                                 "rollout.vllm.enforce_eager=true", "--override", "rollout.prompt_truncation=left"))
    assert eager.rollout.vllm.enforce_eager and eager.rollout.prompt_truncation == "left"
