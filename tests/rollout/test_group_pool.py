"""The streaming group pool of trainer.mode=async (agentrl.rollout.group_pool), in-process on a local
env pool: each group's result is exactly what a synchronous rollout of that group gives, a new group
starts as soon as instances free up (not when the whole wave is done), and a group is handed back the
moment its last episode ends."""

from __future__ import annotations

import torch

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from agentrl.rollout.engine import RolloutEngine
from agentrl.rollout.group_pool import GroupPool, GroupSpec

from rollout_helpers import env_config, rollout_config
from scripted_backend import ScriptedExpertBackend, expert_plans

# expert plans of different lengths, so that one group of a wave finishes before the other
TASKS = [TaskRef("depth2", 0), TaskRef("depth2", 3), TaskRef("depth2", 5)]


class CountingBackend:
    """The scripted expert, with the number of prompts of every generate call."""

    def __init__(self, backend):
        self.backend, self.batches = backend, []

    def generate(self, prompts, sampling):
        self.batches.append(len(prompts))
        return self.backend.generate(prompts, sampling)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def engine_for(tokenizer, instances: int):
    env_cfg = env_config(max_steps=15, history_length=2, group_size=2)
    backend = CountingBackend(ScriptedExpertBackend(tokenizer, expert_plans("textcraft", TASKS), invalid_steps=[1]))
    client = EnvClient.local("textcraft", instances, {"max_steps": env_cfg.max_steps})
    return RolloutEngine(backend, tokenizer, client, rollout_config(), env_cfg), backend


def test_each_group_is_what_a_synchronous_rollout_gives_and_groups_start_as_instances_free(tiny_tokenizer):
    engine, backend = engine_for(tiny_tokenizer, 4)
    lengths = [len(p) + 1 for p in expert_plans("textcraft", TASKS).values()]   # +1: the invalid step 1
    assert len(set(lengths[:2])) == 2, lengths

    pool = GroupPool(engine, group_size=2, sampling=engine.sampling_params(seed=3), seed=3)
    pool.add([GroupSpec(task, 10 + g, 2 * (10 + g)) for g, task in enumerate(TASKS)])
    finished, steps = {}, 0
    while pool.busy or pool.waiting:
        for result in pool.step():
            finished[int(result.batch.group_id[0])] = (steps, result)
        steps += 1
    assert sorted(finished) == [10, 11, 12]
    # group 12 started on the instances of the shorter of groups 10/11, in the same generate calls as
    # the longer one's last steps: fewer calls than two waves, and calls of 4 prompts mixing groups
    assert len(backend.batches) == max(max(lengths[:2]), min(lengths[:2]) + lengths[2]) < max(lengths[:2]) + lengths[2]
    # each group was handed back in the step its last episode ended
    assert finished[10][0] == lengths[0] - 1 and finished[11][0] == lengths[1] - 1

    stats = pool.drain_stats()
    assert stats["groups"] == 3 and stats["episodes"] == 6 and stats["env_steps"] == 2 * sum(lengths)
    sync_engine, _ = engine_for(tiny_tokenizer, 2)
    for g, task in enumerate(TASKS):
        want = sync_engine.run([task], 2, group_ids=[10 + g], traj_id_start=2 * (10 + g)).batch
        got = finished[10 + g][1].batch
        for name in ("group_id", "traj_id", "step", "prompt_ids", "response_ids", "response_mask", "env_reward",
                     "invalid_penalty", "done", "episode_return", "success", "action_valid", "anchor_key"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert got.anchor_obs == want.anchor_obs and got.action == want.action
        assert [e.to_dict() for e in finished[10 + g][1].episodes] == [e.to_dict() for e in
                                                                       sync_engine.run([task], 2, group_ids=[10 + g],
                                                                                       traj_id_start=2 * (10 + g)).episodes]


def test_groups_not_started_come_back(tiny_tokenizer):
    engine, _ = engine_for(tiny_tokenizer, 2)
    pool = GroupPool(engine, group_size=2, sampling=engine.sampling_params(seed=0), seed=0)
    pool.add([GroupSpec(task, g, 2 * g) for g, task in enumerate(TASKS)])
    pool.step()                                      # group 0 started on the only two instances
    assert [s.group_id for s in pool.take_waiting()] == [1, 2] and pool.busy
    while pool.busy:
        done = pool.step()
    assert [int(r.batch.group_id[0]) for r in done] == [0] and not pool.waiting
