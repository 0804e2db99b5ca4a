"""Sokoban: the rules, the solver on hand-written puzzles, the generator's guarantees, the splits and
the environment protocol (rewards, termination, truncation, the expert)."""

from __future__ import annotations

import json

import pytest

from agentrl.envs import REQUIRED_INFO_KEYS, TaskRef
from agentrl.envs.spec import env_spec
from agentrl_env_sokoban.env import SokobanEnv
from agentrl_env_sokoban.generate import generate_room
from agentrl_env_sokoban.room import Room
from agentrl_env_sokoban.solver import dead_squares, replay, solve
from agentrl_env_sokoban.tasks import SETTINGS, SPLIT_BUCKETS, fingerprint_bucket, task_room

# (grid, length of the shortest solution or None when no solution exists)
KNOWN_PUZZLES = [
    ("#####\n"
     "#PXO#\n"
     "#####", 1),
    # the box must be pushed down, then left: walk around it in between
    ("######\n"
     "#_P__#\n"
     "#__X_#\n"
     "#_O__#\n"
     "######", 5),
    # the classic corner: the player must get above the box to push it down, then to its right
    ("#######\n"
     "#P____#\n"
     "#_X___#\n"
     "#_____#\n"
     "#____O#\n"
     "#######", 8),
    # two boxes: the upper row first, then around to the lower one
    ("#######\n"
     "#P_X_O#\n"
     "#__X_O#\n"
     "#######", 8),
    # unsolvable: two boxes in a row in a corridor cannot be pushed
    ("########\n"
     "#PXX_OO#\n"
     "########", None),
    # unsolvable: the box is in a corner that is not a target
    ("#####\n"
     "#X__#\n"
     "#_P_#\n"
     "#__O#\n"
     "#####", None),
    # unsolvable: the box is against the top wall and the target is not on that wall
    ("######\n"
     "#_X__#\n"
     "#_P__#\n"
     "#__O_#\n"
     "######", None),
    # unsolvable: two boxes side by side against a wall can never leave it, targets are below
    ("######\n"
     "#_XX_#\n"
     "#_P__#\n"
     "#_OO_#\n"
     "######", None),
    # a side passage does not change the shortest solution
    ("#######\n"
     "#P_X_O#\n"
     "###_###\n"
     "#######", 3),
]


@pytest.mark.parametrize("grid, length", KNOWN_PUZZLES)
def test_solver_on_known_puzzles(grid, length):
    room = Room.parse(grid)
    assert room.render() == grid  # the text form round-trips
    plan = solve(room)
    if length is None:
        assert plan is None
    else:
        assert plan is not None and len(plan) == length
        assert replay(room, plan).solved
        assert not replay(room, plan[:-1]).solved


def test_rules_push_block_and_walls():
    room = Room.parse("#######\n#PXXOO#\n#__X_O#\n#######")
    blocked = room.move("right")  # two boxes in a row cannot be pushed
    assert not blocked.moved and blocked.room == room
    assert not room.move("up").moved and not room.move("left").moved  # walls
    down = room.move("down")
    assert down.moved and down.pushed is None and down.room.player == (2, 1)
    pushed = down.room.move("right").room.move("right")  # walks, then pushes the lower box
    assert pushed.pushed == (2, 4) and pushed.room.player == (2, 3)


def test_dead_squares_are_corners_and_dead_walls():
    room = Room.parse("######\n#____#\n#_P__#\n#__O_#\n#__X_#\n######")
    # a box can reach the target (3, 3) only from the four middle cells: every wall-side cell is dead
    live = {(2, 2), (2, 3), (3, 2), (3, 3)}
    interior = {(r, c) for r in range(1, 5) for c in range(1, 5)}
    assert dead_squares(room) == interior - live
    assert solve(room) is None  # the box stands on a dead square


def test_parse_refuses_bad_grids():
    with pytest.raises(ValueError, match="one player"):
        Room.parse("####\n#XO#\n####")
    with pytest.raises(ValueError, match="as many targets as boxes"):
        Room.parse("#####\n#PXX#\n#_O_#\n#####")
    with pytest.raises(ValueError, match="unknown Sokoban symbol"):
        Room.parse("#####\n#PX@#\n#####")


