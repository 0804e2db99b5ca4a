"""Token-in/token-out: the prompt ids of a chat request, with every reply the gateway sampled kept as the
exact ids that were sampled.

An agent sends the whole conversation back with each request, as text. Rendering it with the chat
template and tokenizing the result gives the ids the *text* tokenizes to, which need not be the ids
the policy sampled (a BPE tokenizer may sample ``"ab"`` as ``"a" + "b"``; a tool call's JSON comes back
re-serialised): training on those would train on tokens the policy never produced. So the prompt is
built message by message (:meth:`ConversationRenderer.prompt`):

* the template renders the conversation's prefixes; each message's share of the text is its
  segment (templates that render a prefix as the start of the longer conversation, Qwen2.5's and
  most chat templates; one that does not falls back to tokenizing the whole text, said in
  ``RenderedPrompt.token_in_token_out``);
* an assistant message the gateway generated in this episode (the same content and tool calls,
  matched in order) is the template's assistant header, **the sampled ids**, and the template's
  footer (the part of it that the sampled stop token already wrote left out); the header and footer
  come from rendering a placeholder in its place, so they hold whatever the template puts around a
  reply;
* every other message (system, user, tool results, an assistant message the gateway did not
  generate or that the agent edited) is its segment tokenized, and marked (``RenderedPrompt.tokenized``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from agentrl.gateway.tools import calls_key, qwen_tool_messages

PLACEHOLDER = "\u2063agentrl-reply\u2063"      # never in real text (invisible separator characters)


@dataclass
class SampledReply:
    """A reply the gateway returned: what it said, and the ids it sampled for it."""

    content: str | None
    tool_calls_key: str
    token_ids: list[int]

    def matches(self, message: dict[str, Any]) -> bool:
        return ((message.get("content") or None) == (self.content or None)
                and calls_key(message.get("tool_calls")) == self.tool_calls_key)


@dataclass
class RenderedPrompt:
    ids: list[int]
    #: per request message: False when its ids are the sampled ones, True when tokenized here
    tokenized: list[bool] = field(default_factory=list)
    token_in_token_out: bool = True          # False: the template is not prefix-stable, all was tokenized
    text: str = ""                           # the rendered conversation with the generation prompt
    #: ids of the leading system message (the instructions and tools), 0 when there is none or the
    #: template is not prefix-stable: what a left truncation keeps before the conversation's last tokens
    system_len: int = 0


class PromptOverLimit(ValueError):
    """The prompt passed the token limit it was built against (it was not tokenized to its end)."""

    def __init__(self, limit: int):
        super().__init__(f"the prompt has more than {limit} tokens")
        self.limit = limit


class ConversationRenderer:
    """Prompt ids of chat requests for one tokenizer (module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        # a fast tokenizer's Rust encoder, called through encode_batch, which releases the interpreter
        # lock while it works (long prompts of many agents are tokenized in parallel, beside the engine)
        self._rust = getattr(tokenizer, "backend_tokenizer", None)
        template = getattr(tokenizer, "chat_template", None) or ""
        self.template_takes_tools = "tools" in template

    def _messages(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
                  ) -> tuple[list[dict[str, Any]], list[Any]]:
        """What the template renders, and ``tools`` for it (written into the messages when it cannot)."""
        if self.template_takes_tools:
            return [dict(m) for m in messages], list(tools or [])
        return qwen_tool_messages(messages, tools), []

    def render(self, messages: Sequence[dict[str, Any]], tools: Sequence[Any], generation: bool) -> str:
        if not messages:
            return ""
        kwargs = {"tools": list(tools)} if tools else {}
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation,
                                                  **kwargs)

    def _ids(self, text: str) -> list[int]:
        if not text:
            return []
        if self._rust is not None:
            return list(self._rust.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def naive_ids(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        """The whole conversation rendered and tokenized at once (what re-tokenizing gives)."""
        rendered, template_tools = self._messages(messages, tools)
        return self._ids(self.render(rendered, template_tools, True))

    def prompt(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None,
               sampled: Sequence[SampledReply] = (), stop_over: int | None = None) -> RenderedPrompt:
        """The ids to generate from for ``messages`` (+ the generation prompt), reusing ``sampled``;
        :class:`PromptOverLimit` as soon as they pass ``stop_over`` tokens (the rest is not tokenized)."""
        rendered, template_tools = self._messages(messages, tools)
        # the request's assistant messages map in order onto the rendered ones (tools keep them 1:1)
        unused = list(sampled)
        reuse: list[SampledReply | None] = []
        for message in messages:
            if message.get("role") != "assistant":
                continue
            match = next((s for s in unused if s.matches(message)), None)
            if match is not None:
                unused = unused[unused.index(match) + 1:]
            reuse.append(match)
        full = self.render(rendered, template_tools, True)
        texts = [""] + [self.render(rendered[:k], template_tools, False) for k in range(1, len(rendered) + 1)]
        if not all(texts[k].startswith(texts[k - 1]) for k in range(1, len(texts))) or not full.startswith(texts[-1]):
            ids = self._ids(full)
            if stop_over is not None and len(ids) > stop_over:
                raise PromptOverLimit(stop_over)
            return RenderedPrompt(ids, [True] * len(messages), False, full)
        ids: list[int] = []
        assistant, system_len = 0, 0
        for k, message in enumerate(rendered, start=1):
            segment = texts[k][len(texts[k - 1]):]
            reply = None
            if message["role"] == "assistant":
                reply = reuse[assistant] if assistant < len(reuse) else None
                assistant += 1
            if reply is None:
                ids += self._ids(segment)
                if k == 1 and message["role"] == "system":
                    system_len = len(ids)
            else:
                ids += self._reply_ids(rendered[:k - 1], template_tools, texts[k - 1], reply)
            if stop_over is not None and len(ids) > stop_over:
                raise PromptOverLimit(stop_over)
        ids += self._ids(full[len(texts[-1]):])
        if stop_over is not None and len(ids) > stop_over:
            raise PromptOverLimit(stop_over)
        tokenized, assistant = [], 0
        for message in messages:
            if message.get("role") == "assistant":
                tokenized.append(reuse[assistant] is None)
                assistant += 1
            else:
                tokenized.append(True)
        return RenderedPrompt(ids, tokenized, True, full, system_len)

    def _reply_ids(self, before: list[dict[str, Any]], tools: list[Any], before_text: str,
                   reply: SampledReply) -> list[int]:
        """Header ids, the sampled ids, footer ids (without what the sampled stop token wrote)."""
        marked = self.render(before + [{"role": "assistant", "content": PLACEHOLDER}], tools, False)
        segment = marked[len(before_text):]
        if not marked.startswith(before_text) or segment.count(PLACEHOLDER) != 1:
            raise ValueError("the chat template does not render an assistant reply as header + content + footer")
        header, footer = segment.split(PLACEHOLDER)
        tail = self.tokenizer.decode(reply.token_ids[-1:], skip_special_tokens=False) if reply.token_ids else ""
        if tail and footer.startswith(tail) and reply.token_ids[-1] in getattr(self.tokenizer, "all_special_ids", ()):
            footer = footer[len(tail):]
        return self._ids(header) + list(reply.token_ids) + self._ids(footer)


__all__ = ["ConversationRenderer", "PLACEHOLDER", "PromptOverLimit", "RenderedPrompt", "SampledReply"]
