"""The rollout stream of trainer.mode one_step_off/async: whole groups in call order, staleness,
drops, the buffer saved with a checkpoint and restored, and calls numbered like iterations on real
Ray rollout workers."""

from __future__ import annotations

import pytest
import torch

from agentrl.data import StepBatch
from agentrl.envs import TaskRef
from agentrl.rollout.engine import EpisodeResult, RolloutResult
from agentrl.rollout.sources.buffer import GroupBuffer, TakenBatch, split_groups, versions_per_episode
from agentrl.rollout.sources.call_ahead import RolloutStream

GUIDED = 1_000_000_000


def call_result(groups: list[int], versions: dict[int, list[int]], guided: int | None = None) -> RolloutResult:
    """Two episodes of two steps per group; ``versions[g]``: the policy version of each of the group's
    four steps (episode 0 then 1). ``guided``: a group that also gets an expert episode of one step."""
    records, episodes = [], []
    for g in groups:
        for k in range(2):
            traj = 2 * g + k
            for t in range(2):
                records.append(dict(group_id=g, traj_id=traj, step=t, prompt_ids=[3, 4, 5 + t], response_ids=[6, 7],
                                    rollout_logprobs=[-0.5, -0.25], env_reward=float(k == 1 and t == 1),
                                    done=t == 1, success=k == 1, anchor_obs=f"obs {t}",
                                    policy_version=versions[g][2 * k + t], task_type="craft", is_expert=False))
            episodes.append(EpisodeResult(g, traj, TaskRef("train", g), "craft", k == 1, float(k == 1), 2, 0))
        if g == guided:
            records.append(dict(group_id=g, traj_id=GUIDED + g, step=0, prompt_ids=[3], response_ids=[8], rollout_logprobs=[0.0],
                                env_reward=1.0, done=True, success=True, anchor_obs="obs 0", is_expert=True,
                                policy_version=versions[g][-1]))
    batch = StepBatch.from_records(records).with_anchor_keys()
    return RolloutResult(batch, episodes, {"env_steps": float(len(records)), "max_prompt_tokens": 3.0,
                                           "idle_before_s": 0.25})


def test_a_call_splits_into_whole_groups_with_their_expert_episode():
    groups = split_groups(7, call_result([4, 5], {4: [0] * 4, 5: [0, 1, 1, 1]}, guided=5))
    assert [(g.call_id, g.group_id, len(g.batch), len(g.episodes)) for g in groups] == [(7, 4, 4, 2), (7, 5, 5, 2)]
    assert bool(groups[1].batch.is_expert.any()) and groups[1].oldest_version == 0
    assert versions_per_episode(groups[1].batch) == [2, 1]      # the expert's episode is not counted


def test_take_gives_the_oldest_fresh_groups_and_drops_stale_ones():
    buffer = GroupBuffer()
    buffer.add(1, call_result([0, 1], {0: [0, 0, 0, 0], 1: [0, 0, 1, 1]}))
    buffer.add(2, call_result([2, 3], {2: [1] * 4, 3: [2] * 4}))
    assert len(buffer) == 4
    dropped = buffer.drop_stale(version=3, max_staleness=2)
    taken, ages = buffer.take(2, version=3)
    # group 0 (versions 0..0) is 3 versions behind: dropped; group 1's oldest step is version 0 too
    assert [g.group_id for g in taken] == [2, 3] and ages == [2, 1] and dropped == 2
    assert len(buffer) == 0 and buffer.dropped_total == 2
    stats = buffer.drain_stats()
    assert stats["env_steps"] == 16 and stats["max_prompt_tokens"] == 3 and stats["idle_before_s"] == 0.5
    assert buffer.drain_stats() == {}


