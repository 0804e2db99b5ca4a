"""The prioritized training curriculum (agentrl.curriculum) and the goals environments report."""

from collections import Counter

import pytest

from agentrl.config import load_config
from agentrl.config.schema import CurriculumConfig
from agentrl.curriculum import MASTERED, UNSOLVED, PrioritizedSchedule, split_goals
from agentrl.envs import TaskRef, make_env
from agentrl.rollout.engine import EpisodeResult
from agentrl.run_state import TrainerState
from agentrl.task_schedule import TaskSchedule
from agentrl.trainer import saved_state, task_schedule


def episodes(task: TaskRef, group_id: int, wins: list[bool], env_error: str | None = None):
    return [EpisodeResult(group_id=group_id, traj_id=group_id * 100 + i, task=task, task_type="t", won=w,
                          episode_return=float(w), length=3, invalid_actions=0, env_error=env_error)
            for i, w in enumerate(wins)]


def schedule(goals, per_iteration=4, seed=0, **cfg):
    return PrioritizedSchedule("train", tuple(goals), per_iteration, seed, CurriculumConfig(mode="prioritized", **cfg))


def test_textcraft_reports_each_tasks_goal():
    env = make_env("textcraft", max_steps=12)
    goals = env.task_goals("pool_depth2")
    assert len(goals) == 384 and set(Counter(goals).values()) == {12}      # 32 goals x 12 layouts
    for index in (0, 5, 200, 383):
        _, info = env.reset(TaskRef("pool_depth2", index))
        assert info["goal"] == goals[index]
    cfg = load_config("textcraft_grpo_tiny")
    assert split_goals(cfg.env, "pool_depth2", 384) == tuple(goals)
    with pytest.raises(ValueError, match="gave 384 goals for 10 tasks"):
        split_goals(cfg.env, "pool_depth2", 10)


def test_goal_states_follow_the_latest_window_of_groups():
    s = schedule(["a", "a", "b", "c"], window=2)
    s.record(episodes(TaskRef("train", 0), 0, [True, True]) + episodes(TaskRef("train", 2), 1, [False, False]))
    assert s.goal_state("a") == s.goal_state("b") == "learning"      # one group is not a window of 2 yet
    s.record(episodes(TaskRef("train", 1), 0, [True, True]) + episodes(TaskRef("train", 2), 1, [False, False])
             + episodes(TaskRef("train", 3), 2, [True, False]))
    assert (s.goal_state("a"), s.goal_state("b"), s.goal_state("c")) == (MASTERED, UNSOLVED, "learning")
    # a mastered goal that fails once is learning again; only the latest `window` groups count
    s.record(episodes(TaskRef("train", 0), 0, [True, False]))
    assert s.goal_state("a") == "learning" and s.recent["a"] == [1.0, 0.5]
    # episodes an env failure ended, and tasks of another split, are not outcomes
    s.record(episodes(TaskRef("train", 3), 0, [False, False], env_error="timeout")
             + episodes(TaskRef("valid", 3), 1, [False, False]))
    assert s.recent["c"] == [0.5]
    assert (s.weight("a"), s.weight("b")) == (1.0, 1.0)                # unsolved_weight defaults to 1


def test_draws_are_distinct_deterministic_and_follow_the_weights():
    goals = [f"g{i // 4}" for i in range(40)]                # 10 goals x 4 tasks
    s = schedule(goals, per_iteration=8, seed=3, mastered_weight=0.1, window=1)
    uniform = [s.tasks_for(i) for i in range(1, 4)]
    assert all(len(set(tasks)) == 8 for tasks in uniform)
    assert uniform == [schedule(goals, per_iteration=8, seed=3).tasks_for(i) for i in range(1, 4)]
    assert schedule(goals, per_iteration=8, seed=4).tasks_for(1) != uniform[0]
    # goals 0-4 mastered: over many iterations their tasks are drawn far less often than the rest
    s.record([e for g in range(5) for e in episodes(TaskRef("train", 4 * g), g, [True, True])])
    drawn = Counter(goals[t.index] for i in range(1, 401) for t in s.tasks_for(i))
    mastered = sum(drawn[f"g{g}"] for g in range(5))
    learning = sum(drawn[f"g{g}"] for g in range(5, 10))
    assert mastered + learning == 400 * 8
    assert 0.03 < mastered / learning < 0.2                  # weight 0.1, less once the others run low


def test_zero_weight_goals_are_drawn_only_when_nothing_else_is_left():
    goals = ["a"] * 3 + ["b"] * 3
    s = schedule(goals, per_iteration=4, window=1, mastered_weight=0.0)
    s.record(episodes(TaskRef("train", 0), 0, [True]))
    for i in range(1, 20):
        drawn = [goals[t.index] for t in s.tasks_for(i)]
        assert sorted(drawn) == ["a", "b", "b", "b"]


def test_state_survives_a_checkpoint_and_draws_the_same_tasks(tmp_path):
    cfg = load_config("textcraft_grpo_tiny", ["trainer.curriculum.mode=prioritized", "trainer.curriculum.window=1"])
    live = task_schedule(cfg)
    assert isinstance(live, PrioritizedSchedule) and isinstance(task_schedule(load_config("textcraft_grpo_tiny")),
                                                                TaskSchedule)
    for iteration in (1, 2, 3):
        tasks = live.tasks_for(iteration)
        live.record([e for g, t in enumerate(tasks) for e in episodes(t, g, [t.index % 3 == 0] * 2)])
    from agentrl.estimators import BiGPOState

    state = saved_state(TrainerState(model_dir="/m"), 3, BiGPOState(), live)
    restored = task_schedule(cfg, TrainerState.from_json(state.to_json()).schedule_state)
    assert restored.recent == live.recent and any(restored.goal_state(g) == MASTERED for g in set(live.goals))
    assert [restored.tasks_for(i) for i in (4, 5)] == [live.tasks_for(i) for i in (4, 5)]
    # a uniform schedule saves nothing and reports nothing
    uniform = task_schedule(load_config("textcraft_grpo_tiny"))
    assert saved_state(TrainerState(), 1, BiGPOState(), uniform).schedule_state is None
    assert uniform.metrics(uniform.tasks_for(1)) == {}


def test_metrics_count_goal_states_and_drawn_mastered_tasks():
    goals = ["a", "a", "b", "c"]
    s = schedule(goals, per_iteration=4, window=1)
    s.record(episodes(TaskRef("train", 0), 0, [True, True]) + episodes(TaskRef("train", 2), 1, [False]))
    m = s.metrics([TaskRef("train", 0), TaskRef("train", 1), TaskRef("train", 3)])
    assert m == {"curriculum/mastered_goals": 1.0, "curriculum/unsolved_goals": 1.0,
                 "curriculum/mastered_tasks_drawn": 2.0}
