"""BiGPO's seed-centroid pass for bfloat16 hidden states: bf16 products, exact decisions.

A bf16 model (every GPU recipe) hands the learner's hidden states over in bf16. Upcasting them
to float32 for the clustering would copy the whole ``[N, d]`` matrix and run float32 products;
on CPUs with bf16 dot-product instructions a bf16 product runs 2-2.5x faster. This pass gives the
labels of :func:`bigpo_clustering._seed_clusters` on the upcast states (float32 cosines), while
computing the products in bf16:

* Every cosine comes first from a bf16 matmul: the products of bf16 inputs are exact and summed
  in float32; the result is rounded to bf16, a relative error of at most 2^-8. So the true
  cosine lies within ``err = 2^-8 |c| / (1 - 2^-8) + d 2^-24 + 1e-6`` of the estimate (rounding,
  float32 summation over d terms, norms). :func:`bf16_products_are_bounded` checks this bound on
  the running machine once; if a kernel summed in bf16 instead, the float32 pass is used.
* A decision the intervals settle (a row has no seed within the radius; one seed is the only one
  that can be nearest and is surely within it; a new seed is surely nearer, or surely not, than
  the old one) is taken from them. Every other decision is settled by computing the cosines of
  the pairs involved in float32 (a few dot products per undecided row), and taking the same
  first-maximum and strict-improvement rules as the float32 pass.

The work is the float32 pass's (each row against every earlier seed of its group, blocks of
``BLOCK`` rows, the staircase of candidates), with bf16 products and a little interval
bookkeeping; the labels are those of the float32 pass up to float32 rounding of pairs within
~1e-6 of the radius (as the float32 pass relates to a row-by-row loop).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

REL_ERR = 2.0 ** -8 / (1 - 2.0 ** -8)   # bf16 rounding of a product's output, relative
NORM_ERR = 1e-6                        # float32 norms and scaling, in cosine units


def cosine_error(approx: np.ndarray, dim: int) -> np.ndarray:
    """Bound on |true cosine - bf16-product estimate| for each estimate."""
    return np.abs(approx) * REL_ERR + (dim * 2.0 ** -24 + NORM_ERR)


@functools.lru_cache(maxsize=None)
def bf16_products_are_bounded(dim: int = 3584, rows: int = 64, cols: int = 96, seed: int = 0) -> bool:
    """Whether this machine's bf16 ``torch.mm`` stays within :func:`cosine_error` of float32
    products (checked once per width on random unit vectors with a shared component)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(1, dim, generator=g)
    a = (common + torch.randn(rows, dim, generator=g)).to(torch.bfloat16)
    b = (common + 0.5 * torch.randn(cols, dim, generator=g)).to(torch.bfloat16)
    inv_a = (1.0 / torch.linalg.vector_norm(a.float(), dim=1)).numpy()
    inv_b = (1.0 / torch.linalg.vector_norm(b.float(), dim=1)).numpy()
    for width in (dim, 64):          # the block products and the narrow staircase products
        approx = torch.mm(a, b[:width].t()).float().numpy() * inv_a[:, None] * inv_b[None, :width]
        exact = torch.mm(a.double(), b[:width].double().t()).numpy() * inv_a[:, None] * inv_b[None, :width]
        if not (np.abs(approx - exact) <= cosine_error(approx, dim)).all():
            return False
    return True


