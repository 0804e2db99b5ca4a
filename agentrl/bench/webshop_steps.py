"""``agentrl bench webshop-steps``: step throughput of the WebShop environment on one core.

``agentrl bench webshop-steps [--episodes N]`` plays expert episodes (a search with the instruction,
paging, product, options, Buy Now) and random-walk episodes (a search, then uniformly random
admissible clicks, new searches included, until Buy Now or the step limit) on the test split of the
default generated catalogue and prints steps per second, resets included in the timed loop. The
catalogue is built before timing starts. The two policies are also played by ``agentrl bench
webshop`` on the full-size catalogue.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from agentrl.bench._common import cpu_name, run_report
from agentrl.envs import TaskRef, make_env

HELP = "WebShop env steps/s on one core: expert and random-walk episodes, resets included"


def add_arguments(parser) -> None:
    parser.add_argument("--episodes", type=int, default=500, help="episodes per policy (default 500)")


def play_expert(env, task: TaskRef, rng: random.Random) -> int:
    """One episode of the env's expert plan on ``task``; its number of steps."""
    env.reset(task)
    actions = env.expert_actions()
    for action in actions:
        env.step(action)
    return len(actions)


def play_random_walk(env, task: TaskRef, rng: random.Random) -> int:
    """One episode on ``task``: a search, then random admissible clicks (10% new searches) until Buy
    Now or the step limit; its number of steps."""
    _, info = env.reset(task)
    steps = 0
    while True:
        choices = [a for a in info["admissible_actions"] if a != "search[<your query>]"]
        if info["page"] == "search" or rng.random() < 0.1:
            action = f"search[{rng.choice(info['task'].split())} {rng.choice(['red', 'large'])}]"
        else:
            action = rng.choice(choices)
        _, _, terminated, truncated, info = env.step(action)
        steps += 1
        if terminated or truncated:
            return steps


def time_policy(policy, episodes: int, seed: int = 0) -> tuple[int, float]:
    """Steps and seconds of ``episodes`` episodes of ``policy`` on the test split's tasks in turn."""
    env = make_env("webshop")
    rng = random.Random(seed)
    size = env.split_sizes()["test"]
    start = time.perf_counter()
    steps = sum(policy(env, TaskRef("test", i % size), rng) for i in range(episodes))
    return steps, time.perf_counter() - start


def measure(args) -> dict[str, Any]:
    make_env("webshop")  # build the catalogue and the index outside the timed loop
    results = {}
    for name, policy in (("expert", play_expert), ("random", play_random_walk)):
        steps, seconds = time_policy(policy, args.episodes)
        results[name] = {"episodes": args.episodes, "steps": steps, "seconds": seconds,
                         "steps_per_s": steps / seconds}
    return {"meta": {"cpu": cpu_name(), "cores": os.cpu_count(), "loadavg": os.getloadavg()},
            "results": results}


def show(meta: dict[str, Any], results: dict[str, Any]) -> None:
    for name, r in results.items():
        print(f"{name:7s} {r['episodes']} episodes, {r['steps']} steps, {r['seconds']:.2f} s, "
              f"{r['steps_per_s']:,.0f} steps/s")


def run(args) -> int:
    return run_report(args, measure, show)
