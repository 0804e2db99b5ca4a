"""BiGPO seed clustering: every block size, candidate chunk and thread count, on the numpy path and
with the compiled block decisions, gives the labels of the row-by-row greedy pass."""

import threading

import numpy as np

import pytest
import torch

from agentrl.estimators.reference import reference_clusters
from agentrl.bench.estimators import make_workload
from agentrl.estimators.builtin.bipace import clustering, kernel, kernel_loader
from agentrl.estimators.builtin.bipace.clustering import DISTANCE_TOLERANCE, greedy_cosine_clusters

EPS = 0.10
needs_compiler = pytest.mark.skipif(kernel_loader.compiler() is None,
                                    reason="no C compiler: the native kernel cannot be built")


@pytest.fixture(scope="module")
def batch():
    # 6 groups of 120 rows, about half of them seeds: many candidates per block, several chunks
    return make_workload(num_trajectories=24, num_groups=6, steps=30, hidden_size=64, seed=1)


@pytest.fixture(scope="module")
def reference(batch):
    return torch.tensor(reference_clusters(batch, EPS, "seed"))


@pytest.fixture
def threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("block", [1, 5, 64, 128])
@pytest.mark.parametrize("chunk", [1, 3, 16, 1000])
def test_block_and_chunk_sizes_give_the_row_by_row_labels(batch, reference, block, chunk, monkeypatch):
    seed_clusters = clustering._seed_clusters
    monkeypatch.setattr(clustering, "_seed_clusters",
                        lambda x, threshold, block: seed_clusters(x, threshold, block, chunk))
    group, num_groups = batch.group_segments()
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS, block=block, use_native=False)
    assert num == int(reference.max()) + 1 > 200
    assert torch.equal(labels, reference)


@needs_compiler
@pytest.mark.parametrize("screen", [False, True])
@pytest.mark.parametrize("block", [None, 1, 3, 4, 5, 64, 1000])
@pytest.mark.parametrize("hidden_size", [64, 37])       # whole vectors, and a scalar tail
def test_native_block_decisions_give_the_row_by_row_labels(block, hidden_size, screen):
    batch = make_workload(num_trajectories=24, num_groups=6, steps=30, hidden_size=hidden_size, seed=1)
    group, num_groups = batch.group_segments()
    assert kernel.native_kernel() is not None, kernel_loader.native_status(kernel.NATIVE_SOURCE)
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS, native_block=block, screen=screen)
    reference = torch.tensor(reference_clusters(batch, EPS, "seed"))
    assert num == int(reference.max()) + 1 > 200
    assert torch.equal(labels, reference)


@needs_compiler
@pytest.mark.parametrize("block", [None, 64])
def test_screen_settles_what_bfloat16_cannot_decide(block):
    """Bench-shaped rows (hidden 3,584) whose revisits sit at cosines 0.86-0.99, around the radius
    (0.90): the bfloat16 screen (error up to 0.012) must hand the close calls to float32."""
    from agentrl.estimators.builtin.bipace.kernel import screen_bound, seed_clusters_native

    gen = torch.Generator().manual_seed(5)
    hidden, rows_per_group = 3584, 200
    anchors = torch.nn.functional.normalize(torch.randn(2, 12, hidden, generator=gen), dim=-1)
    base = anchors[torch.arange(2)[:, None], torch.randint(0, 12, (2, rows_per_group), generator=gen)]
    noise = torch.randn(2, rows_per_group, hidden, generator=gen)
    noise = torch.nn.functional.normalize(noise - (noise * base).sum(-1, keepdim=True) * base, dim=-1)
    cosine = 0.93 + 0.06 * torch.rand(2, rows_per_group, 1, generator=gen)
    rows = (cosine * base + (1 - cosine ** 2).sqrt() * noise) * (0.5 + torch.rand(2, rows_per_group, 1, generator=gen))
    rows = rows.reshape(-1, hidden)
    group = torch.arange(2).repeat_interleave(rows_per_group)
    lib = kernel.native_kernel()
    _, settled = seed_clusters_native(rows[:rows_per_group].contiguous(), 1 - EPS - 1e-6, block, lib, screened=True)
    assert settled > 20                        # the screen really was undecided on some pairs
    assert 0.0120 < screen_bound(hidden) < 0.0122
    exact, num_exact = greedy_cosine_clusters(rows, group, 2, EPS, use_native=False)
    screened, num_screened = greedy_cosine_clusters(rows, group, 2, EPS, native_block=block, screen=True)
    assert torch.equal(screened, exact) and num_screened == num_exact
    assert 24 < num_exact < len(rows) // 2


