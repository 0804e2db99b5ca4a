"""TextCraft played by an agent written with the ``openai`` client, as an outside author would write it.

    agentrl train recipe=textcraft_grpo_tiny rollout.agent=agentrl.agents.textcraft_openai:run_episode \
    rollout.expert_guidance=false

Each step: the prompt that agentrl's own loop would show (the same task line, history window,
admissible actions and ``<think>``/``<action>`` instruction, as one user message; the settings come
from ``task.extra["loop"]``, the run's), one chat call, the action parsed from
``<action>...</action>`` and sent to the environment. The reward: the success reward at the winning
step, minus the invalid-action penalty for each step whose reply held no valid action, reported per
call (``step_rewards``), so step-level estimators see where the episode was won.
"""

from __future__ import annotations

from agentrl.rollout.agents.task import AgentTask
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, task_text

def run_episode(task: AgentTask) -> dict:
    loop = {"history_length": 2, "think": True, "style": "compact", "count_repeats": False, "show_admissible": False,
            "success_reward": 10.0, "invalid_action_penalty": 0.1, **task.extra.get("loop", {})}
    client = task.openai_client(timeout=300)     # openai.OpenAI(base_url=task.base_url, api_key=task.api_key), pooled
    obs, info = task.env.reset()
    first_obs, first_info = obs, info
    history, rewards, valid, won = History(), [], [], False
    for _ in range(task.max_steps):
        admissible = list(info.get("admissible_actions") or []) if loop["show_admissible"] else []
        text = build_prompt_text(task.env_name, task_text(task.env_name, first_obs, first_info, info), obs, history,
                                 admissible, history_length=loop["history_length"], think=loop["think"],
                                 style=loop["style"], count_repeats=loop["count_repeats"])
        reply = client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": text}],
                                               extra_body={"agentrl": {"anchor": obs}})
        parsed = parse_response(reply.choices[0].message.content or "", task.env_name, require_think=loop["think"])
        next_obs, _, done, next_info = task.env.step(parsed.action)
        won_now = bool(next_info.get("won", False))
        reward = loop["success_reward"] if won_now and not won else 0.0
        rewards.append(reward - (0.0 if parsed.valid else loop["invalid_action_penalty"]))
        valid.append(parsed.valid)
        won = won_now
        history.add(obs, parsed.action)
        obs, info = next_obs, next_info
        if done:
            break
    return {"reward": sum(rewards), "won": won, "step_rewards": rewards, "step_valid": valid}
