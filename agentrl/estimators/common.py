"""Tensor building blocks shared by the estimators: segment statistics, trajectory layout,
discounted returns, the invalid-action penalty and the episode-level (GRPO-style) term.

All math runs in float64 on CPU tensors and is cast to float32 by the estimators at the end.
Nothing here loops over records in Python; string columns are turned into integer codes once
(one dictionary pass), after which everything is ``bincount``/``torch.unique`` and a few matmuls.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Sequence

import numpy as np
import torch

from agentrl.data import StepBatch

F64 = torch.float64


# ----- segment statistics ----------------------------------------------------------------------------
# On CPU every torch op costs ~5-20 us of dispatch; the statistics below are a few dozen ops over
# 6,400 rows, so they run in numpy (``bincount`` sums in row order, like ``index_add_``) on
# zero-copy views of the tensors and hand tensors back.
def string_codes(values: Sequence[str]) -> torch.Tensor:
    """Integer code per string (equal strings get equal codes, 0..K-1 in order of first appearance).

    One C-level pass: ``dict.setdefault`` maps every string to the index of its first row (no
    Python bytecode per row); the first-row indices are then ranked with a cumulative sum.
    """
    n = len(values)
    first_row = np.fromiter(map({}.setdefault, values, itertools.count()), dtype=np.int64, count=n)
    is_first = np.zeros(n, dtype=np.int64)
    is_first[first_row] = 1
    return torch.from_numpy((np.cumsum(is_first) - 1)[first_row])


def segments(keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Integer keys mapped to ids ``0..S-1`` in key order (as ``StepBatch.group_segments``).

    Collectors store rows grouped, so the keys are usually already sorted: then the ids are a
    cumulative count of key changes (one pass) instead of a sort.
    """
    k = keys.numpy()
    if k.size and bool((k[1:] >= k[:-1]).all()):
        ids = np.zeros(k.size, dtype=np.int64)
        np.cumsum(k[1:] != k[:-1], out=ids[1:])
        return torch.from_numpy(ids), int(ids[-1]) + 1
    uniq, inverse = np.unique(k, return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64, copy=False)), int(uniq.size)


def group_segments(batch: StepBatch) -> tuple[torch.Tensor, int]:
    return segments(batch.group_id)