@needs_compiler
def test_screen_is_skipped_for_rows_outside_its_norm_range():
    """Norms above 1e18 (bfloat16 products could overflow) or below 1e-15 (subnormals): such a
    group runs unscreened, with the labels of the unscreened pass."""
    from agentrl.estimators.builtin.bipace.kernel import seed_clusters_native

    batch = make_workload(num_trajectories=8, num_groups=1, steps=30, hidden_size=64, seed=2)
    lib = kernel.native_kernel()
    threshold = 1 - EPS - 1e-6
    _, settled = seed_clusters_native(batch.hidden.contiguous(), threshold, None, lib, screened=True)
    assert settled > 0                                        # in range: screened
    for scale in (5e18, 1e-16):
        x = (batch.hidden * scale).contiguous()
        owner, settled = seed_clusters_native(x, threshold, None, lib, screened=True)
        expected, _ = seed_clusters_native(x, threshold, None, lib, screened=False)
        assert settled == 0 and (owner == expected).all()


@needs_compiler
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_native_path_groups_duplicates_and_breaks_ties_to_the_older_seed(eps):
    """eps = 0 joins exact duplicates only; a row equidistant from two seeds joins the older one."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(5, 40, generator=gen)
    rows = base[torch.randint(0, 5, (60,), generator=gen)] * (1 + torch.rand(60, 1, generator=gen))
    a, b = torch.zeros(40), torch.zeros(40)
    a[0], b[1] = 1.0, 1.0
    rows = torch.cat([a[None], b[None], (a + b)[None], rows])       # (a + b) is at 0.707 of both seeds
    group = torch.zeros(len(rows), dtype=torch.int64)
    for threshold_eps in (eps, 0.3):
        fast, n_fast = greedy_cosine_clusters(rows, group, 1, threshold_eps, native_block=4, screen=False)
        screened, n_screened = greedy_cosine_clusters(rows, group, 1, threshold_eps, screen=True)
        slow, n_slow = greedy_cosine_clusters(rows, group, 1, threshold_eps, use_native=False)
        assert torch.equal(fast, slow) and torch.equal(screened, slow) and n_fast == n_slow == n_screened
    labels, num = greedy_cosine_clusters(rows, group, 1, 0.3, native_block=4)
    assert labels[2] == labels[0] != labels[1]                     # cosine 0.707 >= 0.7: the older seed
    labels, num = greedy_cosine_clusters(rows, group, 1, 0.0, native_block=4)
    assert num == 3 + 5                                            # a, b, a + b and the 5 directions


@pytest.mark.parametrize("use_native", [pytest.param(True, marks=needs_compiler), False])
def test_groups_run_on_the_torch_threads_with_identical_labels(batch, threads, monkeypatch, use_native):
    perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = batch.select(perm)                       # groups interleaved: gathered, not views
    group, num_groups = shuffled.group_segments()
    torch.set_num_threads(1)
    single, num_single = greedy_cosine_clusters(shuffled.hidden, group, num_groups, EPS, use_native=use_native)

    seen = []
    name = "seed_clusters_native" if use_native else "_seed_clusters"
    seed_clusters = getattr(clustering, name)

    def recording(*args, **kwargs):
        seen.append((threading.get_ident(), torch.get_num_threads()))
        return seed_clusters(*args, **kwargs)

    monkeypatch.setattr(clustering, name, recording)
    torch.set_num_threads(2)
    labels, num = greedy_cosine_clusters(shuffled.hidden, group, num_groups, EPS, use_native=use_native)
    assert torch.get_num_threads() == 2                 # restored after the parallel section
    assert torch.equal(labels, single) and num == num_single
    assert len(seen) == num_groups
    assert all(ident != threading.get_ident() and intra == 1 for ident, intra in seen)


@pytest.mark.parametrize("use_native", [pytest.param(True, marks=needs_compiler), False])
def test_rows_at_the_radius_get_the_row_by_row_labels(use_native):
    """Rows at cosines 0.93-0.97 from a few directions: two rows of one direction are at about
    0.86-0.94 from each other, around the eps = 0.10 radius (0.90), so many joins are decided by
    the last digits of a cosine."""
    gen = torch.Generator().manual_seed(0)
    groups, per_group, hidden = 3, 160, 1024
    anchors = torch.nn.functional.normalize(torch.randn(groups, 6, hidden, generator=gen), dim=-1)
    base = anchors[torch.arange(groups)[:, None], torch.randint(0, 6, (groups, per_group), generator=gen)]
    noise = torch.randn(groups, per_group, hidden, generator=gen)
    noise = torch.nn.functional.normalize(noise - (noise * base).sum(-1, keepdim=True) * base, dim=-1)
    cosine = 0.93 + 0.04 * torch.rand(groups, per_group, 1, generator=gen)
    rows = (cosine * base + (1 - cosine ** 2).sqrt() * noise) * (0.5 + torch.rand(groups, per_group, 1, generator=gen))
    batch = make_workload(num_trajectories=groups * 4, num_groups=groups, steps=per_group // 4, hidden_size=8,
                          seed=0).with_columns(hidden=rows.reshape(-1, hidden))
    group, num_groups = batch.group_segments()
    labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS, use_native=use_native)
    assert torch.equal(labels, torch.tensor(reference_clusters(batch, EPS, "seed")))
    assert 3 * 6 < num < len(batch) // 2        # neither one cluster per direction nor mostly singletons


@pytest.mark.parametrize("use_native, screen", [pytest.param(True, True, marks=needs_compiler),
                                                pytest.param(True, False, marks=needs_compiler), (False, False)])
@pytest.mark.parametrize("hidden_size", [64, 37])
def test_mean_centroids_give_the_row_by_row_labels(use_native, screen, hidden_size, threads):
    """Running-mean centroids move with every join: the compiled pass re-compares a row with every
    centroid an earlier row of its tile moved or created, so each row sees them as the row-by-row
    pass does; two threads give the same labels."""
    batch = make_workload(num_trajectories=24, num_groups=6, steps=30, hidden_size=hidden_size, seed=4)
    group, num_groups = batch.group_segments()
    reference = torch.tensor(reference_clusters(batch, EPS, "mean"))
    for torch_threads in (1, 2):
        torch.set_num_threads(torch_threads)
        labels, num = greedy_cosine_clusters(batch.hidden, group, num_groups, EPS, centroid="mean",
                                             use_native=use_native, screen=screen)
        assert torch.equal(labels, reference) and num == int(reference.max()) + 1


@needs_compiler
def test_mean_centroids_at_the_radius_native_equals_numpy():
    gen = torch.Generator().manual_seed(7)
    anchors = torch.nn.functional.normalize(torch.randn(5, 256, generator=gen), dim=-1)
    base = anchors[torch.randint(0, 5, (300,), generator=gen)]
    rows = base + 0.35 * torch.nn.functional.normalize(torch.randn(300, 256, generator=gen), dim=-1)
    group = torch.zeros(300, dtype=torch.int64)
    from agentrl.estimators.builtin.bipace.kernel import mean_clusters_native

    numpy_labels, n2 = greedy_cosine_clusters(rows, group, 1, EPS, centroid="mean", use_native=False)
    for screen in (False, True):
        native_labels, n1 = greedy_cosine_clusters(rows, group, 1, EPS, centroid="mean", screen=screen)
        assert torch.equal(native_labels, numpy_labels) and n1 == n2
    lib = kernel.native_kernel()
    if lib.bigpo_has_bf16_tiles():
        _, settled = mean_clusters_native(rows.contiguous(), 1 - EPS - 1e-6, lib, screened=True)
        assert settled > 10                 # the screen handed close calls to float32
    assert 5 < n1 < 150                     # joins and new clusters both happen near the radius


@pytest.mark.parametrize("centroid", ["seed", "mean"])
@pytest.mark.parametrize("use_native, screen", [pytest.param(True, True, marks=needs_compiler),
                                                pytest.param(True, False, marks=needs_compiler), (False, False)])
def test_threshold_is_compared_in_double_like_the_reference(centroid, use_native, screen):
    """Two rows whose float32 cosine c equals the threshold rounded to float32, while the threshold
    itself is just above c: as in the per-record reference (Python floats), they stay apart.
    (Found by hypothesis: with a float32 comparison the compiled pass joined them.)"""
    hidden = torch.tensor([[2.339682102203369, -0.7699058055877686, 0.0, 0.0],
                           [0.8190551996231079, -0.2682754099369049, 0.0, 0.0]])
    if centroid == "mean":
        unit = torch.nn.functional.normalize(hidden, dim=1)
        cosine = float(torch.dot(unit[0], unit[1]))
    else:
        norm = torch.linalg.vector_norm(hidden, dim=1)
        cosine = float(torch.dot(hidden[0], hidden[1]) / (norm[0] * norm[1]))
    threshold = cosine + 1e-9                       # above c in double, c in float32
    assert float(np.float32(threshold)) == cosine < threshold
    eps = 1.0 - DISTANCE_TOLERANCE - threshold
    group = torch.zeros(2, dtype=torch.int64)
    labels, num = greedy_cosine_clusters(hidden, group, 1, eps, centroid, use_native=use_native, screen=screen)
    assert labels.tolist() == [0, 1] and num == 2
    batch = make_workload(num_trajectories=1, num_groups=1, steps=2, hidden_size=4, seed=0).with_columns(hidden=hidden)
    assert reference_clusters(batch, eps, centroid) == [0, 1]


@needs_compiler
@pytest.mark.parametrize("seed", range(10))
def test_screened_passes_equal_float32_on_rows_near_the_radius(seed):
    """Rows at cosines from 0.90-0.999 up to 1 of a few directions, norms spread over e^(3 N(0,1)),
    d from 64 to 8,192 (where the bound is widest): for radii eps 0 to 0.2, both centroid kinds,
    the screened and unscreened compiled passes give the numpy pass's labels."""
    gen = torch.Generator().manual_seed(seed)
    d, n, k = [64, 333, 1024, 3584, 8192][seed % 5], 120, 1 + seed % 7
    anchors = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=-1)
    base = anchors[torch.randint(0, k, (n,), generator=gen)]
    noise = torch.randn(n, d, generator=gen)
    noise = torch.nn.functional.normalize(noise - (noise * base).sum(-1, keepdim=True) * base, dim=-1)
    low = [0.9, 0.94, 0.97, 0.999][seed % 4]
    cosine = low + (1 - low) * torch.rand(n, 1, generator=gen)
    rows = (cosine * base + (1 - cosine ** 2).sqrt() * noise) * torch.exp(3 * torch.randn(n, 1, generator=gen))
    group = torch.zeros(n, dtype=torch.int64)
    for eps in (0.0, 0.01, 0.05, 0.1, 0.2):
        for centroid in ("seed", "mean"):
            expected, _ = greedy_cosine_clusters(rows, group, 1, eps, centroid, use_native=False)
            for screen in (True, False):
                labels, _ = greedy_cosine_clusters(rows, group, 1, eps, centroid, screen=screen)
                assert torch.equal(labels, expected), (eps, centroid, screen)
