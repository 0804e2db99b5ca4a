"""The prompts, task lines and parsed actions of the three environments are byte-identical to
those of the code before environments became plug-ins (their pieces moved from shared tables into
each environment's spec): ``data/prompts_golden.json`` was written by ``golden()`` below on that
code, for fixed synthetic inputs of every prompt style and a real TextCraft expert episode.

Rewrite the file only on purpose (a prompt change): ``python tests/rollout/test_prompts_golden.py``."""

import json
import sys
from pathlib import Path

from agentrl.envs import TaskRef, make_env
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, task_text

GOLDEN = Path(__file__).with_name("data") / "prompts_golden.json"


def golden() -> dict:
    out = {}
    RESPONSES = ["<think>go</think><action>Take Apple From Table 1</action>", "no tags at all, a long answer text here",
                 "<action>  GET 1 Oak Log </action>", "<action></action>", "<think>x</think>"]
    ADMISSIBLE = ["go to table 1", "take apple from table 1", "help", "inventory"]
    for env in ("alfworld", "webshop", "textcraft"):
        reset_info = {"task": f"the {env} task"}
        step_info = {"task": f"the {env} task, step"}
        h = History()
        h.add("first observation", "go to table 1")
        h.add("second observation", "go to table 1")
        h.add("second observation", "take apple from table 1")
        for style in ("full", "compact", "compact_task_last"):
            for think in (True, False):
                for hist in (History(), h):
                    for admissible in ([], ADMISSIBLE):
                        for k, count in ((2, False), (3, True), (0, False)):
                            task = task_text(env, "first observation", reset_info, step_info if len(hist) else None)
                            key = f"{env}|{style}|{think}|{len(hist)}|{len(admissible)}|{k}|{count}"
                            out[key] = build_prompt_text(env, task, "current observation", hist, admissible,
                                                         history_length=k, think=think, style=style, count_repeats=count)
        for i, r in enumerate(RESPONSES):
            for req in (True, False):
                p = parse_response(r, env, require_think=req)
                out[f"{env}|parse|{i}|{req}"] = [p.action, p.valid, p.thought, p.reason]
    # a real TextCraft episode: the expert's plan, prompt per step
    e = make_env("textcraft", max_steps=40)
    for index in (0, 5):
        obs, info = e.reset(TaskRef("train", index))
        first_obs, first_info = obs, info
        h = History()
        for step, action in enumerate(e.expert_actions()[:6]):
            t = task_text("textcraft", first_obs, first_info, info)
            out[f"textcraft|episode|{index}|{step}"] = build_prompt_text("textcraft", t, obs, h, info["admissible_actions"])
            h.add(obs, action)
            obs, _, done, _, info = e.step(action)
            if done:
                break
    return out


def test_prompts_and_parsing_are_those_of_the_golden_file():
    expected = json.loads(GOLDEN.read_text())
    got = json.loads(json.dumps(golden()))
    assert got.keys() == expected.keys()
    different = [key for key in expected if got[key] != expected[key]]
    assert not different, f"{len(different)} prompts differ, e.g. {different[0]}:\n{got[different[0]]!r}\n{expected[different[0]]!r}"


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(golden(), indent=0, sort_keys=True))
    sys.exit(0)
