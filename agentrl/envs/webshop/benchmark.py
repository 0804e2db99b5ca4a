"""Step throughput of the WebShop environment on one core.

``python -m agentrl.envs.webshop.benchmark [--episodes N]`` plays expert episodes (a search with
the instruction, paging, product, options, Buy Now) and random-walk episodes (a search, then
uniformly random admissible clicks, new searches included, until Buy Now or the step limit) on the
test split and prints steps per second, resets included in the timed loop. The catalogue is built
before timing starts.
"""

from __future__ import annotations

import argparse
import random
import time

from agentrl.envs import TaskRef, make_env


def _expert(env, task: TaskRef, rng: random.Random) -> int:
    env.reset(task)
    actions = env.expert_actions()
    for action in actions:
        env.step(action)
    return len(actions)


def _random_walk(env, task: TaskRef, rng: random.Random) -> int:
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


def measure(policy, episodes: int, seed: int = 0) -> tuple[int, float]:
    env = make_env("webshop")
    rng = random.Random(seed)
    size = env.split_sizes()["test"]
    start = time.perf_counter()
    steps = sum(policy(env, TaskRef("test", i % size), rng) for i in range(episodes))
    return steps, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    args = parser.parse_args(argv)
    make_env("webshop")  # build the catalogue and the index outside the timed loop
    for name, policy in (("expert", _expert), ("random", _random_walk)):
        steps, seconds = measure(policy, args.episodes)
        print(f"{name:7s} {args.episodes} episodes, {steps} steps, {seconds:.2f} s, "
              f"{steps / seconds:,.0f} steps/s")


if __name__ == "__main__":
    main()