def test_taken_batch_metrics():
    result = call_result([0, 1], {0: [0, 1, 1, 1], 1: [1] * 4})
    metrics = TakenBatch(result, staleness=[1, 0], dropped=1, learner_wait_s=0.5, buffered_groups=3,
                         dropped_total=4).metrics()
    assert metrics["async/staleness_mean"] == 0.5 and metrics["async/staleness_max"] == 1
    assert metrics["async/staleness_0_groups"] == 1 and metrics["async/staleness_1_groups"] == 1
    assert metrics["async/versions_per_episode_mean"] == pytest.approx(5 / 4)
    assert metrics["async/versions_per_episode_max"] == 2
    assert metrics["async/groups_dropped"] == 1 and metrics["async/groups_dropped_total"] == 4
    assert metrics["async/buffer_groups"] == 3 and metrics["time/learner_wait_s"] == 0.5


class FailingCall:
    """A rollout call that is done and raises what a failed call raises (its env servers were lost)."""

    calls = ()

    def done(self) -> bool:
        return True

    def result(self):
        from agentrl.rollout.engine import EnvFailureLimitError

        raise EnvFailureLimitError("17 textcraft episodes failed in one rollout")


class CallsThatFailAfter:
    """Rollout workers whose first call gives groups 0 and 1 and whose later calls fail."""

    def __init__(self):
        self.submitted = 0

    def submit(self, tasks, group_size, seed, expert_guidance, first_group_id):
        self.submitted += 1
        if self.submitted > 1:
            return FailingCall()
        result = call_result([first_group_id, first_group_id + 1], {first_group_id: [0] * 4, first_group_id + 1: [0] * 4})

        class Done:
            calls = ()

            def done(self):
                return True

            def result(self):
                return result
        return Done()


def test_a_call_failing_while_the_learner_waits_leaves_every_group_in_the_buffer(tmp_path):
    # iteration 1 takes call 1's groups; iteration 2 needs call 2's, which fails while the learner
    # waits: the groups already buffered stay there, so the checkpoint written on the way out keeps them
    workers = CallsThatFailAfter()
    stream = RolloutStream(workers, lambda c: [TaskRef("train", 2 * c), TaskRef("train", 2 * c + 1)], lambda c: c,
                           group_size=2, tasks_per_call=4)
    stream.submit(stream.spec(1))
    stream.next_call = 2
    from agentrl.rollout.engine import EnvFailureLimitError

    with pytest.raises(EnvFailureLimitError):
        stream.next_batch(version=0, max_staleness=1)
    assert [g.group_id for g in stream.buffer.groups] == [0, 1]
    stream.save(tmp_path / "buffer")
    assert len(list((tmp_path / "buffer").glob("group_*"))) == 2


def test_buffer_saves_and_loads_whole_groups(tmp_path):
    buffer = GroupBuffer()
    buffer.add(3, call_result([4, 5], {4: [2] * 4, 5: [2, 2, 3, 3]}, guided=4))
    buffer.take(1, version=3)
    buffer.save(tmp_path)
    loaded = GroupBuffer.load(tmp_path, buffer.stats, buffer.dropped_total)
    assert [(g.call_id, g.group_id) for g in loaded.groups] == [(3, 5)]
    a, b = buffer.groups[0], loaded.groups[0]
    for name in ("traj_id", "prompt_ids", "response_ids", "rollout_logprobs", "policy_version", "anchor_key", "is_expert"):
        assert torch.equal(getattr(a.batch, name), getattr(b.batch, name)), name
    assert a.batch.anchor_obs == b.batch.anchor_obs
    assert [e.to_dict() for e in a.episodes] == [e.to_dict() for e in b.episodes]
    assert loaded.stats == buffer.stats