@pytest.mark.parametrize("setting_name", sorted(SETTINGS))
def test_generated_rooms_are_solvable_within_the_limit(setting_name):
    cfg = SETTINGS[setting_name]
    seeds = range(60 if cfg.num_boxes == 1 else 15)
    for seed in seeds:
        generated = generate_room(seed, cfg.height, cfg.width, cfg.num_boxes, cfg.search_depth, cfg.max_moves)
        room = generated.room
        assert (room.height, room.width, len(room.boxes)) == (cfg.height, cfg.width, cfg.num_boxes)
        assert not room.boxes & room.targets and room.player not in room.boxes and generated.displacement > 0
        # the emitted solution solves it, and it is a shortest one (an independent search agrees)
        assert 0 < len(generated.solution) <= cfg.max_moves
        assert replay(room, list(generated.solution)).solved
        assert len(solve(room)) == len(generated.solution)
    again = generate_room(3, cfg.height, cfg.width, cfg.num_boxes, cfg.search_depth, cfg.max_moves)
    assert again == generate_room(3, cfg.height, cfg.width, cfg.num_boxes, cfg.search_depth, cfg.max_moves)


def test_splits_are_disjoint_and_reproducible():
    for split, buckets in SPLIT_BUCKETS.items():
        for index in range(40):
            assert fingerprint_bucket(task_room("6x6_1box", split, index).room.render()) in buckets
    rooms = {split: {task_room("6x6_1box", split, i).room.render() for i in range(40)} for split in SPLIT_BUCKETS}
    assert not rooms["train"] & rooms["test"] and not rooms["train"] & rooms["dev"] and not rooms["dev"] & rooms["test"]
    # a fixed address gives a fixed room (no process-dependent hashing)
    assert task_room("6x6_1box", "test", 0).room.render() == "######\n#P___#\n#__X_#\n#O_###\n######\n######"
    assert task_room("6x6_1box", "test", 0).solution == (
        "right", "right", "right", "down", "left", "left", "up", "left", "down")


@pytest.fixture()
def env():
    return env_spec("sokoban").make_env(max_steps=15)


def test_expert_episode_rewards_and_info(env):
    obs, info = env.reset(TaskRef("test", 0))
    assert obs == task_room("6x6_1box", "test", 0).room.render()
    assert set(REQUIRED_INFO_KEYS) <= set(info) and info["admissible_actions"] == ["up", "down", "left", "right"]
    assert info["task_type"] == "6x6_1box" and info["depth"] == 9 and info["won"] is False
    json.dumps(info)
    plan = env.expert_actions()
    for action in plan[:-1]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated, info["noop"]) == (pytest.approx(-0.1), False, False, False)
    obs, reward, terminated, truncated, info = env.step(plan[-1].upper())  # case is ignored
    assert reward == pytest.approx(-0.1 + 1 + 10) and terminated and not truncated and info["won"]
    assert "√" in obs and info["boxes_on_target"] == info["num_boxes"] == 1


def test_box_off_target_penalty_and_noops(env):
    env.reset(TaskRef("train", 0))
    env.room = Room.parse("#######\n#P√_XO#\n#######")   # two boxes, one already on its target
    obs, reward, terminated, _, info = env.step("right")  # pushes the box off the target
    assert obs == "#######\n#_SXXO#\n#######" and reward == pytest.approx(-1.1) and not terminated
    assert info["boxes_on_target"] == 0
    _, reward, _, _, info = env.step("right")             # two boxes in a row: nothing moves
    assert reward == pytest.approx(-0.1) and info["noop"] is True
    _, reward, _, _, info = env.step("jump")              # not a move: gym-sokoban's no-op
    assert reward == pytest.approx(-0.1) and info["noop"] is True


def test_truncation_at_the_step_limit():
    env = SokobanEnv(max_steps=3)
    env.reset(TaskRef("dev", 1))
    flags = [env.step("jump")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    assert SokobanEnv().max_steps == 15 and SokobanEnv(room="8x8_2box").max_steps == 30


def test_stepwise_expert_recovers_and_reports_deadlocks(env):
    env.reset(TaskRef("train", 5))
    env.step("up"), env.step("left")  # off the expert's path (or into a wall)
    for _ in range(env.max_steps):
        obs, reward, terminated, truncated, info = env.step(env.expert_next_action())
        if terminated:
            break
    assert info["won"]
    env.room = Room.parse("#####\n#X__#\n#_P_#\n#__O#\n#####")
    with pytest.raises(RuntimeError, match="cannot be solved"):
        env.expert_next_action()


def test_unknown_room_setting_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown Sokoban room setting '9x9'.*6x6_1box"):
        SokobanEnv(room="9x9")
