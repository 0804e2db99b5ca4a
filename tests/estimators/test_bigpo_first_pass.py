"""The BiGPO seed clustering (bfloat16 or float32 first pass, float64 re-checks) gives exactly the
clusters of a row-by-row greedy pass on float64 cosines.

Adversarial rows: duplicates, scaled copies, zero vectors, points at the radius (1 - cos = eps
exactly, up to rounding), rows tied between two seeds, and high-dimensional rows whose cosines
fall inside the first pass's error margin, so that the exact re-checks decide.
"""

import math

import torch
from hypothesis import given, settings, strategies as st

from agentrl.bench._estimators_reference import reference_clusters
from agentrl.data import StepBatch
from agentrl.estimators import bigpo_clustering
from agentrl.estimators.bigpo_clustering import first_pass_error, greedy_cosine_clusters

from batches import record


def both_passes(hidden, group, num_groups, eps, block=128):
    fast, k_fast = greedy_cosine_clusters(hidden, group, num_groups, eps, block=block)
    exact, k_exact = greedy_cosine_clusters(hidden, group, num_groups, eps, block=block, first_pass=False)
    return fast, exact, k_fast, k_exact


def float64_greedy(hidden, group, eps):
    """The specification: row by row, float64 cosines with every earlier seed, first maximum."""
    threshold = 1.0 - eps - bigpo_clustering.DISTANCE_TOLERANCE
    x = hidden.double()
    norm = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12)
    labels, seeds = [], {}
    for i, g in enumerate(group.tolist()):
        own = seeds.setdefault(g, [])
        sims = [float(x[i] @ x[j]) / float(norm[i] * norm[j]) for j, _ in own]
        best = max(range(len(sims)), key=lambda c: (sims[c], -c)) if sims else None
        if best is not None and sims[best] >= threshold:
            labels.append(own[best][1])
        else:
            label = sum(len(v) for v in seeds.values())
            own.append((i, label))
            labels.append(label)
    return torch.tensor(labels)


def same_partition(a, b):
    return torch.unique(torch.stack([a, b]), dim=1).shape[1] == torch.unique(a).numel() == torch.unique(b).numel()


@st.composite
def adversarial_rows(draw):
    """2-d and 4-d rows built from a few base directions: exact radius points, ties, duplicates."""
    eps = draw(st.sampled_from([0.0, 0.05, 0.1, 0.3]))
    theta = math.acos(1.0 - eps)            # the angle of a point exactly at the radius
    bases = [draw(st.floats(0, 2 * math.pi)) for _ in range(draw(st.integers(1, 3)))]
    rows = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["base", "radius", "tie", "dup", "zero", "scaled", "random"]))
        base = draw(st.sampled_from(bases))
        if kind == "base":
            v = [math.cos(base), math.sin(base)]
        elif kind == "radius":
            a = base + draw(st.sampled_from([-1, 1])) * theta
            v = [math.cos(a), math.sin(a)]
        elif kind == "tie":                  # halfway between two points at twice the radius
            v = [math.cos(base + theta), math.sin(base + theta)]
        elif kind == "dup" and rows:
            v = list(draw(st.sampled_from(rows)))
        elif kind == "zero":
            v = [0.0, 0.0]
        elif kind == "scaled" and rows:
            v = [c * draw(st.sampled_from([1e-3, 0.5, 3.0, 1e3])) for c in draw(st.sampled_from(rows))]
        else:
            v = [draw(st.floats(-1, 1, width=32)), draw(st.floats(-1, 1, width=32))]
        rows.append(v)
    if draw(st.booleans()):                  # the same rows in 4-d: a second copy of the plane
        rows = [v + [c * 0.5 for c in v] for v in rows]
    return eps, torch.tensor(rows, dtype=torch.float32), draw(st.integers(1, 5))


