"""ALFWorld task families, splits and the on-disk data layout (no engine import here).

The six task families are the ones ALFWorld's ``AlfredTWEnv`` serves (``TASK_TYPES`` 1..6 in
``alfworld.agents.environment.alfred_tw_env``). Papers' tables use the short column names of
:data:`TASK_TYPE_SHORT_NAMES`; ``info["task_type"]`` carries the full family name.

Layout of a data directory (the official release and generated sets alike)::

    <root>/json_2.1.1/{train,valid_seen,valid_unseen}/<task dir>/<trial dir>/{traj_data.json,game.tw-pddl}

with ``<task dir>`` = ``<task_type>-<object>-<movable receptacle or None>-<receptacle or lamp>-<scene>``.
"""

from __future__ import annotations

import json
import os

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

TASK_TYPE_SHORT_NAMES = {
    "pick_and_place_simple": "Pick",
    "look_at_obj_in_light": "Look",
    "pick_clean_then_place_in_recep": "Clean",
    "pick_heat_then_place_in_recep": "Heat",
    "pick_cool_then_place_in_recep": "Cool",
    "pick_two_obj_and_place": "Pick2",
}

SPLITS = ("train", "valid_seen", "valid_unseen")

# Games per split of the official release after the reference loader's filters (ALFWorld paper and
# the LLM-agent papers: 3,553 train, 140 valid_seen (in distribution), 134 valid_unseen (out of
# distribution)).
PAPER_SPLIT_SIZES = {"train": 3553, "valid_seen": 140, "valid_unseen": 134}

DATA_SUBDIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
TRAJ_FILE = "traj_data.json"

# Scenes held out of training in ALFRED's valid_unseen split (one per room kind).
VALID_UNSEEN_SCENES = (10, 219, 308, 424)


TASK_PREFIX = "Your task is to: "


def task_line(intro: str) -> str:
    """The ``Your task is to: ...`` line of an initial observation ("" when there is none)."""
    for line in intro.splitlines():
        if line.startswith(TASK_PREFIX):
            return line.strip()
    return ""


def short_task_type(task_type: str) -> str:
    """``pick_two_obj_and_place`` -> ``Pick2`` (the papers' column names)."""
    return TASK_TYPE_SHORT_NAMES[task_type]


def split_dir(root: str, split: str) -> str:
    return os.path.join(root, DATA_SUBDIR, split)


def list_split_games(root: str, split: str) -> list[str]:
    """The playable game files of one split, sorted by path (same order on every machine).

    Applies the reference loader's filters: a trial needs ``traj_data.json`` and ``game.tw-pddl``,
    is skipped when its path mentions ``movable`` or ``Sliced``, when its task type is not one of
    the six families, or when the game file is not marked ``solvable``.
    """
    base = split_dir(root, split)
    games: list[str] = []
    if not os.path.isdir(base):
        return games
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        if TRAJ_FILE not in filenames or GAME_FILE not in filenames:
            continue
        if "movable" in dirpath or "Sliced" in dirpath:
            continue
        with open(os.path.join(dirpath, TRAJ_FILE)) as f:
            if json.load(f).get("task_type") not in TASK_TYPES:
                continue
        with open(os.path.join(dirpath, GAME_FILE)) as f:
            if not json.load(f).get("solvable"):
                continue
        games.append(os.path.join(dirpath, GAME_FILE))
    return sorted(games)


def has_official_layout(root: str) -> bool:
    return any(os.path.isdir(split_dir(root, s)) for s in SPLITS)
