"""WebShop played by an agent that calls tools, written with the ``openai`` client as an outside author would.

    agentrl train recipe=webshop_grpo_tiny rollout.agent=agentrl.agents.webshop_tools:run_episode \
    rollout.max_response_tokens=96 trainer.sft.enabled=false

(a tool call takes up to ~82 tokens with the tiny recipe's tokenizer; its SFT warm start teaches
agentrl's own ``<action>`` prompts, not tool calls).

WebShop's two actions are the agent's two function tools: ``search(query)`` sends ``search[query]``
and ``click(item)`` sends ``click[item]`` (a button, a product id or an option value of the current
page). The episode is one conversation: a system message, the first page as the user's message,
then per model call the assistant's reply as the gateway returned it (content and ``tool_calls``)
and one ``tool`` message per tool call (``tool_call_id`` matching) holding the page the action led
to. Every model call is one environment step:

* the reply's first tool call is the action; further calls in the same reply are answered "not
  run" (one action a turn);
* a reply without a usable call (plain text, a malformed ``<tool_call>`` block, another function,
  a missing argument) sends ``NO_ACTION``, which WebShop ignores like any text that is not
  ``search[...]`` or ``click[...]``; the step is charged the run's invalid-action penalty (by the
  gateway for a malformed block, which it already counts, else here in ``step_rewards``) and the
  next message nudges the model back to the tools.

Rewards follow the run's ``env.reward`` (``task.extra["loop"]``): ``success`` = ``env.success_reward``
at the step the purchase wins, ``env`` = the purchase score at the buy step.

The conversation grows by a page per step; the prompt keeps the system and first user messages and
the last ``keep_turns`` turns (``task.extra["keep_turns"]``, default the run's ``env.history_length``,
as agentrl's own loop shows the last K steps), so it stays within ``rollout.max_prompt_tokens``.
(Past that limit the gateway refuses the call, failing the episode, or with
``rollout.prompt_truncation=left`` keeps the prompt's last tokens, cutting off the tool list.)
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentrl.rollout.agents.task import AgentTask

SYSTEM = ("You are an expert autonomous agent operating in the WebShop e-commerce environment. Buy the product the "
          "instruction asks for: search for it, click a product on the results, click the options it asks for, "
          "then click 'buy now'. Call one tool per turn.")
TOOLS = [
    {"type": "function", "function": {
        "name": "search", "description": "Search the shop (allowed on every page).",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "click", "description": "Click a button, product id or option shown on the page, e.g. 'buy now'.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]}}},
]
ARGUMENT = {"search": "query", "click": "item"}
NO_ACTION = "no action"        # not search[...] or click[...]: WebShop changes nothing
NUDGE = "Call the search or click tool. The page:\n"
NOT_RUN = "Not run: one action per turn."
_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)      # what the gateway parses (and counts if malformed)


def action_of(call: Any) -> tuple[str | None, str]:
    """A tool call's WebShop action (``None`` when unusable) and, for an unusable one, why."""
    function = getattr(call, "function", None)
    name = getattr(function, "name", None)
    if name not in ARGUMENT:
        return None, f"Error: no tool {name!r}; use search or click."
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError:
        arguments = None
    value = arguments.get(ARGUMENT[name]) if isinstance(arguments, dict) else None
    if not isinstance(value, str) or not value.strip():
        return None, f"Error: {name} needs a non-empty string {ARGUMENT[name]!r}."
    return f"{name}[{value.strip()}]", ""


def run_episode(task: AgentTask) -> dict:
    if task.env is None:
        raise RuntimeError("the WebShop tool agent plays agentrl's webshop environment (task.env)")
    loop = {"history_length": 2, "success_reward": 10.0, "reward": "success", "invalid_action_penalty": 0.1,
            **task.extra.get("loop", {})}
    keep = max(1, int(task.extra.get("keep_turns", loop["history_length"])))
    client = task.openai_client(timeout=300)     # openai.OpenAI(base_url=task.base_url, api_key=task.api_key), pooled
    obs, _ = task.env.reset()
    head = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": obs}]
    turns: list[list[dict[str, Any]]] = []
    rewards: list[float] = []
    valid: list[bool] = []
    won = False
    for _ in range(task.max_steps):
        messages = head + [m for turn in turns[-keep:] for m in turn]
        reply = client.chat.completions.create(model=task.model, messages=messages, tools=TOOLS,
                                               extra_body={"agentrl": {"anchor": obs}})
        message = reply.choices[0].message
        calls = [c for c in message.tool_calls or [] if getattr(c, "function", None) is not None]
        action, error = action_of(calls[0]) if calls else (None, "")
        obs, env_reward, done, info = task.env.step(action or NO_ACTION)
        won_now = bool(info.get("won", False))
        if loop["reward"] == "env":
            reward = env_reward
        else:
            reward = loop["success_reward"] if won_now and not won else 0.0
        won = won or won_now
        charged = not calls and _BLOCK.search(message.content or "")      # the gateway charged it already
        rewards.append(reward - (loop["invalid_action_penalty"] if action is None and not charged else 0.0))
        valid.append(action is not None)
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            assistant["tool_calls"] = [{"id": c.id, "type": "function",
                                        "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                       for c in calls]
            results = [f"{error}\nThe page:\n{obs}" if error else obs] + [NOT_RUN] * (len(calls) - 1)
            turns.append([assistant] + [{"role": "tool", "tool_call_id": c.id, "content": text}
                                        for c, text in zip(calls, results)])
        else:
            turns.append([assistant, {"role": "user", "content": NUDGE + obs}])
        if done:
            break
    return {"reward": sum(rewards), "won": won, "step_rewards": rewards, "step_valid": valid}
