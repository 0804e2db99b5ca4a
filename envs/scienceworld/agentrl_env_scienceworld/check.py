"""Identity check: agentrl's ScienceWorld environment against the engine called directly.

Three engines run side by side: one inside agentrl's environment (``make_env("scienceworld")``),
and two bare ``scienceworld.ScienceWorldEnv``: the *engine* and a *control*. Every episode loads
the same task type and variation in all three, then takes the same random valid actions (drawn
from the engine's valid-action list with a seeded generator), and compares after reset and after
every step: the observation, the score, the reward, done, and the valid-action list. Episodes
``0..N-1`` of a split are its first N tasks, which cycle through the 30 task types
(:mod:`agentrl_env_scienceworld.tasks`).

Two comparisons, both at every reset and step:

* **pass-through** (exact): agentrl's output against what its own engine returned for the same call
  (the engine's replies are recorded as they pass), and the loaded task type and variation against
  the address and the engine's own variation list for the split's set. Any difference fails the
  check: it would be agentrl changing the engine's observation, score, reward, done or actions.
* **independent engines**: agentrl against the bare engine (``differ``), and the control against
  the bare engine (``engine_self_differ``). All three JVMs start reproducible (the default,
  :mod:`agentrl_env_scienceworld.engine`), and any difference fails the check. With
  ``--nondeterministic`` they start with the JVM's default settings, under which the engine
  disagrees with itself (two engines given the same variation and actions sometimes build
  another world or name objects differently: ``blue paint in wood cup`` in one, ``blue paint on
  wood cup containing blue paint`` in the other); the counts are then reported, and only the
  pass-through comparison decides.

``--gold N`` also plays the engine's gold action sequence through agentrl's environment on N tasks
(again one per task type in turn) and reports each final score: a gold path should score 100.

    python -m agentrl_env_scienceworld.check --episodes 240 --steps 10 --split test --gold 30

Prints one JSON summary; exit status 1 when any comparison differed or a gold path did not win.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from agentrl.envs.base import TaskRef


FIELDS = ("obs", "score", "reward", "done", "valid")


def differing(ours: dict[str, Any], engine: dict[str, Any]) -> list[str]:
    return [key for key in FIELDS if key in ours and ours[key] != engine[key]]


def engine_view(obs: str, reward: float | None, done: bool, info: dict[str, Any]) -> dict[str, Any]:
    view = {"obs": obs, "score": info["score"], "done": bool(done), "valid": list(info["valid"])}
    if reward is not None:
        view["reward"] = float(reward)
    return view


def describe(ours: dict[str, Any], engine: dict[str, Any], keys: list[str]) -> str:
    """A short account of how the fields differ (the first differing line, the actions in one list only)."""
    parts = []
    for key in keys:
        if key == "obs":
            pairs = [(a, b) for a, b in zip(ours["obs"].split("\n"), engine["obs"].split("\n")) if a != b]
            parts.append(f"obs line {pairs[0][0]!r} vs {pairs[0][1]!r}" if pairs else "obs lengths differ")
        elif key == "valid":
            mine, theirs = set(ours["valid"]), set(engine["valid"])
            parts.append(f"valid: {len(mine - theirs)} only in agentrl ({sorted(mine - theirs)[:2]}), "
                         f"{len(theirs - mine)} only in the engine ({sorted(theirs - mine)[:2]})"
                         if mine != theirs else "valid: same actions, other order")
        else:
            parts.append(f"{key} {ours[key]!r} vs {engine[key]!r}")
    return "; ".join(parts)


class RecordingEngine:
    """The engine inside agentrl's environment, with every reply of ``load``/``reset``/``step`` kept:
    what the engine itself returned, to compare agentrl's output with call by call."""

    def __init__(self, engine):
        self._engine = engine
        self.loaded: tuple | None = None
        self.last: dict[str, Any] | None = None

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def load(self, task_type, variation, simplifications="", generateGoldPath=False):  # noqa: N803 (engine API)
        self.loaded = (task_type, variation, simplifications)
        return self._engine.load(task_type, variation, simplifications, generateGoldPath=generateGoldPath)

    def reset(self):
        obs, info = self._engine.reset()
        self.last = engine_view(obs, None, False, info)
        return obs, info

    def step(self, action):
        obs, reward, done, info = self._engine.step(action)
        self.last = engine_view(obs, reward, done, info)
        return obs, reward, done, info


