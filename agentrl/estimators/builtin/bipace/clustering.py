"""BiGPO: greedy single-pass cosine clustering of step hidden states, and eps calibration.

Within each group, rows are visited in batch order; a row joins the cluster whose centroid is
nearest (largest cosine similarity ``x.y / (|x| |y|)``) if the cosine distance
``1 - cos`` is at most ``eps``, otherwise it starts a new cluster. Ties go to the older cluster.

Centroids (the sources do not say which; both are offered):

* ``"seed"`` (default): a cluster's centroid is its first member, as in the reference code's
  similarity grouping. Every member then lies within eps of one real state, the radius keeps its
  meaning as clusters grow, and the pass vectorises exactly: blocks of ``BLOCK`` rows are compared
  with the seeds found so far in one float32 matmul, the block's candidates (rows with no seed
  within the radius) with the rows after them in a staircase of matmuls of ``CANDIDATE_CHUNK``
  candidates (it skips most of the pairs that a row cannot join, about 8 % of the FLOPs on the
  bench workload), and only the acceptance of the candidates is resolved in Python. The result is
  identical to the row-by-row greedy pass; the work is each row's cosine with every earlier seed
  of its group (rows x clusters, not rows^2). When a C compiler is available the pass runs
  compiled instead (:mod:`~agentrl.estimators.builtin.bipace.kernel`, ``bigpo_block.c``, built on
  first use by :mod:`~agentrl.estimators.builtin.bipace.kernel_loader`): the C code settles rows in
  order and computes their cosines with the seeds of their own block in 4 x 6 tiles. On CPUs
  with native bfloat16 (AVX512-BF16) the cosines are first screened in bfloat16, with a proven
  error bound, and only the pairs the screen cannot decide are computed in float32; the whole
  group is then one C call. The labels are the same; ``AGENTRL_NATIVE=0`` or
  ``use_native=False`` selects the numpy path. Groups are independent: with
  ``torch.get_num_threads()`` > 1 they are spread over that many Python threads, each matmul on
  one intra-op thread (the matmuls release the GIL and are most of the time; a two-thread matmul
  per block gains little at these shapes, and on cores shared with other processes it stalls at
  the barrier after every product).
* ``"mean"``: the l2-normalised running mean of the members. Each row depends on every earlier
  join, so this goes row by row: compiled (``bigpo_mean_clusters`` in ``bigpo_block.c``, tiles
  of dot products, bfloat16-screened like the seed pass where possible, plus a fresh float32 dot
  product with each centroid moved since the tile's products),
  else a Python loop with a vectorised distance to all centroids.

A tolerance of 1e-6 is added to eps, so that eps = 0 groups identical vectors whose cosine
rounds to slightly below 1.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from agentrl.estimators.builtin.bipace.kernel import (WORKSPACES, mean_clusters_native, native_kernel, scratch,
                                                      screen_available, seed_clusters_native)

DISTANCE_TOLERANCE = 1e-6
CENTROIDS = ("seed", "mean")
BLOCK = 64              # rows per matmul against the earlier seeds
CANDIDATE_CHUNK = 16    # candidates per matmul of the staircase within a block


def group_row_blocks(group: torch.Tensor, num_groups: int) -> list[torch.Tensor]:
    """Row indices of each group, in batch order."""
    order = torch.argsort(group, stable=True)
    return list(torch.split(order, torch.bincount(group, minlength=num_groups).tolist()))


def _seed_clusters(x: torch.Tensor, threshold: float, block: int, chunk: int = CANDIDATE_CHUNK) -> np.ndarray:
    """Seed row (local index) of every row of one group, by blocks of ``block`` rows.

    For each block: one matmul against the seeds found so far gives every row its most similar
    earlier seed (first maximum: the older one) and the rows left without a seed within the
    radius (the candidates). The candidates are copied to the end of the seed buffer and the
    block's rows from each candidate on get their cosines with it, ``chunk`` candidates per
    matmul (a staircase: rows before a chunk's first candidate can neither join it nor block it).
    A candidate is accepted in order unless its cosine with an earlier accepted candidate is
    within the radius (a short loop over booleans); the accepted ones stay in the seed buffer,
    and a row moves to a new seed if that one is strictly more similar than its best earlier
    seed (first maximum again). Each decision about a pair reads the one number computed for it.
    The matmuls are ``torch.mm`` on zero-copy views; the bookkeeping is numpy (on CPU a torch op
    costs several times a numpy op, and there are a dozen per block).
    """
    with WORKSPACES.take() as space:      # reused buffers: fresh ones page-fault in every thread
        return _seed_clusters_in(x, threshold, block, chunk, scratch(space, "seed_vec", tuple(x.shape), torch.float32))


def _seed_clusters_in(x: torch.Tensor, threshold: float, block: int, chunk: int, seed_t: torch.Tensor) -> np.ndarray:
    n, d = x.shape
    xs = x.numpy()
    norm = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12).numpy()
    seed_vec = seed_t.numpy()                       # seeds' rows, contiguous, in order of creation
    seed_norm = np.empty(n, dtype=xs.dtype)
    seed_row = np.empty(n, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    k = 0
    for start in range(0, n, block):
        rows, rows_t = xs[start:start + block], x[start:start + block]
        b = rows.shape[0]
        row_norm = norm[start:start + b]
        if k:
            old = torch.mm(rows_t, seed_t[:k].t()).numpy()
            old /= row_norm[:, None] * seed_norm[None, :k]
            old_arg = old.argmax(axis=1)
            old_best = old[np.arange(b), old_arg]
            owner[start:start + b] = seed_row[old_arg]
            candidates = np.flatnonzero(old_best < np.float64(threshold))
        else:
            candidates = np.arange(b)
        nc = candidates.size
        if not nc:
            continue
        first = int(candidates[0])                          # rows before it cannot join a new seed
        np.take(rows, candidates, axis=0, out=seed_vec[k:k + nc])
        cand_t = seed_t[k:k + nc]
        sims = np.empty((b - first, nc), dtype=xs.dtype)    # rows from ``first`` on x candidates
        for c in range(0, nc, chunk):
            r = int(candidates[c])
            sims[:r - first, c:c + chunk] = -np.inf
            sims[r - first:, c:c + chunk] = torch.mm(rows_t[r:], cand_t[c:c + chunk].t()).numpy()
        sims /= row_norm[first:, None] * row_norm[candidates][None, :]
        close = (sims[candidates - first] >= np.float64(threshold)).T.copy()   # close[c, j]: j within the radius of c
        blocked = np.zeros(nc, dtype=bool)
        accepted = []
        for c in range(nc):                                 # in order; blocked by an earlier seed
            if not blocked[c]:
                accepted.append(c)
                blocked |= close[c]
        m = len(accepted)
        new_local = candidates[accepted]
        if m < nc:
            seed_vec[k:k + m] = seed_vec[k + np.asarray(accepted)]
            sims = sims[:, accepted]
        seed_norm[k:k + m] = row_norm[new_local]
        seed_row[k:k + m] = new_local + start
        sims[np.arange(first, b)[:, None] <= new_local[None, :]] = -np.inf    # only later rows join
        new_arg = sims.argmax(axis=1)
        new_best = sims[np.arange(b - first), new_arg]
        moved = np.flatnonzero(new_best > old_best[first:] if k else new_best > -np.inf)
        owner[start + first + moved] = seed_row[k + new_arg[moved]]
        owner[new_local + start] = new_local + start
        k += m
    return owner


def _mean_clusters(x: torch.Tensor, threshold: float) -> torch.Tensor:
    """Cluster index (local) of every row of one group with running-mean centroids."""
    n = x.shape[0]
    sums = torch.zeros_like(x)
    centroids = torch.zeros_like(x)
    label = torch.empty(n, dtype=torch.int64)
    k = 0
    for i in range(n):
        if k:
            sims = centroids[:k] @ x[i]
            j = int(torch.argmax(sims))
            if float(sims[j]) >= threshold:
                label[i] = j
                sums[j] += x[i]
                centroids[j] = sums[j] / sums[j].norm().clamp_min(1e-12)
                continue
        label[i] = k
        sums[k] = x[i]
        centroids[k] = x[i]
        k += 1
    return label


def _map_groups(fn, items: list) -> list:
    """``[fn(i) for i in items]``, on ``torch.get_num_threads()`` threads when that is more than one.

    The groups are independent, so each worker clusters whole groups with one intra-op thread
    (set for the duration of the call, then restored): ``torch.mm`` and the large numpy ops
    release the GIL, and unlike a two-thread matmul per block nothing waits on a barrier.
    """
    threads = min(torch.get_num_threads(), len(items))
    if threads <= 1:
        return [fn(i) for i in items]
    intra = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(fn, items))
    finally:
        torch.set_num_threads(intra)


def greedy_cosine_clusters(hidden: torch.Tensor, group: torch.Tensor, num_groups: int, eps: float,
                           centroid: str = "seed", block: int = BLOCK, use_native: bool = True,
                           native_block: int | None = None, screen: bool | None = None) -> tuple[torch.Tensor, int]:
    """Cluster id (0..K-1, numbered group by group in order of creation) for every row.

    ``use_native`` runs the pass compiled when the kernel can be built (``kernel_loader``);
    ``False`` forces the numpy path (same labels). ``screen`` (compiled path only) takes the
    products in bfloat16 and settles in float32 what they cannot decide (same labels); None uses it
    where this CPU multiplies bfloat16 natively (``kernel.screen_available``). ``block`` is
    the numpy seed pass's block, ``native_block`` the compiled one's (None: chosen per path)."""
    n = hidden.shape[0]
    lib = native_kernel() if use_native else None
    screened = lib is not None and (screen_available() if screen is None else screen)
    labels = torch.empty(n, dtype=torch.int64)
    threshold = 1.0 - float(eps) - DISTANCE_TOLERANCE

    def local_labels(rows: torch.Tensor) -> torch.Tensor:
        first = int(rows[0])
        contiguous = int(rows[-1]) - first + 1 == rows.numel()
        x = hidden[first:first + rows.numel()] if contiguous else hidden[rows]   # a view when possible
        x = x.detach().to(torch.float32)
        if centroid == "seed":
            x = x.contiguous()
            owner = (seed_clusters_native(x, threshold, native_block, lib, screened)[0] if lib is not None
                     else _seed_clusters(x, threshold, block))
            return torch.from_numpy(np.unique(owner, return_inverse=True)[1].reshape(-1))
        if lib is not None:
            return mean_clusters_native(x.contiguous(), threshold, lib, screened)[0]
        return _mean_clusters(F.normalize(x, dim=1), threshold)

    groups = [rows for rows in group_row_blocks(group, num_groups) if rows.numel()]
    parallel = centroid == "seed" or lib is not None       # the numpy mean path is a Python loop
    local = _map_groups(local_labels, groups) if parallel else [local_labels(r) for r in groups]
    offset = 0
    for rows, ids in zip(groups, local):
        labels[rows] = ids + offset
        offset += int(ids.max()) + 1
    return labels, offset


# ----- eps calibration --------------------------------------------------------------------------------
@dataclasses.dataclass
class BiGPOState:
    """What BiGPO keeps across batches: the calibrated radius, frozen after the first batch.

    It is the estimator's ``State``: the trainer creates one, passes it to every call and saves
    it with the checkpoint (``as_dict``/``from_dict``).
    """

    eps: float | None = None
    calibration: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        return self.eps is not None

    def as_dict(self) -> dict:
        return {"eps": self.eps, "calibration": dict(self.calibration)}

    @classmethod
    def from_dict(cls, data: dict) -> "BiGPOState":
        return cls(eps=data.get("eps"), calibration=dict(data.get("calibration", {})))


def calibrate_eps(hidden: torch.Tensor, group: torch.Tensor, num_groups: int, grid: tuple[float, ...],
                  target_singleton_rate: float, centroid: str = "seed") -> tuple[float, dict[str, float]]:
    """Smallest eps of ``grid`` whose clustering leaves at most ``target_singleton_rate`` of the rows
    alone in their cluster (the largest grid value if none does)."""
    chosen = max(grid)
    report: dict[str, float] = {}
    for eps in sorted(grid):
        labels, num = greedy_cosine_clusters(hidden, group, num_groups, eps, centroid)
        rate = float((torch.bincount(labels, minlength=num)[labels] == 1).to(torch.float64).mean())
        report[f"singleton_rate@{eps:g}"] = rate
        if rate <= target_singleton_rate:
            chosen = eps
            break
    return float(chosen), report


__all__ = ["BiGPOState", "CENTROIDS", "calibrate_eps", "greedy_cosine_clusters", "group_row_blocks"]
