"""Token-in/token-out: a conversation's prompt keeps the ids that were sampled, where re-tokenizing its
text would not; tool calls in Qwen2.5's format."""

from __future__ import annotations

import json

import pytest

from agentrl.gateway import ConversationRenderer, SampledReply, parse_tool_calls, qwen_tool_messages
from agentrl.gateway.tools import calls_key
from tiny_policy import textcraft_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return textcraft_tokenizer(vocab_size=400)


def char_ids(tokenizer, text: str) -> list[int]:
    """``text`` sampled one character per token: ids that re-tokenizing the text never gives back."""
    return [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(c)[0]) for c in text]


def test_the_sampled_ids_survive_where_retokenizing_changes_them(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    user = [{"role": "user", "content": "Goal: craft stick."}]
    first = renderer.prompt(user)
    assert first.ids == renderer.naive_ids(user) and first.tokenized == [True]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled = char_ids(tokenizer, "inventory") + [im_end]
    reply = SampledReply("inventory", calls_key(None), sampled)
    conversation = user + [{"role": "assistant", "content": "inventory"}, {"role": "user", "content": "Inventory: []"}]
    second = renderer.prompt(conversation, sampled=[reply])
    # the first prompt, the reply as sampled, then the rest of the conversation as the template writes it
    assert second.ids[:len(first.ids) + len(sampled)] == first.ids + sampled
    assert tokenizer.decode(second.ids) == second.text and second.tokenized == [True, False, True]
    naive = renderer.naive_ids(conversation)
    assert tokenizer.decode(naive) == second.text and naive != second.ids   # same text, other tokens
    # an edited reply is not the sampled one: tokenized and marked
    edited = user + [{"role": "assistant", "content": "inventory "}, conversation[2]]
    assert renderer.prompt(edited, sampled=[reply]).tokenized == [True, True, True]


def test_a_reply_cut_by_max_tokens_keeps_the_templates_footer(tokenizer):
    renderer = ConversationRenderer(tokenizer)
    user = [{"role": "user", "content": "Goal: craft stick."}]
    sampled = char_ids(tokenizer, "craft")                    # no stop token: the template closes the turn
    conversation = user + [{"role": "assistant", "content": "craft"}, {"role": "user", "content": "ok"}]
    prompt = renderer.prompt(conversation, sampled=[SampledReply("craft", calls_key(None), sampled)])
    assert tokenizer.decode(prompt.ids) == prompt.text
    assert prompt.ids[len(renderer.prompt(user).ids):][:len(sampled)] == sampled


def test_tool_calls_are_parsed_and_rendered_in_qwen_format(tokenizer):
    text = 'Let me look.\n<tool_call>\n{"name": "search", "arguments": {"query": "oak"}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me look." and parsed.invalid_tool_calls == 0
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["search"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"query": "oak"}
    broken = parse_tool_calls('<tool_call>\n{"name": "search", "arguments": {"query": </tool_call>')
    assert broken.tool_calls == [] and broken.invalid_tool_calls == 1 and broken.content.startswith("<tool_call>")

    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Shop."}, {"role": "user", "content": "buy oak"},
                {"role": "assistant", "content": None, "tool_calls": parsed.tool_calls},
                {"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"], "content": "3 results"},
                {"role": "tool", "tool_call_id": "x", "content": "page 2"}]
    written = qwen_tool_messages(messages, tools)
    assert written[0]["role"] == "system" and written[0]["content"].startswith("Shop.\n\n# Tools")
    assert '"name": "search"' in written[0]["content"]
    assert written[2]["content"] == '<tool_call>\n{"name": "search", "arguments": {"query": "oak"}}\n</tool_call>'
    assert written[3] == {"role": "user", "content": "<tool_response>\n3 results\n</tool_response>\n"
                                                     "<tool_response>\npage 2\n</tool_response>"}
    # the agent re-serialises the arguments: still the reply the gateway sampled
    reply = SampledReply(None, calls_key(parsed.tool_calls), char_ids(tokenizer, "x"))
    echoed = dict(messages[2], tool_calls=[{"id": "c", "type": "function",
                                             "function": {"name": "search", "arguments": '{"query":"oak"}'}}])
    assert reply.matches(echoed)
    prompt = ConversationRenderer(tokenizer).prompt(messages[:2] + [echoed] + messages[3:], tools, [reply])
    assert prompt.tokenized == [True, True, False, True, True]
