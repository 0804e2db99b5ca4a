"""TextCraft played by a LangGraph agent (``langchain-openai``'s ``ChatOpenAI`` behind the gateway), as a
LangGraph user would write it: a graph with a model node and a tool node.

    pip install -e '.[agents]'          # langgraph and langchain-openai
    agentrl train recipe=textcraft_grpo_tiny rollout.agent=agentrl.agents.textcraft_langgraph:run_episode \
    rollout.expert_guidance=false

The graph: ``agent`` (the chat model with the tools bound) -> ``tools`` (LangGraph's prebuilt
``ToolNode``) when the reply calls tools, back to ``agent``; a reply without a tool call gets a
reminder (``remind``) and the model is asked again. TextCraft's commands are three tools that step
the episode's environment (``task.env``): ``get``, ``craft`` and ``inventory``. The graph ends when
the environment is done or after ``task.max_steps`` model calls (the gateway refuses more).

Each model call is one step of the episode. It sends the environment's current observation as the
step's anchor (``extra_body={"agentrl": {"anchor": obs}}``), and the prompt is the system message,
the task, and the last ``history_length`` turns (the run's ``env.history_length``, at least one), so
prompts stay bounded. Step rewards, one per call: the success reward at the call whose tool call won,
minus the invalid-action penalty for a call that took no valid action (no tool call, an unknown tool,
bad arguments), unless the gateway already charged it (a malformed ``<tool_call>`` block).

Tool calls of one reply run in order, one at a time (``max_concurrency=1``): they step one
environment. ``max_retries=0``: a retried call would be a second step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.rollout.agents.task import AgentTask

SYSTEM = ("You play TextCraft: craft the goal item. Use the tools: `get` fetches base items, `craft` makes an "
          "item with one of the listed crafting commands (its count, item and ingredients as written there), "
          "`inventory` lists what you carry. Call one tool at each turn.")
REMINDER = "Call one of the tools (get, craft or inventory) to act."
OVER = "The episode is over."


@dataclass
class Call:
    """What one model call did."""

    tool_calls: int = 0
    actions: int = 0            # tool calls that became environment commands
    won: bool = False           # its command won the episode
    gateway_invalid: bool = False


class TextCraftGame:
    """The episode's environment as the tools see it, and what each model call did."""

    def __init__(self, env: Any):
        if env is None:
            raise RuntimeError("this agent plays agentrl's TextCraft environment (task.env); the run has none")
        self.env = env
        self.obs, self.info = env.reset()
        self.done = self.won = False
        self.calls: list[Call] = []

    def act(self, command: str) -> str:
        call = self.calls[-1]
        call.actions += 1
        if self.done:
            return OVER
        self.obs, _, self.done, self.info = self.env.step(command)
        if self.info.get("won") and not self.won:
            self.won = call.won = True
        return self.obs

    def over(self, max_calls: int) -> bool:
        return self.done or len(self.calls) >= max_calls


def window(messages: list, turns: int) -> list:
    """The system message, the task, and the last ``turns`` turns (a turn: a model reply and what followed)."""
    starts = [i for i, m in enumerate(messages) if m.type == "ai"]
    if len(starts) <= turns:
        return messages
    return messages[:2] + messages[starts[-turns]:]


def run_episode(task: AgentTask, *, streaming: bool = False) -> dict:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    loop = {"history_length": 2, "success_reward": 10.0, "invalid_action_penalty": 0.1, **task.extra.get("loop", {})}
    game = TextCraftGame(task.env)

    @tool
    def get(count: int, item: str) -> str:
        """Get `count` of a base item, e.g. count=1, item="oak logs"."""
        return game.act(f"get {count} {item}")

    @tool
    def craft(count: int, item: str, ingredients: str) -> str:
        """Craft an item with one of the crafting commands, e.g. for `craft 4 oak planks using 1 oak logs`:
        count=4, item="oak planks", ingredients="1 oak logs"."""
        return game.act(f"craft {count} {item} using {ingredients}")

    @tool
    def inventory() -> str:
        """List the items you carry."""
        return game.act("inventory")

    tools = [get, craft, inventory]
    model = ChatOpenAI(model=task.model, base_url=task.base_url, api_key=task.api_key, max_retries=0, timeout=300,
                       streaming=streaming, use_responses_api=False).bind_tools(tools)
    turns = max(1, int(loop["history_length"]))

    def agent(state) -> dict:
        game.calls.append(Call())
        reply = model.invoke(window(state["messages"], turns), extra_body={"agentrl": {"anchor": game.obs}})
        game.calls[-1].tool_calls = len(reply.tool_calls)
        # the gateway returns a malformed <tool_call> block as text and charges it as an invalid action itself
        game.calls[-1].gateway_invalid = not reply.tool_calls and "<tool_call>" in str(reply.content)
        return {"messages": [reply]}

    def after_agent(state) -> str:
        if state["messages"][-1].tool_calls:
            return "tools"
        return END if game.over(task.max_steps) else "remind"

    def remind(state) -> dict:
        return {"messages": [HumanMessage(REMINDER)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_node("remind", remind)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", after_agent, ["tools", "remind", END])
    graph.add_conditional_edges("tools", lambda state: END if game.over(task.max_steps) else "agent", ["agent", END])
    graph.add_edge("remind", "agent")
    graph.compile().invoke({"messages": [SystemMessage(SYSTEM), HumanMessage(game.obs)]},
                           {"recursion_limit": 2 * task.max_steps + 4, "max_concurrency": 1})

    rewards, valid = [], []
    for call in game.calls:
        valid.append(call.tool_calls > 0 and call.actions == call.tool_calls)
        penalty = 0.0 if valid[-1] or call.gateway_invalid else loop["invalid_action_penalty"]
        rewards.append((loop["success_reward"] if call.won else 0.0) - penalty)
    return {"reward": sum(rewards), "won": game.won, "step_rewards": rewards, "step_valid": valid}
