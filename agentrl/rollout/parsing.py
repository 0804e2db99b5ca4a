"""Parse a model response into an environment action, the reference framework's way.

The action is the text between the first ``<action>`` and the first ``</action>`` after it,
stripped (and lower-cased for environments whose commands are lower case: their spec's
``actions.lowercase``, :class:`agentrl.envs.spec.ActionSpec`). A response is
invalid when a tag is missing, when thinking is required and ``<think>``/``</think>`` are
missing, or when it contains CJK characters. An invalid response still sends a fallback
action to the environment (the last ``actions.fallback_chars`` characters, as verl-agent does), so the
episode goes on and the step carries the invalid-format penalty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrl.envs.spec import env_spec_or_default

_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
MAX_ACTION_CHARS = 512


@dataclass(frozen=True)
class ParsedAction:
    action: str
    valid: bool
    thought: str | None = None
    reason: str = ""


def parse_response(text: str, env_name: str = "", require_think: bool = False) -> ParsedAction:
    """Extract the action from ``text``; never raises."""
    text = text if isinstance(text, str) else ""
    declared = env_spec_or_default(env_name).actions
    fallback = _CONTROL.sub("", text[-declared.fallback_chars:]).strip()
    lowered = text.lower()
    start = lowered.find("<action>")
    end = lowered.find("</action>", start + len("<action>")) if start >= 0 else -1
    if start < 0 or end < 0:
        return ParsedAction(fallback, False, reason="missing <action>...</action>")
    body = text[start + len("<action>"):end]
    if declared.lowercase:
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


def shown_action(action: str, env_name: str = "") -> str:
    """``action`` as the parser would return it from ``<action>action</action>`` (lower-cased for an
    environment that declares ``actions.lowercase``): how expert actions are written into responses."""
    return action.lower() if env_spec_or_default(env_name).actions.lowercase else action