def identity_episodes(env, engine, control, split: str, episodes: int, steps: int, seed: int) -> dict[str, Any]:
    """Run ``episodes`` random-valid-action episodes in agentrl's env, the engine and a second engine
    (the control); count where agentrl differs from the engine, and whether the control differs
    from the engine there too (the engine disagreeing with itself)."""
    rng = random.Random(seed)
    unexplained: list[str] = []
    passthrough: list[str] = []
    counts = {"steps": 0, "episodes_done": 0, "compared": 0, "passthrough_differ": 0, "differ": 0,
              "engine_self_differ": 0, "differ_where_engines_agree": 0}
    recorder = env.engine = RecordingEngine(env.engine)
    variation_lists: dict[str, list[int]] = {}
    types, nondeterministic_types = set(), set()
    for episode in range(episodes):
        task = TaskRef(split, episode % env.split_sizes()[split])
        task_type, variation = env.address(task)
        types.add(task_type)
        obs, info = env.reset(task)
        if recorder.loaded != (task_type, variation, env.simplifications):
            passthrough.append(f"{task}: agentrl loaded {recorder.loaded}, not {(task_type, variation)}")
        if task_type not in variation_lists:  # the address is in the engine's own list for that set
            variation_lists[task_type] = list(getattr(recorder, f"get_variations_{split.split('_')[0]}")())
        if variation not in variation_lists[task_type]:
            passthrough.append(f"{task}: variation {variation} is not in the engine's {split} list of {task_type}")
        views = []
        for bare in (engine, control):
            bare.load(task_type, variation, env.simplifications)
            e_obs, e_info = bare.reset()
            views.append(engine_view(e_obs, None, False, e_info))
        ours = {"obs": obs, "score": info["task_score"], "done": False, "valid": info["admissible_actions"]}
        where = f"{task_type} variation {variation} reset"
        for step in range(steps + 1):
            counts["compared"] += 1
            own = differing(ours, recorder.last)
            if own:
                counts["passthrough_differ"] += 1
                passthrough.append(f"{where}: agentrl changed the engine's {', '.join(own)}: "
                                   + describe(ours, recorder.last, own))
            diff, self_diff = differing(ours, views[0]), differing(views[1], views[0])
            counts["differ"] += bool(diff)
            counts["engine_self_differ"] += bool(self_diff)
            if self_diff:
                nondeterministic_types.add(task_type)
            if set(diff) - set(self_diff):
                counts["differ_where_engines_agree"] += 1
                unexplained.append(f"{where}: {', '.join(sorted(set(diff) - set(self_diff)))} differ from the engine: "
                                   + describe(ours, views[0], sorted(set(diff) - set(self_diff))))
            if step == steps or views[0]["done"] or ours["done"]:
                counts["episodes_done"] += views[0]["done"]
                break
            action = rng.choice(views[0]["valid"])
            obs, reward, terminated, _truncated, info = env.step(action)
            ours = {"obs": obs, "score": info["task_score"], "reward": reward, "done": terminated,
                    "valid": info["admissible_actions"]}
            views = [engine_view(*bare.step(action)) for bare in (engine, control)]
            counts["steps"] += 1
            where = f"{task_type} variation {variation} step {step + 1} ({action!r})"
        if (episode + 1) % 20 == 0:
            print(f"[check] {episode + 1}/{episodes} episodes, {counts['steps']} steps", file=sys.stderr, flush=True)
    env.engine = recorder._engine
    return {"episodes": episodes, **counts, "task_types": len(types),
            "engine_nondeterministic_types": sorted(nondeterministic_types),
            "passthrough_problems": len(passthrough), "first_passthrough_differences": passthrough[:10],
            "first_differences_where_engines_agree": unexplained[:5]}


def gold_episodes(env, split: str, count: int) -> dict[str, Any]:
    """Play the gold sequence of ``count`` tasks through ``env``; the final score of each."""
    results = []
    for index in range(count):
        task = TaskRef(split, index % env.split_sizes()[split])
        task_type, variation = env.address(task)
        env.reset(task)
        plan = env.expert_actions()
        info: dict[str, Any] = {"task_score": 0, "won": False}
        for action in plan:
            _obs, _reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        results.append({"task_type": task_type, "variation": variation, "gold_steps": len(plan),
                        "score": info["task_score"], "won": bool(info["won"])})
    return {"tasks": count, "won": sum(r["won"] for r in results),
            "not_won": [r for r in results if not r["won"]],
            "longest_gold_path": max((r["gold_steps"] for r in results), default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl_env_scienceworld.check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=240, help="random-action episodes (default 240)")
    parser.add_argument("--steps", type=int, default=10, help="random valid actions per episode (default 10)")
    parser.add_argument("--split", default="test", help="split whose first tasks are used (default test)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the action choices")
    parser.add_argument("--gold", type=int, default=0, help="also play the gold path of this many tasks")
    parser.add_argument("--simplifications", default="", help="the engine's simplification string")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="start all three engines with the JVM's default settings (deterministic=False)")
    args = parser.parse_args(argv)
    from agentrl_env_scienceworld import make_scienceworld
    from agentrl_env_scienceworld.engine import start_engine

    started = time.perf_counter()
    # the gold paths run longer than the benchmark's step limit on a few task types
    deterministic = not args.nondeterministic
    env = make_scienceworld(max_steps=10_000, simplifications=args.simplifications, deterministic=deterministic)
    engine, control = start_engine(deterministic), start_engine(deterministic)
    try:
        summary: dict[str, Any] = {"split": args.split, "seed": args.seed, "deterministic": deterministic}
        summary["identity"] = identity_episodes(env, engine, control, args.split, args.episodes, args.steps,
                                                args.seed)
        if args.gold:
            summary["gold"] = gold_episodes(env, args.split, args.gold)
    finally:
        for closing in (env, engine, control):
            closing.close()
    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary, indent=1))
    identity = summary["identity"]
    engines_differ = identity["differ"] or identity["engine_self_differ"]
    failed = (identity["passthrough_problems"] or (deterministic and engines_differ)
              or (args.gold and summary["gold"]["not_won"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
