"""BiGPO: greedy single-pass cosine clustering of step hidden states, and eps calibration.

Within each group, rows are visited in batch order; a row joins the cluster whose centroid is
nearest (largest cosine similarity ``x.y / (|x| |y|)``) if the cosine distance
``1 - cos`` is at most ``eps``, otherwise it starts a new cluster. Ties go to the older cluster.

Centroids (the sources do not say which; both are offered):

* ``"seed"`` (default): a cluster's centroid is its first member, as in the reference code's
  similarity grouping. Every member then lies within eps of one real state, the radius keeps its
  meaning as clusters grow, and the pass vectorises exactly: blocks of rows are compared with the
  seeds found so far in one float32 matmul, and only the acceptance of the candidates (a few
  per block) is resolved in Python. The result is identical to the row-by-row greedy pass; the
  work is each row's cosine with every earlier seed of its group (rows x clusters, not rows^2).
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


def _seed_clusters(x: torch.Tensor, threshold: float, block: int) -> np.ndarray:
    """Seed row (local index) of every row of one group, by blocks of ``block`` rows.

    For each block: one matmul against the seeds found so far; the rows left without a seed
    within the radius (the candidates) get one matmul against the block; the candidates are
    accepted in order unless an earlier accepted candidate is within the radius (a short loop
    over booleans); every row then takes the most similar seed before it (first maximum: the
    older seed). Each similarity is computed once, so every decision reads the same number.
    The matmuls are ``torch.mm`` on zero-copy views; the bookkeeping is numpy (on CPU a torch op
    costs several times a numpy op, and there are a dozen per block).
    """
    n, d = x.shape
    xs = x.numpy()
    norm = torch.linalg.vector_norm(x, dim=1).clamp_min(1e-12).numpy()
    seed_vec = np.empty((n, d), dtype=xs.dtype)     # seeds' rows, contiguous, in order of creation
    seed_t = torch.from_numpy(seed_vec)
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
            candidates = np.flatnonzero(old.max(axis=1) < threshold)
        else:
            old = None
            candidates = np.arange(b)
        new_local = candidates
        if candidates.size:
            first = int(candidates[0])                      # rows before it cannot join a new seed
            cand_sims = torch.mm(rows_t[first:], torch.from_numpy(rows[candidates]).t()).numpy()
            cand_sims /= row_norm[first:, None] * row_norm[candidates][None, :]
            close = cand_sims[candidates - first] >= threshold
            blocked = np.zeros(candidates.size, dtype=bool)
            accepted = []
            for c in range(candidates.size):                # in order; blocked by an earlier seed
                if not blocked[c]:
                    accepted.append(c)
                    blocked |= close[c]
            new_local = candidates[accepted]
            new = np.full((b, new_local.size), -np.inf, dtype=xs.dtype)
            joinable = cand_sims[:, accepted]
            joinable[np.arange(first, b)[:, None] <= new_local[None, :]] = -np.inf   # only later rows join
            new[first:] = joinable
            old = new if old is None else np.concatenate([old, new], axis=1)
            m = new_local.size
            seed_vec[k:k + m] = rows[new_local]
            seed_norm[k:k + m] = row_norm[new_local]
            seed_row[k:k + m] = new_local + start
            k += m
        owner[start:start + b] = seed_row[old.argmax(axis=1)]   # first maximum: the older seed
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
                           centroid: str = "seed", block: int = 64) -> tuple[torch.Tensor, int]:
    """Cluster id (0..K-1, numbered group by group in order of creation) for every row."""
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
            local = torch.from_numpy(np.unique(_seed_clusters(x.contiguous(), threshold, block),
                                               return_inverse=True)[1].reshape(-1))
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
