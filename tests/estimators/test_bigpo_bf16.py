"""BiGPO on bfloat16 hidden states: bf16 products, decisions equal to the float32 pass on the upcast
states (the row-by-row reference), and the float32 fallback."""

import numpy as np
import pytest
import torch

from agentrl.bench._estimators_reference import reference_clusters
from agentrl.bench.estimators import make_workload
from agentrl.estimators import bigpo_bf16, bigpo_clustering, compute_advantages
from agentrl.estimators.bigpo_bf16 import cosine_error, seed_clusters_bf16
from agentrl.estimators.bigpo_clustering import greedy_cosine_clusters

EPS = 0.10


def bf16_batch(batch):
    return batch.with_columns(hidden=batch.hidden.to(torch.bfloat16))


@pytest.fixture(scope="module")
def batch():
    # 6 groups of 120 rows, about half of them seeds: many candidates per block, several chunks
    return bf16_batch(make_workload(num_trajectories=24, num_groups=6, steps=30, hidden_size=64, seed=1))


def radius_batch(hidden=1024, groups=3, per_group=160):
    """Rows at cosines 0.93-0.97 from a few directions, so that pairs sit at 0.86-0.94, around the
    0.90 radius: many decisions fall inside the bf16 error bound and must be settled in float32."""
    gen = torch.Generator().manual_seed(0)
    anchors = torch.nn.functional.normalize(torch.randn(groups, 6, hidden, generator=gen), dim=-1)
    base = anchors[torch.arange(groups)[:, None], torch.randint(0, 6, (groups, per_group), generator=gen)]
    noise = torch.randn(groups, per_group, hidden, generator=gen)
    noise = torch.nn.functional.normalize(noise - (noise * base).sum(-1, keepdim=True) * base, dim=-1)
    cosine = 0.93 + 0.04 * torch.rand(groups, per_group, 1, generator=gen)
    rows = (cosine * base + (1 - cosine ** 2).sqrt() * noise) * (0.5 + torch.rand(groups, per_group, 1, generator=gen))
    return make_workload(num_trajectories=groups * 4, num_groups=groups, steps=per_group // 4, hidden_size=8,
                         seed=0).with_columns(hidden=rows.reshape(-1, hidden).to(torch.bfloat16))


def recording(monkeypatch, name):
    calls = []
    original = getattr(bigpo_clustering, name)

    def wrapper(*args, **kwargs):
        calls.append(args[0].dtype)
        return original(*args, **kwargs)

    monkeypatch.setattr(bigpo_clustering, name, wrapper)
    return calls


@pytest.mark.parametrize("block, chunk", [(1, 1), (5, 3), (64, 16), (128, 1000)])
def test_bf16_states_get_the_row_by_row_labels(batch, block, chunk, monkeypatch):
    monkeypatch.setattr(bigpo_clustering, "CANDIDATE_CHUNK", chunk)
    calls = recording(monkeypatch, "seed_clusters_bf16")
    group, num_groups = batch.group_segments()
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS, block=block)
    assert calls and set(calls) == {torch.bfloat16}            # the bf16 pass ran, on bf16 rows
    assert num > 200
    assert torch.equal(labels, torch.tensor(reference_clusters(batch, EPS, "seed")))


def test_rows_at_the_radius_are_settled_in_float32(monkeypatch):
    batch = radius_batch()
    settled = []
    pair_cosines = bigpo_bf16._pair_cosines

    def counting(*args):
        out = pair_cosines(*args)
        settled.append(out.size)
        return out

    monkeypatch.setattr(bigpo_bf16, "_pair_cosines", counting)
    group, num_groups = batch.group_segments()
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS)
    assert torch.equal(labels, torch.tensor(reference_clusters(batch, EPS, "seed")))
    assert sum(settled) > 50                    # the bounds left decisions open, and exact cosines took them
    assert 3 * 6 < num < len(batch) // 2


def test_bench_shaped_states_match_the_float32_pass():
    work = make_workload(num_trajectories=16, num_groups=2, steps=50, hidden_size=3584, seed=3)
    x = work.hidden.to(torch.bfloat16)
    for eps in (0.05, 0.10, 0.20):
        threshold = 1.0 - eps - bigpo_clustering.DISTANCE_TOLERANCE
        for rows in (x[:400], x[400:]):
            want = bigpo_clustering._seed_clusters(rows.float().contiguous(), threshold, 64)
            got = seed_clusters_bf16(rows.contiguous(), threshold, 64, 16)
            assert np.array_equal(got, want)


@pytest.mark.parametrize("dim", [64, 3584])
def test_the_error_bound_holds_for_bf16_products(dim):
    gen = torch.Generator().manual_seed(dim)
    common = torch.randn(1, dim, generator=gen)
    a = (common + 0.3 * torch.randn(200, dim, generator=gen)).to(torch.bfloat16)
    b = (common + torch.randn(150, dim, generator=gen)).to(torch.bfloat16)
    inv_a = 1.0 / a.double().norm(dim=1)
    inv_b = 1.0 / b.double().norm(dim=1)
    est = (torch.mm(a, b.t()).double() * inv_a[:, None] * inv_b[None, :]).numpy()
    exact = (torch.mm(a.double(), b.double().t()) * inv_a[:, None] * inv_b[None, :]).numpy()
    err = np.abs(est - exact)
    assert (err <= cosine_error(est, dim)).all()
    assert err.max() > 1e-4                     # bf16 rounding is really there: the bound is not idle
    assert bigpo_bf16.bf16_products_are_bounded(dim)


def test_an_unbounded_machine_uses_the_float32_pass(batch, monkeypatch):
    monkeypatch.setattr(bigpo_clustering, "bf16_products_are_bounded", lambda dim: False)
    float32_calls = recording(monkeypatch, "_seed_clusters")
    bf16_calls = recording(monkeypatch, "seed_clusters_bf16")
    group, num_groups = batch.group_segments()
    labels, _ = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS)
    assert not bf16_calls and set(float32_calls) == {torch.float32}
    assert torch.equal(labels, torch.tensor(reference_clusters(batch, EPS, "seed")))


def test_bipace_on_bf16_states_equals_bipace_on_their_float32_copy(batch):
    upcast = batch.with_columns(hidden=batch.hidden.to(torch.float32))
    for pace in ("q", "first_token"):
        adv, diag = compute_advantages("bipace", batch, eps=EPS, pace=pace)
        want, want_diag = compute_advantages("bipace", upcast, eps=EPS, pace=pace)
        assert torch.equal(adv, want) and diag == want_diag
