"""Fault 3 at the engine level: a labelled test backend returns fuzzed token sequences (empty, 10k
characters, unicode, unclosed or nested tags, control characters, arbitrary token ids) and drives
a real rollout against the real TextCraft pool. No crash; every response without a well-formed
action is marked invalid and carries the penalty. (The parser alone is fuzzed in
tests/rollout/test_prompts_parsing.py.)"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from agentrl.config.schema import EnvConfig, RolloutConfig
from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.rollout.engine import RolloutEngine
from reliability_kit import ScriptedTextBackend, record_figures

PENALTY = 0.25
SHAPES = st.one_of(
    st.just(""), st.just("x" * 10_000), st.text(max_size=300),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=31), max_size=50),
    st.builds(lambda a, b: f"<think>{a}</think><action>{b}", st.text(max_size=40), st.text(max_size=40)),
    st.builds(lambda a: f"<action><action>{a}</action></action>", st.text(max_size=40)),
    st.builds(lambda a: f"<think>{a}<action>look</think></action>", st.text(max_size=40)),
    st.just("<think>日本語 🙂 العربية</think><action>去厨房</action>"),
)
FIXED_CASES = ["", "x" * 10_000, "\x00\x07\x1b[2J", "<think>a</think><action>get 1 oak logs",
               "<action><action>look</action></action>",
               "<think>日本語 🙂 العربية</think><action>去厨房</action>", "</action>craft<action>"]


def _engine(tokenizer, backend):
    rollout_cfg = RolloutConfig(max_response_tokens=16, prompt_style="compact", max_prompt_tokens=4000,
                                invalid_action_penalty=PENALTY)
    env_cfg = EnvConfig(name="textcraft", max_steps=2, group_size=2, tasks_per_iteration=1, history_length=1)
    return RolloutEngine(backend, tokenizer, EnvClient.local("textcraft", 2), rollout_cfg, env_cfg)


def _check(result) -> tuple[int, int]:
    """Every invalid step carries exactly the penalty; returns (responses, invalid)."""
    batch = result.batch
    for valid, reward in zip(batch.action_valid.tolist(), batch.reward.tolist()):
        if not valid:
            assert reward == -PENALTY  # TextCraft is not won by a fallback action in 2 steps
    return len(batch), int((~batch.action_valid.bool()).sum())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(SHAPES, min_size=1, max_size=4))
def test_fuzzed_responses_drive_a_rollout_without_a_crash(tokenizer, texts):
    _check(_engine(tokenizer, ScriptedTextBackend(tokenizer, texts)).run([TaskRef("train", 0)], 2, seed=0))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.lists(st.integers(min_value=0, max_value=399), max_size=64), min_size=1, max_size=3))
def test_arbitrary_token_ids_drive_a_rollout_without_a_crash(tokenizer, ids):
    _check(_engine(tokenizer, ScriptedTextBackend(tokenizer, [], raw_ids=ids)).run([TaskRef("train", 1)], 2))


def test_fuzz_figures(tokenizer):
    responses = invalid = 0
    for i, text in enumerate(FIXED_CASES):
        n, bad = _check(_engine(tokenizer, ScriptedTextBackend(tokenizer, [text])).run([TaskRef("train", i)], 2))
        responses, invalid = responses + n, invalid + bad
    assert invalid == responses  # none of these shapes is a well-formed action
    record_figures("fuzzed model output through the engine (fixed cases)", rollouts=len(FIXED_CASES),
                   responses=responses, invalid_with_penalty=invalid, crashes=0)
