"""Sokoban in text: seeded solvable rooms (gym-sokoban's reverse play), a grid observation, four moves,
gym-sokoban's rewards and a breadth-first solver as the expert.

``make_env("sokoban", max_steps=15, room="6x6_1box")``: ``room`` picks a setting of
:mod:`agentrl_env_sokoban.tasks` (``6x6_1box``: verl-agent's and RAGEN's SimpleSokoban size;
``8x8_2box``: RAGEN's LargerSokoban size). The rules and rewards are in :mod:`agentrl_env_sokoban.env`,
the generator in :mod:`agentrl_env_sokoban.generate`.
"""

from __future__ import annotations

from pathlib import Path

from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec


def make_sokoban(max_steps: int | None = None, room: str = "6x6_1box"):
    from agentrl_env_sokoban.env import SokobanEnv

    return SokobanEnv(max_steps=max_steps, room=room)


SPEC = EnvSpec(
    name="sokoban",
    make_env=make_sokoban,
    splits=("train", "dev", "test"),
    prompt=PromptSpec(preamble="You are an expert agent solving Sokoban puzzles.", task_source="info",
                      admissible_layout="quoted"),
    actions=ActionSpec(lowercase=True, fallback_chars=10),
    results=ResultSpec(title="Sokoban (success %)"),
    recipes_dir=str(Path(__file__).with_name("recipe_files")),
    description="Sokoban in text: seeded solvable rooms, four moves, gym-sokoban rewards, a BFS solver as expert",
)

__all__ = ["SPEC", "make_sokoban"]
