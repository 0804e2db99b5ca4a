"""StepBatch: construction, selection, concatenation, grouping, disk round trip, devices."""

import pickle

import pytest
import torch

from agentrl.data import StepBatch, segment_ids


def make_records(groups=2, trajs_per_group=2, steps=3):
    records = []
    traj = 0
    for g in range(groups):
        for _ in range(trajs_per_group):
            for s in range(steps):
                records.append(dict(
                    group_id=10 * g + 7, traj_id=traj, step=s, prompt_ids=list(range(1, 3 + s)),
                    response_ids=[5] * (1 + traj % 2), reward=1.0 if s == steps - 1 and traj % 2 == 0 else 0.0,
                    done=s == steps - 1, success=traj % 2 == 0, anchor_obs=f"obs {g} {s}", action=f"act {s}",
                    action_valid=s != 1, task_type="pick"))
            traj += 1
    return records


def test_from_records_pads_and_derives_columns():
    b = StepBatch.from_records(make_records(), pad_id=0)
    assert len(b) == 12 and b.num_trajectories == 4 and b.num_groups == 2
    assert b.prompt_ids.shape == (12, 4)
    assert b.prompt_lengths[:3].tolist() == [2, 3, 4]
    assert b.prompt_ids[0].tolist() == [1, 2, 0, 0]
    assert b.response_mask[3].tolist() == [1.0, 1.0] and b.response_mask[0].tolist() == [1.0, 0.0]
    # episode_return = sum of the trajectory's rewards, on every row of it
    assert b.episode_return.tolist() == [1.0] * 3 + [0.0] * 3 + [1.0] * 3 + [0.0] * 3
    assert b.action_valid.tolist()[:3] == [True, False, True]
    assert b.hidden is None and b.advantages is None


def test_missing_required_key_is_named():
    records = make_records()
    del records[3]["reward"]
    with pytest.raises(KeyError, match="reward"):
        StepBatch.from_records(records)


def test_mismatched_rows_are_rejected():
    b = StepBatch.from_records(make_records())
    with pytest.raises(ValueError, match="advantages has 3 rows, expected 12"):
        b.with_columns(advantages=torch.zeros(3))


def test_select_by_mask_and_index_keeps_strings_aligned():
    b = StepBatch.from_records(make_records()).with_columns(hidden=torch.arange(12.0).unsqueeze(1))
    sel = b.select(b.group_id == 17)
    assert len(sel) == 6 and set(sel.anchor_obs) == {"obs 1 0", "obs 1 1", "obs 1 2"}
    assert sel.hidden[:, 0].tolist() == list(range(6, 12))
    idx = b.select([5, 0])
    assert idx.anchor_obs == [b.anchor_obs[5], b.anchor_obs[0]] and idx.step.tolist() == [2, 0]


def test_concat_pads_token_columns_and_keeps_ids():
    a = StepBatch.from_records(make_records(groups=1))
    long = make_records(groups=1)
    long[0]["prompt_ids"] = list(range(1, 9))
    c = StepBatch.from_records(long).offset_ids(100, 100)
    both = StepBatch.concat([a, c])
    assert len(both) == len(a) + len(c) and both.prompt_ids.shape[1] == 8
    assert both.prompt_ids[0].tolist() == a.prompt_ids[0].tolist() + [0] * 4
    assert both.num_trajectories == 4 and both.num_groups == 2
    with pytest.raises(ValueError, match="different columns"):
        StepBatch.concat([a, c.with_columns(advantages=torch.zeros(len(c)))])


def test_group_and_trajectory_segments():
    b = StepBatch.from_records(make_records())
    seg, n = b.group_segments()
    assert n == 2 and seg.tolist() == [0] * 6 + [1] * 6
    last = b.trajectory_rows()
    assert b.step[last].tolist() == [2, 2, 2, 2] and b.traj_id[last].tolist() == [0, 1, 2, 3]
    ids, count = segment_ids(torch.tensor([9, 3, 9, 5]))
    assert ids.tolist() == [2, 0, 2, 1] and count == 3


def test_save_load_round_trip_and_pickle(tmp_path):
    b = StepBatch.from_records(make_records()).with_columns(
        hidden=torch.randn(12, 4), advantages=torch.randn(12), extras={"weight": torch.ones(12)})
    path = b.save(tmp_path / "batch")
    loaded = StepBatch.load(path)
    for name in ("prompt_ids", "response_ids", "response_mask", "reward", "done", "hidden", "advantages",
                 "env_reward", "invalid_penalty", "noop_penalty", "is_expert", "policy_version"):
        assert torch.equal(getattr(b, name), getattr(loaded, name)), name
        assert getattr(loaded, name).dtype == getattr(b, name).dtype, name
    assert loaded.anchor_obs == b.anchor_obs and loaded.extras["weight"].sum() == 12
    # token ids are stored as int32 on disk (half the bytes) and come back as the contract's int64
    from safetensors.torch import load_file
    assert load_file(str(path / "tensors.safetensors"))["prompt_ids"].dtype == torch.int32
    b.save(path)  # overwriting an existing save works and leaves no temp dir behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch"]
    restored = pickle.loads(pickle.dumps(b))
    assert torch.equal(restored.hidden, b.hidden)
    with pytest.raises(FileNotFoundError):
        StepBatch.load(tmp_path / "nothing")


def test_to_device_moves_every_tensor():
    b = StepBatch.from_records(make_records()).with_columns(advantages=torch.zeros(12))
    moved = b.to("meta")
    assert moved.prompt_ids.device.type == "meta" and moved.advantages.device.type == "meta"
    assert moved.action == b.action


def test_anchor_keys_number_each_groups_observations_and_travel_with_the_rows(tmp_path):
    records = make_records()
    for r in records:  # two observations per group: "obs g first" at step 0, "obs g later" after it
        r["anchor_obs"] = f"obs {r['group_id']} " + ("first" if r["step"] == 0 else "later")
    plain = StepBatch.from_records(records)
    assert plain.anchor_key is None
    keyed = plain.with_anchor_keys()
    assert keyed.anchor_key.tolist() == [0, 1, 1] * 4
    assert StepBatch.from_records([dict(r, anchor_key=k) for r, k in
                                   zip(records, keyed.anchor_key.tolist())]).anchor_key.tolist() == [0, 1, 1] * 4
    part = keyed.select(torch.tensor([4, 5, 0]))
    assert part.anchor_key.tolist() == [1, 1, 0]
    both = StepBatch.concat([keyed, keyed.offset_ids(traj_offset=4, group_offset=100)])
    assert both.anchor_key.tolist() == [0, 1, 1] * 8
    assert torch.equal(StepBatch.load(keyed.save(tmp_path / "b")).anchor_key, keyed.anchor_key)
    with pytest.raises(ValueError, match="cannot concatenate StepBatches with different columns"):
        StepBatch.concat([keyed, plain])
    with pytest.raises(ValueError, match="anchor_key must be >= 0"):
        keyed.with_columns(anchor_key=-keyed.anchor_key - 1)
