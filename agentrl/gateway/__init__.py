"""An OpenAI-compatible HTTP server in front of a generation back end, so that agents written outside
agentrl (with the ``openai`` client or any HTTP library) are trained with step-level credit: every
chat call is one step of its episode, recorded token in, token out (docs/agents.md).

This package serves only: the endpoint (``server.py``), token-in/token-out prompts
(``conversation.py``), Qwen2.5 tool calls (``tools.py``), episodes, keys and the request batcher
(``episodes.py``). The agents it serves and the rollout engine that plays them are in
:mod:`agentrl.rollout.agents`, which imports this package and never the other way round."""

from agentrl.gateway.conversation import ConversationRenderer, RenderedPrompt, SampledReply
from agentrl.gateway.tools import ParsedReply, parse_tool_calls, qwen_tool_messages

__all__ = ["ConversationRenderer", "ParsedReply", "RenderedPrompt", "SampledReply", "parse_tool_calls",
           "qwen_tool_messages"]
