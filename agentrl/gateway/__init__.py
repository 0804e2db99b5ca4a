"""An OpenAI-compatible gateway in front of the rollout engines, so that agents written outside agentrl
(with the ``openai`` client or any HTTP library) are trained with step-level credit: every chat
call is one step of its episode, recorded token in, token out (docs/agents.md)."""

from agentrl.gateway.conversation import ConversationRenderer, RenderedPrompt, SampledReply
from agentrl.gateway.tools import ParsedReply, parse_tool_calls, qwen_tool_messages

__all__ = ["ConversationRenderer", "ParsedReply", "RenderedPrompt", "SampledReply", "parse_tool_calls",
           "qwen_tool_messages"]
