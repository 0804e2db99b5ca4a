"""REINFORCE++-baseline on a hand-computed batch, and the docs' "write your own estimator" example,
run as a user's module loaded by import path, against the shipped estimator.

The batch: group 0 is the worked example of batches.two_trajectory_batch (scores per row with the
default penalty placement: 10, 10, 0, -0.1, 0); group 1 holds two one-step trajectories with
rewards 1 and 0.
"""

import math
import re
from pathlib import Path

import pytest
import torch

from agentrl.data import StepBatch
from agentrl.estimators import compute_advantages, estimator_class

from estimator_batches import record, two_trajectory_batch


def two_groups() -> StepBatch:
    extra = StepBatch.from_records([record(1, 10, 0, "X", 1.0, True), record(1, 11, 0, "Y", 0.0, True)])
    return StepBatch.concat([two_trajectory_batch().with_columns(hidden=None), extra])


def close(actual, expected, tol=1e-5):
    assert actual.dtype == torch.float32
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=tol), actual


def test_group_mean_baseline_whitened_over_the_batch():
    # steps: group 0's row mean 3.98 -> d = 6.02, 6.02, -3.98, -4.08, -3.98; group 1: 0.5, -0.5.
    # Each group's d sums to 0, so the batch mean is 0; the unbiased batch variance is
    # (2 * 36.2404 + 2 * 15.8404 + 16.6464 + 2 * 0.25) / 6 = 121.308 / 6
    d = [6.02, 6.02, -3.98, -4.08, -3.98, 0.5, -0.5]
    std = math.sqrt(121.308 / 6)
    adv, diag = compute_advantages("reinforce_pp", two_groups())
    close(adv, [x / (std + 1e-6) for x in d])
    assert diag["num_groups"] == 2.0
    plain, _ = compute_advantages("reinforce_pp", two_groups(), whiten=False)
    close(plain, d)


def test_trajectory_baseline_keeps_the_rows_penalty():
    # trajectories: group 0's returns 10 and 0 (mean 5): d = 5, 5, -5, -5.1, -5; group 1: 0.5, -0.5
    d = [5.0, 5.0, -5.0, -5.1, -5.0, 0.5, -0.5]
    mean = sum(d) / 7
    std = math.sqrt(sum((x - mean) ** 2 for x in d) / 6)
    adv, _ = compute_advantages("reinforce_pp", two_groups(), episode_stats="trajectories")
    close(adv, [(x - mean) / (std + 1e-6) for x in d])


def test_a_single_trajectory_group_is_its_own_baseline():
    adv, _ = compute_advantages("reinforce_pp", two_trajectory_batch().select([0, 1]), episode_stats="trajectories",
                                whiten=False)
    close(adv, [0.0, 0.0])


def test_the_docs_walkthrough_estimator_runs_by_import_path_and_matches(tmp_path, monkeypatch):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "estimators.md").read_text()
    section = doc[doc.index("## Write your own estimator"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    package = tmp_path / "my_estimators"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "reinforce_baseline.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    cls = estimator_class("my_estimators.reinforce_baseline:ReinforceBaseline")
    for whiten in (True, False):
        for penalty_mode in ("after_discount", "in_reward"):
            params = {"whiten": whiten, "penalty_mode": penalty_mode}
            mine, _ = cls(cls.Params(**params)).advantages(two_groups())
            shipped, _ = compute_advantages("reinforce_pp", two_groups(), **params)
            assert torch.allclose(mine, shipped, atol=1e-6), params
    with pytest.raises(ValueError, match="whiten"):
        compute_advantages("my_estimators.reinforce_baseline:ReinforceBaseline", two_groups(), whiten="no")
