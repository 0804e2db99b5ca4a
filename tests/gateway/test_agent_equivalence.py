"""The proof that the gateway records what agentrl's own loop records: the TextCraft loop rewritten as an
outside agent with the ``openai`` client (agentrl.agents.textcraft_openai), played through the
gateway, gives the same StepBatch as the built-in engine for the same tasks and weights: the same
prompt and response ids, rewards, anchors, done, success and valid-action flags, row by row (greedy sampling: the
built-in loop batches every episode's step into one call, the gateway whatever arrives, so sampled
noise would differ)."""

from __future__ import annotations

import pytest

from agentrl.config import load_config
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.rollout.agents.engine import AgentEngine
from agentrl.models import load_tokenizer
from agentrl.generation import make_backend
from agentrl.rollout.engine import RolloutEngine
from tiny_policy import save_tiny_policy

pytest.importorskip("openai")


def rows_of(batch) -> dict[tuple[int, int], dict]:
    out = {}
    for i in range(len(batch)):
        prompt = batch.prompt_ids[i, :int(batch.prompt_lengths[i])].tolist()
        response = batch.response_ids[i][batch.response_mask[i] > 0].tolist()
        out[(int(batch.traj_id[i]), int(batch.step[i]))] = {
            "prompt": prompt, "response": response, "reward": round(float(batch.reward[i]), 6),
            "anchor": batch.anchor_obs[i], "done": bool(batch.done[i]), "success": bool(batch.success[i]),
            "group": int(batch.group_id[i]), "valid": bool(batch.action_valid[i])}
    return out


@pytest.mark.parametrize("seed,processes", [(0, 0), (1, 0), (0, 2)])
def test_the_openai_textcraft_agent_records_what_the_built_in_loop_records(tmp_path, seed, processes):
    save_tiny_policy(tmp_path, seed=seed)
    cfg = load_config("textcraft_grpo_tiny", ["env.max_steps=4", "rollout.max_response_tokens=10",
                                              "rollout.max_prompt_tokens=3000", "rollout.expert_guidance=false",
                                              "rollout.invalid_action_penalty=0.1", "rollout.enable_thinking=true",
                                              "env.history_length=3", f"rollout.agent_processes={processes}"])
    tasks = [TaskRef("pool_depth2", 3), TaskRef("pool_depth2", 7)]
    batches = []
    for make in (lambda b, c: RolloutEngine(b, load_tokenizer(str(tmp_path)), c, cfg.rollout, cfg.env),
                 lambda b, c: AgentEngine(b, load_tokenizer(str(tmp_path)), c, cfg.rollout, cfg.env,
                                          agent="agentrl.agents.textcraft_openai:run_episode")):
        client = EnvClient.local("textcraft", 4, {"max_steps": 4})
        engine = make(make_backend("torch", str(tmp_path), max_model_len=3010), client)
        try:
            batches.append(engine.run(tasks, group_size=2, sampling=engine.sampling_params(temperature=0), seed=seed))
        finally:
            getattr(engine, "close", lambda: None)()
            client.close()
    built_in, gateway = (rows_of(r.batch) for r in batches)
    assert len(built_in) >= 8 and built_in.keys() == gateway.keys()
    for key in built_in:
        assert gateway[key] == built_in[key], key
