"""Prompt building (history window, templates) and response parsing (validity, fallbacks)."""

import pytest
from hypothesis import given, settings, strategies as st

from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, format_response, task_text


def test_first_step_prompt_has_task_observation_actions_and_instruction():
    text = build_prompt_text("alfworld", "put a clean mug in coffeemachine.", "You are in the middle of a room.",
                             History(), ["go to cabinet 1", "help", "look"], history_length=2, think=True)
    assert "ALFRED Embodied Environment" in text and "Your task is to: put a clean mug in coffeemachine." in text
    assert "Your current observation is: You are in the middle of a room." in text
    assert "\n go to cabinet 1\n look\n" in text and "help" not in text  # help is dropped, one per line
    assert "<think> </think>" in text and "<action> </action>" in text
    assert "Prior to this step" not in text


def test_history_window_shows_only_the_last_k_steps():
    history = History()
    for i in range(4):
        history.add(f"obs{i}", f"act{i}")
    text = build_prompt_text("textcraft", "craft stick.", "obs4", history, [], history_length=2, think=False)
    assert "already taken 4 step(s)" in text and "most recent 2 observations" in text
    assert "[Observation 3: 'obs2', Action 3: 'act2']" in text and "[Observation 4: 'obs3', Action 4: 'act3']" in text
    assert "obs1" not in text and "You are now at step 5 and your current observation is: obs4" in text
    assert "<think>" not in text
    compact = build_prompt_text("textcraft", "craft stick.", "obs4", history, ["inventory"], history_length=2,
                                think=False, style="compact")
    assert compact.startswith("Task: craft stick.") and "act2" in compact and "act1" not in compact
    assert len(compact) < len(text)
    # compact_task_last: the same lines, the task moved after the observation and admissible list
    last = build_prompt_text("textcraft", "craft stick.", "obs4", history, ["inventory"], history_length=2,
                             think=False, style="compact_task_last")
    assert sorted(last.split("\n")) == sorted(compact.split("\n"))
    assert last.split("\n")[-2:] == ["Task: craft stick.", "Answer with <action> </action>."]
    assert last.index("Observation: obs4") < last.index("Admissible actions") < last.index("Task:")
    with pytest.raises(ValueError, match="compact_task_last"):
        build_prompt_text("textcraft", "craft stick.", "obs4", history, [], style="tiny")


def test_counted_history_merges_a_run_of_identical_steps_and_counts_them():
    history = History()
    steps = [("commands", "get 12 glowstone dust"), ("Got 12 glowstone dust", "craft 1 glowstone using 4 glowstone dust"),
             ("Crafted 1 minecraft:glowstone", "craft 1 glowstone using 4 glowstone dust"),
             ("Crafted 1 minecraft:glowstone", "craft 1 glowstone using 4 glowstone dust"),
             ("Crafted 1 minecraft:glowstone", "craft 1 glowstone using 4 glowstone dust")]
    for obs, action in steps:
        history.add(obs, action)
    failed = "Could not find enough items to craft minecraft:glowstone"
    # the fourth craft failed: its result differs, so it stays an entry of its own
    assert history.entries(failed, count_repeats=True) == [(0, 1), (1, 3), (4, 1)]
    assert history.entries("Crafted 1 minecraft:glowstone", count_repeats=True) == [(0, 1), (1, 4)]
    assert history.entries(failed) == [(i, 1) for i in range(5)]
    text = build_prompt_text("textcraft", "commands", failed, history, [], history_length=2, think=False,
                             style="compact", count_repeats=True)
    assert "Last 4 of 5 steps:" in text        # two entries, covering steps 2-5
    assert ("[Observation 2: 'Got 12 glowstone dust', Actions 2-4: 'craft 1 glowstone using 4 glowstone dust' "
            "(3 times)]\n[Observation 5: 'Crafted 1 minecraft:glowstone', Action 5: 'craft 1 glowstone using 4 "
            "glowstone dust']\nObservation: " + failed) in text
    assert "get 12" not in text
    full = build_prompt_text("textcraft", "commands", failed, history, [], history_length=2, think=False,
                             count_repeats=True)
    assert "most recent 4 observations" in full and "(3 times)" in full
    # off (the default), the prompt is the step-by-step window
    plain = build_prompt_text("textcraft", "commands", failed, history, [], history_length=2, think=False,
                              style="compact")
    assert "Last 2 of 5 steps:" in plain and "times)" not in plain and "Observation 4:" in plain


def test_counted_history_with_a_zero_window_shows_nothing():
    history = History()
    history.add("commands", "inventory")
    text = build_prompt_text("textcraft", "commands", "Inventory: empty", history, [], history_length=0,
                             think=False, style="compact", count_repeats=True)
    assert "steps:" not in text and "Observation: Inventory: empty" in text


def test_webshop_prompt_quotes_actions_and_adds_its_advice():
    text = build_prompt_text("webshop", "i need a red shirt", "WebShop [SEP] Search", History(),
                             ["search[<your query>]", "click[next >]"], think=True)
    assert "'search[<your query>]', 'click[next >]'" in text and "shopping goal" in text


def test_task_text_is_the_current_steps_task_except_for_textcraft():
    reset = {"task": "Not visited yet: a 1, b 1.\nYour task is to: put a c in b."}
    step = {"task": "Not visited yet: b 1.\nYour task is to: put a c in b."}
    assert task_text("alfworld", "obs", reset) == reset["task"]
    assert task_text("alfworld", "obs", reset, step) == step["task"]
    assert task_text("alfworld", "obs", reset, {"admissible_actions": []}) == reset["task"]  # no task: the reset's
    # TextCraft's task is its first observation (the crafting commands) on every step
    assert task_text("textcraft", "Crafting commands: ...", {"task": "x"}, {"task": "y"}) == "Crafting commands: ..."


def test_parse_valid_response_with_and_without_thinking():
    r = parse_response("<think>go</think><action> Go To Cabinet 1 </action>", "alfworld", require_think=True)
    assert (r.action, r.valid, r.thought) == ("go to cabinet 1", True, "go")
    r = parse_response("<action>craft 4 stick using 2 oak planks</action>", "textcraft")
    assert r.valid and r.action == "craft 4 stick using 2 oak planks"
    assert format_response("get 1 oak logs") == "<action>get 1 oak logs</action>"


def test_parse_invalid_responses_fall_back_to_the_tail_of_the_text():
    r = parse_response("I think I should look around the room and then act", "alfworld")
    assert not r.valid and r.action == "ook around the room and then act"[-30:]
    r = parse_response("<action>look</action>", "alfworld", require_think=True)
    assert not r.valid and r.action == "look" and "think" in r.reason
    assert not parse_response("<think>x</think><action>去厨房</action>", "alfworld").valid
    assert not parse_response("<action></action>", "textcraft").valid
    assert not parse_response("<action>look", "alfworld").valid


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000) | st.builds(lambda a, b: a + "<action>" + b, st.text(max_size=50), st.text(max_size=50)))
def test_parser_never_raises_and_bounds_the_action(text):
    r = parse_response(text, "alfworld", require_think=True)
    assert isinstance(r.action, str) and len(r.action) <= 512
    assert "\x00" not in r.action


def test_parser_handles_huge_and_control_character_input():
    r = parse_response("<action>" + "a" * 10_000 + "</action>", "textcraft")
    assert not r.valid and len(r.action) == 512
    r = parse_response("<action>look\x00\x07</action>", "alfworld")
    assert r.valid and r.action == "look"