def pair_segments(outer: torch.Tensor, inner: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Segment ids of the pairs (outer, inner): rows share a segment iff both keys are equal.

    The combined key ``outer * K + inner`` is ranked through a table of all its possible values
    (a scatter and a cumulative sum) when that table is small, else sorted.
    """
    if outer.numel() == 0:
        return outer.clone(), 0
    o, i = outer.numpy(), inner.numpy()
    width = int(i.max()) + 1
    key = o * width + i
    size = (int(o.max()) + 1) * width
    if size > 16 * key.size:                  # sparse keys: sort
        keys, inverse = np.unique(key, return_inverse=True)
        return torch.from_numpy(inverse.reshape(-1)), int(keys.size)
    present = np.zeros(size, dtype=np.int64)  # dense keys: rank them through a table
    present[key] = 1
    rank = np.cumsum(present)
    return torch.from_numpy(rank[key] - 1), int(rank[-1])


def _bincount(seg: torch.Tensor, num: int, weights: torch.Tensor | None = None) -> np.ndarray:
    return np.bincount(seg.numpy(), None if weights is None else weights.numpy(), minlength=num)


def segment_sum(values: torch.Tensor, seg: torch.Tensor, num: int) -> torch.Tensor:
    if not values.is_floating_point():
        return torch.zeros(num, dtype=values.dtype).index_add_(0, seg, values)
    return torch.from_numpy(_bincount(seg, num, values.to(F64))).to(values.dtype)


def segment_count(seg: torch.Tensor, num: int) -> torch.Tensor:
    return torch.from_numpy(_bincount(seg, num).astype(np.float64))


def _mean_std(values: np.ndarray, seg: np.ndarray, num: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = np.bincount(seg, minlength=num).astype(np.float64)
    mean = np.bincount(seg, values, minlength=num) / np.maximum(count, 1)
    dev = values - mean[seg]
    var = np.bincount(seg, dev * dev, minlength=num) / np.maximum(count - 1, 1)
    return mean, np.sqrt(var), count


def segment_mean_std(values: torch.Tensor, seg: torch.Tensor, num: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per segment: mean, unbiased std (0 where a segment has one member) and member count."""
    mean, std, count = _mean_std(values.to(F64).numpy(), seg.numpy(), num)
    return torch.from_numpy(mean), torch.from_numpy(std), torch.from_numpy(count)


def normalise_in_segments(values: torch.Tensor, seg: torch.Tensor, num: int, by_std: bool, epsilon: float,
                          singleton: str) -> torch.Tensor:
    """``(x - mean) / (std + epsilon)`` (or ``x - mean``) within each segment.

    ``singleton`` says what a one-member segment gives: ``"keep"`` (mean 0, std 1: the raw value,
    the reference code's episode and GRPO rule) or ``"zero"`` (mean = itself: 0, its step rule).
    """
    x, index = _f64(values), seg.numpy()
    count = np.bincount(index, minlength=num)
    mean = np.bincount(index, x, minlength=num) / np.maximum(count, 1)
    single = count == 1
    if singleton == "keep":
        mean[single] = 0.0
    out = x - mean[index]           # the deviation from the true mean wherever a segment has 2+ rows
    if by_std:
        std = np.sqrt(np.bincount(index, out * out, minlength=num) / np.maximum(count - 1, 1))
        std[single] = 1.0
        out /= std[index] + epsilon
    return torch.from_numpy(out)


# ----- trajectory layout and discounted sums ---------------------------------------------------------
@functools.lru_cache(maxsize=32)
def _discount_kernel(length: int, factor: float) -> np.ndarray:
    """``M[k, t] = factor^(k - t)`` for k >= t, else 0 (read-only: shared between calls)."""
    lag = np.arange(length, dtype=np.float64)[:, None] - np.arange(length, dtype=np.float64)[None, :]
    kernel = np.where(lag >= 0, np.power(factor, np.maximum(lag, 0.0)), 0.0)
    kernel.flags.writeable = False
    return kernel


@dataclasses.dataclass(frozen=True)
class TrajectoryLayout:
    """Where each row sits in a dense ``[num_trajectories, max_len]`` matrix (rows ordered by step).

    The dense matrices are numpy arrays with one spare column (``width = max_len + 1``), so that the
    slot after a trajectory's last row is always an empty one of the same trajectory.
    """

    traj: torch.Tensor      # trajectory segment id per row
    pos: torch.Tensor       # rank of the row's step inside its trajectory (0 = first)
    num_traj: int
    max_len: int

    @functools.cached_property
    def _flat(self) -> np.ndarray:
        return self.traj.numpy() * (self.max_len + 1) + self.pos.numpy()

    @classmethod
    def of(cls, batch: StepBatch) -> "TrajectoryLayout":
        traj, num_traj = segments(batch.traj_id)
        n = traj.numel()
        if n == 0:
            return cls(traj, traj.clone(), 0, 0)
        t, step = traj.numpy(), batch.step.numpy().astype(np.int64, copy=False)
        key = t * (int(step.max()) + 1) + step
        length = np.bincount(t, minlength=num_traj)
        start = np.cumsum(length) - length
        if bool((key[1:] > key[:-1]).all()):     # rows stored trajectory by trajectory, in step order
            pos = np.arange(n) - start[t]
        else:
            order = np.argsort(key, kind="stable")
            pos = np.empty(n, dtype=np.int64)
            pos[order] = np.arange(n) - start[t[order]]
        return cls(traj, torch.from_numpy(pos), num_traj, int(length.max()))

    def _dense(self, values: torch.Tensor | np.ndarray) -> np.ndarray:
        dense = np.zeros(self.num_traj * (self.max_len + 1), dtype=np.float64)
        dense[self._flat] = values.numpy() if isinstance(values, torch.Tensor) else values
        return dense

    def to_dense(self, values: torch.Tensor) -> torch.Tensor:
        """``[num_trajectories, max_len]`` float64 matrix of the values (0 where no row)."""
        return torch.from_numpy(self._dense(values.to(F64)).reshape(self.num_traj, -1)[:, :self.max_len].copy())

    def from_dense(self, dense: torch.Tensor) -> torch.Tensor:
        padded = np.zeros((self.num_traj, self.max_len + 1), dtype=np.float64)
        padded[:, :self.max_len] = dense.numpy()
        return torch.from_numpy(padded.reshape(-1)[self._flat])

    def discounted_sum(self, values: torch.Tensor, factor: float) -> torch.Tensor:
        """Per row: sum over k >= t of factor^(k - t) * values_k along its trajectory.

        One matmul with the upper-triangular matrix ``M[k, t] = factor^(k - t)`` (k >= t) instead of
        a backward loop; ``0 ** 0 = 1`` keeps ``factor = 0`` exact.
        """
        if self.num_traj == 0:
            return values.to(F64).clone()
        return torch.from_numpy(self.discounted_sum_np(values.to(F64).numpy(), factor))

    def discounted_sum_np(self, values: np.ndarray, factor: float) -> np.ndarray:
        """:meth:`discounted_sum` of a float64 numpy array."""
        if self.num_traj == 0:
            return values.copy()
        dense = self._dense(values).reshape(self.num_traj, -1)[:, :self.max_len]
        out = np.zeros((self.num_traj, self.max_len + 1), dtype=np.float64)
        out[:, :self.max_len] = dense @ _discount_kernel(self.max_len, float(factor))
        return out.reshape(-1)[self._flat]

    def next_row_values(self, values: torch.Tensor) -> torch.Tensor:
        """Per row: the value of the trajectory's next row, 0 after its last row."""
        return torch.from_numpy(self.next_row_values_np(values.to(F64).numpy()))

    def next_row_values_np(self, values: np.ndarray) -> np.ndarray:
        """:meth:`next_row_values` of a float64 numpy array."""
        if self.num_traj == 0:
            return values.copy()
        return self._dense(values)[self._flat + 1]


# ----- rewards, penalty, returns ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RowReturns:
    """What every estimator derives from the reward columns, per row (float64)."""

    episode_score: torch.Tensor     # s_j: the row's episode score (trajectory return, minus the row's own penalty)
    trajectory_return: torch.Tensor  # R(tau) of the row's trajectory, without any row's own penalty
    row_penalty: torch.Tensor       # c_j: the invalid-action penalty charged to row j itself (0 with in_reward)
    step_return: torch.Tensor | None  # G'_t: discounted return-to-go, penalty per penalty_mode (None: not asked)


def row_returns(batch: StepBatch, layout: TrajectoryLayout, gamma: float, penalty_mode: str,
                step: bool = True) -> RowReturns:
    """Episode scores and step returns from the StepBatch's reward columns.

    The step reward is ``env_reward - noop_penalty`` (the no-op penalty is an ordinary reward).
    The invalid-action penalty ``c_j = invalid_penalty`` is placed by ``penalty_mode``:

    * ``after_discount`` (the reference code): the rewards are summed and discounted without it,
      and it is charged to the invalid row's own episode score and step return only;
    * ``in_reward``: it is one more ordinary reward of its row.

    ``step=False`` skips the step returns (the episode-only estimators).
    """
    reward = _f64(batch.env_reward) - _f64(batch.noop_penalty)
    penalty = _f64(batch.invalid_penalty)
    if penalty_mode == "in_reward":
        reward, charged = reward - penalty, np.zeros_like(penalty)
    else:
        charged = penalty
    traj = layout.traj.numpy()
    total = np.bincount(traj, reward, minlength=layout.num_traj)[traj] if len(batch) else reward.copy()
    step_return = torch.from_numpy(layout.discounted_sum_np(reward, gamma) - charged) if step else None
    return RowReturns(torch.from_numpy(total - charged), torch.from_numpy(total), torch.from_numpy(charged),
                      step_return)


def _f64(values: torch.Tensor) -> np.ndarray:
    """float64 numpy copy (or view, when already float64) of a CPU tensor."""
    return values.numpy().astype(np.float64, copy=False)


def episode_advantage(batch: StepBatch, returns: RowReturns, by_std: bool, epsilon: float,
                      episode_stats: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """GRPO-style episode term per row, plus the group segment ids and count.

    ``steps``: ``(s_j - mean) / (std + epsilon)`` with mean and std over every step row's score
    ``s_j`` in the group (length-weighted, the reference code). ``trajectories``: mean and std
    over one return ``R(tau)`` per trajectory of the group, and the row's own penalty is charged
    after the division, ``(R(tau_j) - mean) / (std + epsilon) - c_j``: divided by the std of
    returns it does not take part in, a penalty would grow without bound as that std goes to 0
    (an invalid row in a group whose returns are all equal). Either way a group with a single
    member gets mean 0 and std 1 (the raw score is kept).
    """
    group, num_groups = group_segments(batch)
    score = returns.episode_score
    if episode_stats == "steps":
        return normalise_in_segments(score, group, num_groups, by_std, epsilon, "keep"), group, num_groups
    mean, std, count = trajectory_stats(batch, returns, group, num_groups)
    out = returns.trajectory_return - mean[group]
    if by_std:
        out = out / (std[group] + epsilon)
    return out - returns.row_penalty, group, num_groups


def trajectory_stats(batch: StepBatch, returns: RowReturns, group: torch.Tensor, num_groups: int):
    """Mean, unbiased std and count of the trajectory returns of each group (singleton: 0, 1)."""
    last = batch.trajectory_rows()
    mean, std, count = segment_mean_std(returns.trajectory_return[last], group[last], num_groups)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean, std, count


def anchor_segments(batch: StepBatch, group: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Segments of rows with the same group and exactly the same ``anchor_obs``.

    Uses the collector's per-group observation numbers (``batch.anchor_key``) when the batch has
    them: the same segments, without hashing every string (a third of GiGPO's time otherwise).
    """
    if batch.anchor_key is not None:
        return pair_segments(group, batch.anchor_key)
    return pair_segments(group, string_codes(batch.anchor_obs))


def singleton_rate(seg: torch.Tensor, num: int) -> float:
    if seg.numel() == 0:
        return 0.0
    index = seg.numpy()
    return float((np.bincount(index, minlength=num)[index] == 1).mean())


def mean_segment_size(seg: torch.Tensor, num: int) -> float:
    return float(seg.numel() / num) if num else 0.0
