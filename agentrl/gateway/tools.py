"""OpenAI ``tools`` and ``tool_calls`` in Qwen2.5's format.

Qwen2.5 is trained to call tools as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
blocks after the function signatures were listed in its system prompt, and to read results in
``<tool_response>`` blocks of a user turn. A model whose chat template takes ``tools`` (the real
Qwen2.5 checkpoints) renders them itself; for one that does not (agentrl's tiny models) the same
text is produced here (:func:`qwen_tool_messages`), so both see one format.

:func:`parse_tool_calls` turns a generation into OpenAI ``tool_calls`` (arguments as a JSON string);
a block that is not a JSON object with a ``name`` and object ``arguments`` makes the whole reply
plain text and counts as an invalid action (``invalid_tool_calls``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
TOOLS_FOOTER = ("</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedReply:
    content: str | None                      # the text outside tool-call blocks (None when there is none)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    invalid_tool_calls: int = 0              # malformed blocks (the reply is then plain text)


def tools_system_text(tools: Sequence[dict[str, Any]], system: str | None) -> str:
    """The system prompt listing ``tools`` as Qwen2.5's template writes it."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return f"{system or QWEN_DEFAULT_SYSTEM}\n\n{TOOLS_HEADER}\n{listed}\n{TOOLS_FOOTER}"


def _name_and_arguments(call: dict[str, Any]) -> tuple[Any, Any]:
    """An OpenAI tool call's function name and its arguments parsed (a string that is not JSON as it is)."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return function.get("name"), arguments


def call_text(call: dict[str, Any]) -> str:
    """One OpenAI tool call (``{"function": {"name", "arguments"}}``) as a ``<tool_call>`` block."""
    name, arguments = _name_and_arguments(call)
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def qwen_tool_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
                       ) -> list[dict[str, Any]]:
    """``messages`` with tools written out for a chat template that does not take them: the tool list
    in the system prompt, assistant tool calls as ``<tool_call>`` blocks, ``tool`` messages as
    ``<tool_response>`` blocks of a user turn (consecutive ones in one turn, as Qwen2.5 does)."""
    out: list[dict[str, Any]] = []
    if tools:
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        out.append({"role": "system", "content": tools_system_text(tools, system)})
        messages = messages[1:] if system is not None else messages
    for message in messages:
        role = message["role"]
        if role == "assistant" and message.get("tool_calls"):
            parts = [message.get("content") or ""] + [call_text(c) for c in message["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        elif role == "tool":
            block = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
        else:
            out.append({"role": role, "content": message.get("content") or ""})
    return [{k: v for k, v in m.items() if k != "_tool_turn"} for m in out]


def parse_tool_calls(text: str) -> ParsedReply:
    """OpenAI ``tool_calls`` from a generation's ``<tool_call>`` blocks (module docstring)."""
    blocks = _CALL.findall(text)
    if not blocks:
        return ParsedReply(text)
    calls = []
    for block in blocks:
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError:
            return ParsedReply(text, [], len(blocks))
        if (not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str)
                or not isinstance(parsed.get("arguments", {}), dict)):
            return ParsedReply(text, [], len(blocks))
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": parsed["name"],
                                   "arguments": json.dumps(parsed.get("arguments", {}), ensure_ascii=False)}})
    content = _CALL.sub("", text).strip() or None
    return ParsedReply(content, calls)


def calls_key(tool_calls: Sequence[dict[str, Any]] | None) -> str:
    """Tool calls compared by name and parsed arguments (the agent may re-serialise the JSON)."""
    return json.dumps([list(_name_and_arguments(call)) for call in tool_calls or ()], sort_keys=True)


__all__ = ["ParsedReply", "call_text", "calls_key", "parse_tool_calls", "qwen_tool_messages", "tools_system_text"]
