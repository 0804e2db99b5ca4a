"""TextCraft played by an agent written with the ``openai`` client, as an outside author would write it.

    agentrl train recipe=textcraft_grpo_tiny rollout.agent=agentrl.agents.textcraft_openai:run_episode \
    rollout.expert_guidance=false

Each step: the prompt that agentrl's own loop would show (the same task line, history window,
admissible actions and ``<think>``/``<action>`` instruction, as one user message), one chat call,
the action parsed from ``<action>...</action>`` and sent to the environment. The reward: the
success reward (10) at the winning step, minus 0.1 for each step whose reply held no valid action,
reported per call (``step_rewards``), so step-level estimators see where the episode was won.
"""

from __future__ import annotations

from agentrl.gateway.agents import AgentTask
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, task_text

SUCCESS_REWARD = 10.0
INVALID_PENALTY = 0.1


def run_episode(task: AgentTask, history_length: int = 2, style: str = "compact") -> dict:
    import openai

    client = openai.OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0, timeout=300)
    obs, info = task.env.reset()
    first_obs, first_info = obs, info
    history, rewards, won = History(), [], False
    for _ in range(task.max_steps):
        text = build_prompt_text(task.env_name, task_text(task.env_name, first_obs, first_info, info), obs, history,
                                 list(info.get("admissible_actions", [])), history_length=history_length,
                                 think=True, style=style)
        reply = client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": text}],
                                               extra_body={"agentrl": {"anchor": obs}})
        parsed = parse_response(reply.choices[0].message.content or "", task.env_name, require_think=False)
        next_obs, _, done, next_info = task.env.step(parsed.action)
        won = bool(next_info.get("won", False))
        rewards.append((SUCCESS_REWARD if won else 0.0) - (0.0 if parsed.valid else INVALID_PENALTY))
        history.add(obs, parsed.action)
        obs, info = next_obs, next_info
        if done or won:
            break
    return {"reward": sum(rewards), "won": won, "step_rewards": rewards}