@settings(max_examples=150, deadline=None)
@given(adversarial_rows())
def test_first_pass_equals_float32_pass_and_float64_greedy(case):
    eps, hidden, block = case
    n = hidden.shape[0]
    group = torch.zeros(n, dtype=torch.int64)
    fast, exact, k_fast, k_exact = both_passes(hidden, group, 1, eps, block)
    assert torch.equal(fast, exact) and k_fast == k_exact
    assert same_partition(fast, float64_greedy(hidden, group, eps))


def near_radius_rows(n=300, dim=512, eps=0.1, seed=0):
    """Rows at cosines 1 - eps +- a few thousandths of a few seed directions (inside the margin)."""
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.nn.functional.normalize(torch.randn(4, dim, generator=gen), dim=1)
    pick = torch.randint(0, 4, (n,), generator=gen)
    target = 1 - eps + (torch.rand(n, generator=gen) - 0.5) * 0.03          # cos to the seed
    noise = torch.randn(n, dim, generator=gen)
    noise -= (noise * seeds[pick]).sum(1, keepdim=True) * seeds[pick]      # orthogonal to the seed
    noise = torch.nn.functional.normalize(noise, dim=1)
    rows = target[:, None] * seeds[pick] + (1 - target[:, None] ** 2).sqrt() * noise
    rows = torch.cat([seeds, rows]) * (0.5 + torch.rand(n + 4, 1, generator=gen))   # varied norms
    rows[torch.randint(0, n, (10,), generator=gen)] = 0.0                     # a few zero vectors
    return rows


def test_first_pass_re_checks_decide_near_the_radius(monkeypatch):
    hidden = near_radius_rows()
    group = torch.arange(hidden.shape[0]) % 2
    calls = []
    original = bigpo_clustering._Group.exact
    monkeypatch.setattr(bigpo_clustering._Group, "exact",
                        lambda self, rows, cols: calls.append(len(rows)) or original(self, rows, cols))
    spec = float64_greedy(hidden, group, 0.1)
    for block in (7, 64, 128):
        fast, exact, _, _ = both_passes(hidden, group, 2, 0.1, block)
        assert torch.equal(fast, exact) and same_partition(fast, spec)
    assert sum(calls) > 100          # the margin left many decisions to the float32 re-check


def test_bench_workload_clusters_equal_the_reference():
    from agentrl.bench.estimators import make_workload

    batch = make_workload(num_trajectories=16, num_groups=2, steps=50, hidden_size=512)
    group, num_groups = batch.group_segments()
    fast, exact, _, _ = both_passes(batch.hidden, group, num_groups, 0.1)
    assert torch.equal(fast, exact)
    assert same_partition(fast, torch.tensor(reference_clusters(batch, 0.1, "seed")))


def test_first_pass_error_bound_holds():
    gen = torch.Generator().manual_seed(1)
    dim = 3584
    x = torch.randn(256, dim, generator=gen) * torch.rand(256, 1, generator=gen) * 10
    x[:64] = x[64:128] + 1e-3 * torch.randn(64, dim, generator=gen)          # close pairs (cos ~ 1)
    x[128:136] = 1 + 2.0 ** -9                                              # elements halfway between bf16 values
    norm = torch.linalg.vector_norm(x, dim=1)
    approx = (x.bfloat16() @ x.bfloat16().t()).float() / (norm[:, None] * norm[None, :])
    exact = (x.double() @ x.double().t()) / (norm[:, None] * norm[None, :]).double()
    c0, c1 = first_pass_error(dim)
    assert bool(((approx.double() - exact).abs() <= c0 + c1 * approx.abs().double()).all())
    single = (x @ x.t()) / (norm[:, None] * norm[None, :])
    c0, c1 = first_pass_error(dim, bfloat16=False)
    assert bool(((single.double() - exact).abs() <= c0 + c1 * single.abs().double()).all())


def test_non_finite_rows_give_the_same_clusters():
    hidden = near_radius_rows(n=40, dim=16)
    hidden[3, 0] = float("inf")
    group = torch.zeros(hidden.shape[0], dtype=torch.int64)
    fast, exact, _, _ = both_passes(hidden, group, 1, 0.1)
    assert torch.equal(fast, exact)