@pytest.mark.slow
def test_stream_numbers_calls_like_iterations_and_resubmits_calls_in_flight(ray_cluster, tiny_model_dir, tiny_tokenizer,
                                                                          tmp_path):
    from agentrl.models import build_tiny_model
    from agentrl.rollout.worker_group import RolloutWorkerGroup
    from rollout_helpers import TINY, env_config, rollout_config

    env_cfg = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=2)
    cfg = rollout_config(max_response_tokens=4, max_prompt_tokens=256, prompt_truncation="left")

    def tasks_of(call: int) -> list[TaskRef]:
        return [TaskRef("depth2", 2 * call), TaskRef("depth2", 2 * call + 1)]

    with RolloutWorkerGroup(tiny_model_dir, cfg, env_cfg, num_workers=1, worker_num_cpus=0.5, env_num_cpus=0.5) as group:
        stream = RolloutStream(group, tasks_of, lambda call: 100 + call, group_size=2, tasks_per_call=2)
        assert not stream.running()
        stream.submit_until(3, groups_needed=4)       # two calls cover the 4 groups still needed
        assert [spec.call_id for spec, _ in stream.in_flight] == [1, 2] and stream.next_call == 3
        assert stream.running()                       # the learner lends the rollout's cores only when not
        taken = stream.next_batch(version=0, max_staleness=1)
        assert sorted(set(taken.result.batch.group_id.tolist())) == [0, 1]
        assert [e.task for e in taken.result.episodes] == [TaskRef("depth2", 2)] * 2 + [TaskRef("depth2", 3)] * 2
        stream.submit_until(3, groups_needed=4)
        assert [spec.call_id for spec, _ in stream.in_flight] == [2, 3]
        stream.wait_for_call(2)
        assert [g.group_id for g in stream.buffer.groups] == [2, 3]
        stream.save(tmp_path / "buffer")
        saved_in_flight = [spec.call_id for spec, _ in stream.in_flight]
        stream.cancel()

        again = RolloutStream(group, tasks_of, lambda call: 100 + call, group_size=2, tasks_per_call=2)
        assert again.restore(tmp_path / "buffer") == 2
        assert again.resubmitted == len(saved_in_flight) and again.next_call == 4
        assert [spec.call_id for spec, _ in again.in_flight] == saved_in_flight
        first = again.next_batch(version=1, max_staleness=1)
        assert sorted(set(first.result.batch.group_id.tolist())) == [2, 3]
        second = again.next_batch(version=1, max_staleness=1)
        assert sorted(set(second.result.batch.group_id.tolist())) == [4, 5]   # call 3's groups, run again
        assert second.result.episodes[0].task == TaskRef("depth2", 6)
        # call 4 rolled out on version 0 and taken at version 3: too stale, dropped, and replaced by a
        # call submitted on the spot (nothing else is in flight), which runs on the newest weights
        again.submit_until(4, groups_needed=2)
        again.wait_for_all()
        assert not again.running()
        group.load_weights(build_tiny_model(TINY, tiny_tokenizer, seed=0).state_dict(), version=3)
        third = again.next_batch(version=3, max_staleness=1)
        assert third.dropped == 2 and third.dropped_total == 2 and again.next_call == 6
        assert sorted(set(third.result.batch.group_id.tolist())) == [8, 9] and third.staleness == [0, 0]
        # a replacement that is still too old means the weights never arrived: an error, not a loop
        again.submit_until(6, groups_needed=2)
        again.wait_for_all()
        with pytest.raises(RuntimeError, match="did not receive the learner's weights"):
            again.next_batch(version=6, max_staleness=1)


def test_the_stalest_groups_are_taken_first():
    # group 3 (started at version 0, a slow one) arrived after groups 1 and 2 (versions 1 and 2): it is
    # taken before them, or it would wait until it was too stale and be dropped
    buffer = GroupBuffer()
    buffer.add(1, call_result([1, 2], {1: [1] * 4, 2: [2] * 4}))
    buffer.add(2, call_result([3, 4], {3: [0, 0, 2, 2], 4: [1] * 4}))
    taken, ages = buffer.take(2, version=2)
    assert [g.group_id for g in taken] == [3, 1] and ages == [2, 1]     # among equals (1 and 4) the first to arrive
    assert [g.group_id for g in buffer.groups] == [2, 4]
