"""Sokoban room settings (the peers' sizes) and the seeded, disjoint train/dev/test splits.

Settings (``make_env("sokoban", room=...)``):

``6x6_1box`` (default)  verl-agent's Sokoban (``env.sokoban``: ``dim_room [6, 6]``, ``num_boxes 1``,
                        ``search_depth 30``; its run scripts set ``env.max_steps 15``) and the size
                        of RAGEN's ``SimpleSokoban`` (6x6, 1 box). Step limit 15; every room is
                        solvable within 15 moves.
``8x8_2box``            the size of RAGEN's ``LargerSokoban`` (8x8, 2 boxes), reverse play 30
                        moves deep; step limit 30, every room solvable within 30 moves.

Splits: ``train`` (20,000 rooms), ``dev`` (1,000), ``test`` (1,000). Room ``(split, i)`` is the first
room of the seeds ``sha256("<setting>/<split>/<i>/<j>")``, ``j = 0, 1, ...``, whose own fingerprint
(the SHA-256 of its grid text) falls in the split's share of ten buckets: ``train`` 0-5, ``dev``
6-7, ``test`` 8-9. A room (the same walls, targets, boxes and player) can therefore appear in one
split only, and any room is found without generating the others. The same address gives the
same room on every machine (the generator uses its own ``random.Random``).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from agentrl_env_sokoban.generate import GeneratedRoom, generate_room


@dataclass(frozen=True)
class RoomSetting:
    height: int
    width: int
    num_boxes: int
    search_depth: int
    max_moves: int      # every room's shortest solution is at most this long; the default step limit


SETTINGS = {
    "6x6_1box": RoomSetting(6, 6, 1, search_depth=30, max_moves=15),
    "8x8_2box": RoomSetting(8, 8, 2, search_depth=30, max_moves=30),
}
DEFAULT_SETTING = "6x6_1box"
SPLIT_SIZES = {"train": 20_000, "dev": 1_000, "test": 1_000}
SPLIT_BUCKETS = {"train": range(0, 6), "dev": range(6, 8), "test": range(8, 10)}
BUCKETS = 10


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def fingerprint_bucket(room_text: str) -> int:
    """Which of the ten buckets a room's grid falls in (decides the one split it may belong to)."""
    return hashlib.sha256(room_text.encode()).digest()[0] % BUCKETS


def setting(name: str) -> RoomSetting:
    if name not in SETTINGS:
        raise ValueError(f"unknown Sokoban room setting {name!r}: use one of {', '.join(SETTINGS)} "
                         "(env.kwargs.room)")
    return SETTINGS[name]


@functools.lru_cache(maxsize=4096)
def task_room(setting_name: str, split: str, index: int) -> GeneratedRoom:
    """The room of task ``(split, index)`` under a setting (cached: generation is deterministic)."""
    cfg = setting(setting_name)
    buckets = SPLIT_BUCKETS[split]
    draw = 0
    while True:
        generated = generate_room(_seed(f"{setting_name}/{split}/{index}/{draw}"), cfg.height, cfg.width,
                                  cfg.num_boxes, cfg.search_depth, cfg.max_moves)
        if fingerprint_bucket(generated.room.render()) in buckets:
            return generated
        draw += 1
