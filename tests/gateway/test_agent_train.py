"""`agentrl train` with an outside agent (rollout.agent) through the real CLI: the openai-client
TextCraft agent plays every episode through the gateway of each rollout worker (in threads of the
worker, or in a process it spawns), and the learner updates on the rows of its model calls."""

from __future__ import annotations

import pytest

from agentrl.runs.tracking import read_metrics
from cli_train import TINY, run_cli

pytest.importorskip("openai")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes", [0, 1])     # agents in threads of the Ray rollout worker, or spawned by it
def test_train_with_an_outside_agent(tmp_path, tiny_start_model, ray_head, processes):
    args = ["train", "recipe=textcraft_gigpo_tiny", *TINY, f"trainer.output_dir={tmp_path}", "trainer.run_name=agent",
            f"trainer.init_checkpoint={tiny_start_model}", "trainer.iterations=2", "trainer.save_every=0",
            "trainer.eval_every=0", "trainer.eval_before_train=false", "trainer.final_checkpoint=false",
            "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=3", "rollout.max_response_tokens=8",
            "rollout.max_prompt_tokens=3000", "rollout.agent=agentrl.agents.textcraft_openai:run_episode",
            "rollout.expert_guidance=false", f"rollout.agent_processes={processes}",
            "learner.num_ranks=1", "learner.mini_batch_size=8", "learner.micro_batch_size=4",
            "learner.skip_zero_advantage=false", "learner.entropy_coef=0.01", "logging.wandb.mode=disabled"]
    proc = run_cli(args, extra_env=ray_head)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    rows = [r for r in read_metrics(tmp_path / "agent" / "metrics.jsonl") if "learner/loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/env_steps"] >= 4 and r["rollout/env_failures"] == 0 for r in rows)
