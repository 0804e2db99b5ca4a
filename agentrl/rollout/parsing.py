"""Parse a model response into an environment action, the reference framework's way.

The action is the text between the first ``<action>`` and the first ``</action>`` after it,
stripped (and lower-cased for ALFWorld and WebShop, whose commands are lower case). A response is
invalid when a tag is missing, when thinking is required and ``<think>``/``</think>`` are
missing, or when it contains CJK characters. An invalid response still sends a fallback
action to the environment (the last ``fallback_chars`` characters, as verl-agent does), so the
episode goes on and the step carries the invalid-format penalty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_ACTION_CHARS = 512
FALLBACK_CHARS = {"alfworld": 30, "webshop": 20, "textcraft": 30}
LOWERCASE_ENVS = ("alfworld", "webshop")


@dataclass(frozen=True)
class ParsedAction:
    action: str
    valid: bool
    thought: str | None = None
    reason: str = ""


def parse_response(text: str, env_name: str = "", require_think: bool = False) -> ParsedAction:
    """Extract the action from ``text``; never raises."""
    text = text if isinstance(text, str) else ""
    fallback = _CONTROL.sub("", text[-FALLBACK_CHARS.get(env_name, 30):]).strip()
    lowered = text.lower()
    start = lowered.find("<action>")
    end = lowered.find("</action>", start + len("<action>")) if start >= 0 else -1
    if start < 0 or end < 0:
        return ParsedAction(fallback, False, reason="missing <action>...</action>")
    body = text[start + len("<action>"):end]
    if env_name in LOWERCASE_ENVS:
        body = body.lower()
    action = _CONTROL.sub("", body).strip()
    thought = None
    t_start = lowered.find("<think>")
    t_end = lowered.find("</think>", t_start + len("<think>")) if t_start >= 0 else -1
    if t_start >= 0 and t_end >= 0:
        thought = text[t_start + len("<think>"):t_end].strip()
    if require_think and thought is None:
        return ParsedAction(action[:MAX_ACTION_CHARS], False, reason="missing <think>...</think>")
    if _CJK.search(text):
        return ParsedAction(action[:MAX_ACTION_CHARS], False, thought, reason="CJK characters in the response")
    if "<action>" in action.lower() or not action:
        return ParsedAction(action[:MAX_ACTION_CHARS], False, thought, reason="empty or nested action")
    if len(action) > MAX_ACTION_CHARS:
        return ParsedAction(action[:MAX_ACTION_CHARS], False, thought, reason="action longer than the limit")
    return ParsedAction(action, True, thought)