def _pair_cosines(x: torch.Tensor, inv: np.ndarray, rows: np.ndarray, seeds_x: torch.Tensor,
                  seeds_inv: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """float32 cosines of the pairs (x[rows[i]], seeds_x[cols[i]])."""
    if rows.size == 0:
        return np.zeros(0, dtype=np.float32)
    a = x[torch.from_numpy(rows)].float()
    b = seeds_x[torch.from_numpy(cols)].float()
    return (a * b).sum(1).numpy() * inv[rows] * seeds_inv[cols]


def _first_max(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    arg = values.argmax(axis=1)
    return arg, values[np.arange(values.shape[0]), arg]


def seed_clusters_bf16(x: torch.Tensor, threshold: float, block: int, chunk: int) -> np.ndarray:
    """Seed row (local index) of every row of one group; ``x`` is a contiguous bf16 ``[n, d]``."""
    n, d = x.shape
    inv = (1.0 / torch.linalg.vector_norm(x, dim=1, dtype=torch.float32).clamp_min(1e-12)).numpy()
    seed_x = torch.empty((n, d), dtype=x.dtype)          # seeds' rows, in order of creation
    seed_inv = np.empty(n, dtype=np.float32)
    seed_row = np.empty(n, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    k = 0
    for start in range(0, n, block):
        rows_x = x[start:start + block]
        b = rows_x.shape[0]
        rinv = inv[start:start + b]
        # lo/hi bound each row's cosine with its nearest earlier seed (-inf: none within the radius)
        old_lo = np.full(b, -np.inf)
        old_hi = np.full(b, -np.inf)
        old_seed = np.zeros(b, dtype=np.int64)           # position in the seed buffer
        if k:
            est = torch.mm(rows_x, seed_x[:k].t()).float().numpy()
            est *= rinv[:, None]
            est *= seed_inv[None, :k]
            err = cosine_error(est, d)
            lo, hi = est - err, est + err
            best_lo = lo.max(axis=1)
            maybe = hi.max(axis=1) >= threshold          # some seed may lie within the radius
            contender = (hi >= np.maximum(best_lo, threshold)[:, None]) & maybe[:, None]
            count = contender.sum(axis=1)
            only = contender.argmax(axis=1)
            ar = np.arange(b)
            sure = (count == 1) & (lo[ar, only] >= threshold)
            old_seed[sure] = only[sure]
            old_lo[sure], old_hi[sure] = lo[ar, only][sure], hi[ar, only][sure]
            unsure = maybe & ~sure
            if unsure.any():
                r, c = np.nonzero(contender & unsure[:, None])
                exact = np.full((b, k), -np.inf, dtype=np.float64)
                exact[r, c] = _pair_cosines(rows_x, rinv, r, seed_x, seed_inv, c)
                arg, best = _first_max(exact[unsure])
                within = best >= threshold
                idx = np.flatnonzero(unsure)[within]
                old_seed[idx] = arg[within]
                old_lo[idx] = old_hi[idx] = best[within]
            has_old = old_hi > -np.inf
            owner[start:start + b][has_old] = seed_row[old_seed[has_old]]
            candidates = np.flatnonzero(~has_old)
        else:
            candidates = np.arange(b)
        nc = candidates.size
        if not nc:
            continue
        first = int(candidates[0])
        cand_x = rows_x[torch.from_numpy(candidates)]
        cand_inv = rinv[candidates]
        est = np.full((b - first, nc), -np.inf, dtype=np.float32)     # rows from ``first`` on x candidates
        for c in range(0, nc, chunk):
            r = int(candidates[c])
            est[r - first:, c:c + chunk] = torch.mm(rows_x[r:], cand_x[c:c + chunk].t()).float().numpy()
        est *= rinv[first:, None]
        est *= cand_inv[None, :]
        err = cosine_error(np.where(np.isfinite(est), est, 0.0), d)
        lo, hi = est - err, est + err                    # -inf above the staircase stays -inf
        # acceptance: candidate j is blocked by an earlier accepted candidate c within the radius
        sub_lo, sub_hi = lo[candidates - first], hi[candidates - first]     # [j, c]
        close = sub_lo >= threshold
        unsure = (sub_hi >= threshold) & ~close
        if unsure.any():
            j, c = np.nonzero(unsure)
            close[j, c] = _pair_cosines(rows_x, rinv, candidates[j], cand_x, cand_inv, c) >= threshold
        close = close.T.copy()                           # close[c, j]: j within the radius of c
        blocked = np.zeros(nc, dtype=bool)
        accepted = []
        for c in range(nc):
            if not blocked[c]:
                accepted.append(c)
                blocked |= close[c]
        acc = np.asarray(accepted)
        new_local = candidates[acc]
        m = acc.size
        seed_x[k:k + m] = cand_x[torch.from_numpy(acc)]
        seed_inv[k:k + m] = rinv[new_local]
        seed_row[k:k + m] = new_local + start
        # rows after an accepted candidate may join it if it is strictly nearer than their old seed
        later = np.arange(first, b)[:, None] > new_local[None, :]
        lo, hi = np.where(later, lo[:, acc], -np.inf), np.where(later, hi[:, acc], -np.inf)
        best_lo, best_hi = lo.max(axis=1), hi.max(axis=1)
        o_lo, o_hi = old_lo[first:], old_hi[first:]
        moved = best_lo > o_hi                           # surely nearer
        unsure = ~moved & (best_hi > o_lo)               # neither surely nearer nor surely not
        if unsure.any():                                 # settle the old seed's cosine exactly
            idx = np.flatnonzero(unsure & (o_lo < o_hi))
            if idx.size:
                exact = _pair_cosines(rows_x, rinv, idx + first, seed_x, seed_inv, old_seed[idx + first])
                o_lo[idx] = o_hi[idx] = exact
        contender = (hi >= np.maximum(best_lo, o_lo)[:, None]) & (hi > -np.inf) & (moved | unsure)[:, None]
        target = contender.argmax(axis=1)
        several = (contender.sum(axis=1) > 1) | (unsure & contender.any(axis=1))
        if several.any():                                # exact cosines of the contenders
            r, c = np.nonzero(contender & several[:, None])
            exact = np.full(contender.shape, -np.inf, dtype=np.float64)
            exact[r, c] = _pair_cosines(rows_x, rinv, r + first, cand_x, cand_inv, acc[c])
            arg, best = _first_max(exact[several])
            target[several] = arg
            moved[several] = best > o_hi[several]
        rows_moved = np.flatnonzero(moved)
        owner[start + first + rows_moved] = seed_row[k + target[rows_moved]]
        owner[new_local + start] = new_local + start
        k += m
    return owner


__all__ = ["bf16_products_are_bounded", "cosine_error", "seed_clusters_bf16"]
