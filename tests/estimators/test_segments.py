"""The fast paths of the segment helpers (sorted keys, rows in step order, ranking tables) give
the same ids as the general sorting paths."""

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from agentrl.data import segment_ids
from agentrl.estimators import common

from estimator_batches import two_trajectory_batch

keys = st.lists(st.integers(-5, 40), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(keys, st.booleans())
def test_segments_equal_sorted_unique(values, presorted):
    k = torch.tensor(sorted(values) if presorted else values)
    ids, num = common.segments(k)
    expected, expected_num = segment_ids(k)
    assert torch.equal(ids, expected) and num == expected_num


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50)), min_size=1, max_size=60))
def test_pair_segments_table_and_sort_agree_with_unique(pairs):
    outer = torch.tensor([p[0] for p in pairs])
    inner = torch.tensor([p[1] for p in pairs])
    ids, num = common.pair_segments(outer, inner)
    _, expected = np.unique(np.array(pairs), axis=0, return_inverse=True)
    assert num == int(expected.max()) + 1
    assert torch.equal(ids, torch.from_numpy(expected.reshape(-1)))


def test_layout_fast_path_equals_shuffled_rows():
    batch = two_trajectory_batch()
    perm = [3, 0, 4, 2, 1]
    ordered, shuffled = common.TrajectoryLayout.of(batch), common.TrajectoryLayout.of(batch.select(perm))
    assert torch.equal(ordered.pos[perm], shuffled.pos) and ordered.max_len == shuffled.max_len == 3
    rewards = batch.reward.double()
    assert torch.allclose(ordered.discounted_sum(rewards, 0.5)[perm], shuffled.discounted_sum(rewards[perm], 0.5))
