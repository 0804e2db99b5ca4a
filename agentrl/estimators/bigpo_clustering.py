"""BiGPO: greedy single-pass cosine clustering of step hidden states, and eps calibration.

Within each group, rows are visited in batch order; a row joins the cluster whose centroid is
nearest (largest cosine similarity ``x.y / (|x| |y|)``) if the cosine distance
``1 - cos`` is at most ``eps``, otherwise it starts a new cluster. Ties go to the older cluster.

Centroids (the sources do not say which; both are offered):

* ``"seed"`` (default): a cluster's centroid is its first member, as in the reference code's
  similarity grouping. Every member then lies within eps of one real state, the radius keeps its
  meaning as clusters grow, and the pass vectorises exactly: blocks of rows are compared with the
  seeds found so far in one matmul, and only the acceptance of the candidates (a few per block)
  is resolved in Python. The work is each row's cosine with every earlier seed of its group
  (rows x clusters, not rows^2). The matmuls are a bfloat16 first pass (twice the float32 rate
  on CPUs with AVX512-BF16) with a proven error bound; every decision the bound leaves open (a
  cosine near the radius, two seeds nearly as close) is re-checked with float64 cosines, so the
  clusters are exactly those of the row-by-row greedy pass on float64 cosines.
* ``"mean"``: the l2-normalised running mean of the members. Each row depends on every earlier
  join, so this loops over rows (with a vectorised distance to all centroids).

A tolerance of 1e-6 is added to eps, so that eps = 0 groups identical vectors whose cosine
rounds to slightly below 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

DISTANCE_TOLERANCE = 1e-6
CENTROIDS = ("seed", "mean")


def group_row_blocks(group: torch.Tensor, num_groups: int) -> list[torch.Tensor]:
    """Row indices of each group, in batch order."""
    order = torch.argsort(group, stable=True)
    return list(torch.split(order, torch.bincount(group, minlength=num_groups).tolist()))


BF16_UNIT = 2.0 ** -8          # unit roundoff of bfloat16 (8 significant bits)


def first_pass_error(dim: int, bfloat16: bool = True) -> tuple[float, float]:
    """``(c0, c1)`` with ``|first-pass cosine - exact cosine| <= c0 + c1 * |first-pass cosine|``.

    The exact cosine is the float64 one (see :class:`_Group`). The first pass divides a matmul
    of the rows by their float32 norms. In bfloat16 it rounds every element (each moves by at
    most u = 2^-8 of itself, so a dot product by at most (2u + u^2) |x| |y|), sums in float32
    and rounds the sum to bfloat16 (at most u / (1 - u) of the result); in float32 only the sum
    is rounded. A float32 sum of d products is within g = d 2^-24 of |x| |y| of the true one, and
    a float32 norm within g of |x|, which moves a cosine by at most about 2g. 1e-6 covers the
    divisions.
    """
    g = dim * 2.0 ** -24
    u = BF16_UNIT if bfloat16 else 0.0
    c0 = (2 * u + u * u + g * (1 + u) ** 2) / (1 - g) ** 2 + 2.01 * g + 1e-6
    return c0, u / (1 - u)


class _Group:
    """One group's rows: norms, the low-precision copy for first passes, exact re-checks.

    Exact cosines are float64 (products of float32 numbers are exact in float64 and the sum is
    within ~1e-13), so they do not depend on the order of a summation: every way of computing
    the clustering (first pass or not, any block size) reaches the same decisions, ties
    included (first maximum: the older seed).
    """

    def __init__(self, x: torch.Tensor, first_pass: bool):
        self.xs = x.numpy()
        self.norm = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12).numpy()
        finite = bool(np.isfinite(self.norm).all())
        bfloat16 = first_pass and finite
        self.low = x.to(torch.bfloat16) if bfloat16 else x
        self.c0, self.c1 = first_pass_error(x.shape[1], bfloat16) if finite else (np.inf, 0.0)
        self._wide: dict[int, np.ndarray] = {}
        self._wide_norm: dict[int, float] = {}

    def rows(self, index: np.ndarray) -> torch.Tensor:
        """The ``low`` copies of the rows ``index`` (indexing with a tensor: a numpy index is slow)."""
        return self.low.index_select(0, torch.from_numpy(index))

    def first_pass(self, i0: int, i1: int, cols: torch.Tensor, col_rows: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """float64 matrix of the first-pass cosines of rows ``i0:i1`` with the rows ``col_rows``
        (their ``low`` copies ``cols``), and the bound on each one's distance from the exact one."""
        sims = torch.mm(self.low[i0:i1], cols.t()).to(torch.float64).numpy()
        sims /= self.norm[i0:i1, None] * self.norm[col_rows][None, :]
        return sims, self.c0 + self.c1 * np.abs(sims)

    def exact(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """float64 cosines of the pairs ``(rows[p], cols[p])`` (rows widened once, then cached)."""
        wide, wide_norm = self._wide, self._wide_norm
        for i in set(rows.tolist()).union(cols.tolist()).difference(wide):
            v = self.xs[i].astype(np.float64)
            wide[i], wide_norm[i] = v, max(float(np.sqrt(np.dot(v, v))), 1e-12)
        dots = [np.dot(wide[i], wide[j]) / (wide_norm[i] * wide_norm[j]) for i, j in zip(rows.tolist(), cols.tolist())]
        return np.array(dots, dtype=np.float64)


def _resolve_best(sims: np.ndarray, err: np.ndarray, rows: np.ndarray, cols: np.ndarray, grp: _Group,
                  threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether its exact maximum cosine is within the radius, and the column of that
    maximum (first maximum: the older seed).

    ``sims[r, c]`` is the first-pass cosine of group row ``rows[r]`` with group row ``cols[c]``,
    within ``err[r, c]`` of the exact one (-inf and 0 where a column does not count). The
    contenders of a row are the columns whose upper bound reaches both the radius and the
    largest lower bound: every other column is certainly below the exact maximum. No contender:
    nothing within the radius. One contender whose lower bound is within the radius: decided.
    Otherwise the contenders are re-checked exactly (written back into ``sims``, ``err`` 0).
    """
    low = sims - err
    bar = np.maximum(low.max(axis=1), threshold)
    contender = sims + err >= bar[:, None]
    count = contender.sum(axis=1)
    best = contender.argmax(axis=1)
    hit = (count == 1) & (low[np.arange(low.shape[0]), best] >= threshold)
    unsure = np.flatnonzero((count > 0) & ~hit)
    if unsure.size:
        r, c = np.nonzero(contender[unsure])
        values = grp.exact(rows[unsure[r]], cols[c])
        sims[unsure[r], c] = values
        err[unsure[r], c] = 0.0
        exact = np.full((unsure.size, sims.shape[1]), -np.inf, dtype=sims.dtype)
        exact[r, c] = values
        best[unsure] = exact.argmax(axis=1)
        hit[unsure] = exact[np.arange(unsure.size), best[unsure]] >= threshold
    return hit, best


def _resolve_close(sims: np.ndarray, err: np.ndarray, pick: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                   grp: _Group, threshold: float) -> np.ndarray:
    """``exact cosine >= threshold`` for the rows ``pick`` of ``sims`` (layout as in
    :func:`_resolve_best`), re-checking the entries whose bounds straddle the radius."""
    sub, bound = sims[pick], err[pick]
    close = sub - bound >= threshold
    r, c = np.nonzero((sub + bound >= threshold) & ~close)
    if r.size:
        values = grp.exact(rows[pick[r]], cols[c])
        close[r, c] = values >= threshold
        sims[pick[r], c] = values
        err[pick[r], c] = 0.0
    return close


def _seed_clusters(x: torch.Tensor, threshold: float, block: int, first_pass: bool = True) -> np.ndarray:
    """Seed row (local index) of every row of one group, by blocks of ``block`` rows.

    For each block: the rows' cosines with the seeds found so far (one matmul); the rows left
    without a seed within the radius (the candidates) are compared with the block (one more
    matmul) and accepted in order unless an earlier accepted candidate is within the radius (a
    short loop over booleans); every other row then takes the most similar seed before it
    (first maximum: the older seed). The bookkeeping is numpy (a torch op costs several times a
    numpy op on CPU, and there are a dozen per block).

    The matmuls run in bfloat16 (``first_pass``) or float32; every decision that their error
    bound (:func:`first_pass_error`) leaves open is re-checked with float64 cosines, so both give
    the same clusters: a rounded cosine only decides where it cannot be on the other side of the
    radius or of another seed's cosine.
    """
    n = x.shape[0]
    grp = _Group(x, first_pass)
    seeds = torch.empty_like(grp.low)                  # seed rows, contiguous, in order of creation
    seed_row = np.empty(n, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    k = 0
    for start in range(0, n, block):
        stop = min(start + block, n)
        b = stop - start
        block_rows = np.arange(start, stop)
        sims, err = grp.first_pass(start, stop, seeds[:k], seed_row[:k])
        if k:
            hit, _ = _resolve_best(sims, err, block_rows, seed_row[:k], grp, threshold)
            candidates = np.flatnonzero(~hit)
        else:
            candidates = np.arange(b)
        new_local = candidates
        if candidates.size:
            first = int(candidates[0])                      # rows before it cannot join a new seed
            cand_rows = candidates + start
            cand_sims, cand_err = grp.first_pass(start + first, stop, grp.rows(cand_rows), cand_rows)
            close = _resolve_close(cand_sims, cand_err, candidates - first, block_rows[first:], cand_rows, grp,
                                   threshold)
            blocked = np.zeros(candidates.size, dtype=bool)
            accepted = []
            for c in range(candidates.size):                # in order; blocked by an earlier seed
                if not blocked[c]:
                    accepted.append(c)
                    blocked |= close[c]
            new_local = candidates[accepted]
            joinable = np.full((b, new_local.size), -np.inf, dtype=sims.dtype)
            joinable_err = np.zeros((b, new_local.size), dtype=sims.dtype)
            joinable[first:], joinable_err[first:] = cand_sims[:, accepted], cand_err[:, accepted]
            later = np.arange(b)[:, None] > new_local[None, :]           # only later rows join
            joinable[~later] = -np.inf
            joinable_err[~later] = 0.0
            sims, err = np.concatenate([sims, joinable], axis=1), np.concatenate([err, joinable_err], axis=1)
            m = new_local.size
            seeds[k:k + m] = grp.rows(new_local + start)
            seed_row[k:k + m] = new_local + start
            k += m
        joining = np.ones(b, dtype=bool)
        joining[new_local] = False
        rows = np.flatnonzero(joining)
        if rows.size:
            _, best = _resolve_best(sims[rows], err[rows], rows + start, seed_row[:k], grp, threshold)
            owner[rows + start] = seed_row[best]
        owner[new_local + start] = new_local + start
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


def greedy_cosine_clusters(hidden: torch.Tensor, group: torch.Tensor, num_groups: int, eps: float,
                           centroid: str = "seed", block: int = 128, first_pass: bool = True
                           ) -> tuple[torch.Tensor, int]:
    """Cluster id (0..K-1, numbered group by group in order of creation) for every row.

    ``first_pass=False`` runs the matmuls in float32 instead of bfloat16 (same clusters, slower).
    """
    n = hidden.shape[0]
    labels = torch.empty(n, dtype=torch.int64)
    threshold = 1.0 - float(eps) - DISTANCE_TOLERANCE
    offset = 0
    for rows in group_row_blocks(group, num_groups):
        if rows.numel() == 0:
            continue
        first = int(rows[0])
        contiguous = int(rows[-1]) - first + 1 == rows.numel()
        x = hidden[first:first + rows.numel()] if contiguous else hidden[rows]   # a view when possible
        x = x.detach().to(torch.float32)
        if centroid == "seed":
            owner = _seed_clusters(x.contiguous(), threshold, block, first_pass)
            is_seed = owner == np.arange(owner.size)
            local = torch.from_numpy((np.cumsum(is_seed) - 1)[owner])   # seeds numbered in row order
        else:
            local = _mean_clusters(F.normalize(x, dim=1), threshold)
        labels[rows] = local + offset
        offset += int(local.max()) + 1
    return labels, offset


# ----- eps calibration --------------------------------------------------------------------------------
@dataclasses.dataclass
class BiGPOState:
    """What BiGPO keeps across batches: the calibrated radius, frozen after the first batch.

    The trainer creates one, passes it to every ``compute_advantages("bipace", ..., state=state)``
    call and saves it with the checkpoint (``as_dict``/``from_dict``).
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
