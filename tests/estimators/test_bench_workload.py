"""The estimator bench workload: realistic repetition rates, and the estimators agree with the
per-record references on a small copy of it."""

import pytest
import torch

from agentrl.estimators.reference import reference_advantages
from agentrl.bench.estimators import CASES, make_workload, workload_stats
from agentrl.estimators import compute_advantages


def test_singleton_rates_are_in_the_papers_range():
    # full-size batch, small hidden size: the rates depend on the walk and the noise, not on d
    stats = workload_stats(make_workload(hidden_size=256))
    assert 0.27 <= stats["obs_hash_singleton_rate"] <= 0.34      # BiPACE paper, ALFWorld obs-hash
    assert 0.10 <= stats["bigpo_singleton_rate"] < stats["obs_hash_singleton_rate"]
    assert stats["bigpo_clusters_per_group"] < stats["obs_hash_groups_per_group"]
    assert stats["bigpo_gflop"] > 0


@pytest.mark.parametrize("label,name,params", CASES, ids=[c[0] for c in CASES])
def test_small_workload_matches_reference(label, name, params):
    batch = make_workload(num_trajectories=16, num_groups=2, steps=12, hidden_size=64, seed=3)
    fast, _ = compute_advantages(name, batch, **params)
    reference = reference_advantages(name, batch, **params)
    assert torch.allclose(fast.double(), reference, atol=1e-6, rtol=1e-6), label


def test_bench_command_reports_agreement_and_the_clustering_path(capsys):
    import json

    from agentrl.estimators.builtin.bipace import kernel_loader
    from agentrl.cli.main import main

    code = main(["bench", "estimators", "--json", "--trajectories", "16", "--groups", "2", "--steps", "12",
                 "--hidden-size", "64", "--repeats", "1", "--only", "grpo", "bipace_q"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["all_agree"] is True
    assert set(summary["estimators"]) == {"grpo", "bipace_q"}
    assert summary["estimators"]["bipace_q"]["ms"] > 0 and summary["estimators"]["bipace_q"]["agree"]
    if kernel_loader.compiler() is not None:
        assert summary["bigpo_path"].startswith("native")
    else:
        assert summary["bigpo_path"].startswith("numpy (no C compiler")
