"""BiGPO's clustering passes compiled (``bigpo_block.c``), with an optional bfloat16 screen.

Seed centroids: per block of rows, one ``torch.mm`` against the seeds found before the block, then
one C call that settles the block's rows in order (their cosines with the seeds created inside the
block are 4 x 6 tiles of dot products in C). Running-mean centroids: one C call per group. See
:mod:`~agentrl.estimators.builtin.bipace.clustering` for the algorithm; the labels equal the numpy
path's and the row-by-row pass's. :mod:`~agentrl.estimators.builtin.bipace.kernel_loader` builds the
C file on first use.

**The bfloat16 screen** (seed centroids). On CPUs that multiply bfloat16 natively (AVX512-BF16 or
AMX: two to three times the float32 rate) the cosines are first taken on bfloat16 copies of the
rows. With ``u = 2^-8`` (bfloat16 unit roundoff) and the float32 norms of the original rows, the
screened cosine of a row x and a seed s differs from the float32 cosine by at most

    delta(d) = (2u + u^2)                rounding both vectors' entries (Cauchy-Schwarz)
             + (u + d 2^-24) (1 + u)^2   rounding the float32-accumulated product to bfloat16
             + 1e-4                      the float32 norms, divisions and the float32 cosine

(0.0121 at d = 3,584). The C code computes a float32 cosine for every pair the screen cannot
decide, lazily (see the header of ``bigpo_block.c``): 0.17 float32 dot products per row on the
bench batch, and the decisions are the float32 decisions. When the compiled code has AVX512-BF16
the whole group is one C call on bfloat16 tiles; otherwise the products against earlier seeds
are a bfloat16 ``torch.mm`` per block. The bound assumes products accumulate in float32 (as
VDPBF16PS does); ``screen_available`` checks torch's bfloat16 matmul once with all-positive
operands (no cancellation: a kernel accumulating in bfloat16 would miss by far more) before
enabling the screen. Groups whose row norms are not finite or fall outside [1e-15, 1e18]
(subnormal products, overflow) run unscreened. ``AGENTRL_BIGPO_BF16=0`` turns the screen off;
``=1`` turns it on without the CPU flag check (the accumulation check still runs).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import threading
from pathlib import Path

import numpy as np
import torch

from agentrl.estimators.builtin.bipace import kernel_loader

NATIVE_SOURCE = Path(__file__).with_name("bigpo_block.c")
BF16_ROUNDOFF = 2.0 ** -8
F32_ROUNDOFF = 2.0 ** -24
SCREEN_SLACK = 1e-4
SCREEN_NORM_RANGE = (1e-15, 1e18)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
EXACT_BLOCK = 64            # rows per float32 matmul against the earlier seeds


def native_kernel() -> ctypes.CDLL | None:
    """The compiled block decisions, or None (then the numpy path runs; ``kernel_loader.native_status`` says why)."""
    lib = kernel_loader.load_kernel(NATIVE_SOURCE)
    if lib is not None and not getattr(lib, "_agentrl_typed", False):
        ptr, i64, f32, f64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_double
        lib.bigpo_decide_block.argtypes = [ptr, ptr, ptr, i64, i64, i64, ptr, i64, f64, f32,
                                           ptr, ptr, ptr, ptr, ptr]
        lib.bigpo_decide_block.restype = i64
        lib.bigpo_prepare.argtypes = [ptr, i64, i64, ptr, ptr]
        lib.bigpo_prepare.restype = None
        lib.bigpo_mean_clusters.argtypes = [ptr, ptr, i64, i64, f64, f32, ptr, ptr, ptr, ptr, ptr]
        lib.bigpo_mean_clusters.restype = i64
        lib.bigpo_has_bf16_tiles.argtypes = []
        lib.bigpo_has_bf16_tiles.restype = ctypes.c_int
        lib._agentrl_typed = True
    return lib


def screen_bound(hidden_size: int) -> float:
    """Largest difference between a screened cosine and the float32 cosine (module docstring)."""
    u = BF16_ROUNDOFF
    return (2 * u + u * u) + (u + hidden_size * F32_ROUNDOFF) * (1 + u) ** 2 + SCREEN_SLACK


def bf16_products_accumulate_in_float32(hidden_size: int = 3584) -> bool:
    """Whether ``torch.mm`` on bfloat16 lands within one output rounding (plus float32 accumulation)
    of the exact product, on all-positive operands where nothing cancels."""
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(64, hidden_size, generator=gen).to(torch.bfloat16)
    b = torch.rand(96, hidden_size, generator=gen).to(torch.bfloat16)
    got = torch.mm(a, b.t()).double()
    exact = a.double() @ b.double().t()
    scale = a.double().norm(dim=1)[:, None] * b.double().norm(dim=1)[None, :]
    return bool(((got - exact).abs() / scale).max() <= BF16_ROUNDOFF + hidden_size * F32_ROUNDOFF)


@functools.cache
def screen_available() -> bool:
    """Use the bfloat16 screen by default: bfloat16 in the CPU flags and the accumulation check."""
    setting = os.environ.get("AGENTRL_BIGPO_BF16", "auto").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting not in ("1", "true", "yes", "on") and not any(flag in kernel_loader.cpu_signature().split()
                                                              for flag in BF16_CPU_FLAGS):
        return False
    return bf16_products_accumulate_in_float32()


class Workspaces:
    """Scratch buffers reused across calls, one set per concurrent caller.

    A fresh multi-megabyte buffer page-faults on first touch, and two threads faulting at once
    serialise in the kernel: on the bench batch the bfloat16 copies took 17 ms on two threads in
    fresh buffers against 5 ms in reused ones. The buffers grow to the largest group seen and are
    kept for the life of the process: per thread, for a 400-row group at d = 3,584, 3 MB for the
    screened seed pass, 6 MB for the float32 one, 17 MB for running-mean centroids.
    """

    def __init__(self) -> None:
        self._free: list[dict[str, torch.Tensor]] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def take(self):
        with self._lock:
            space = self._free.pop() if self._free else {}
        try:
            yield space
        finally:
            with self._lock:
                self._free.append(space)


WORKSPACES = Workspaces()


def scratch(space: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous ``shape`` view of the workspace buffer ``name`` (grown when too small)."""
    numel = math.prod(shape)
    buf = space.get(name)
    if buf is None or buf.dtype != dtype or buf.numel() < numel:
        buf = space[name] = torch.empty(max(numel, 1), dtype=dtype)
    return buf[:numel].view(shape)


def seed_clusters_native(x: torch.Tensor, threshold: float, block: int | None, lib: ctypes.CDLL,
                         screened: bool = False) -> tuple[np.ndarray, int]:
    """Seed row (local index) of every row of one group, and the number of exact cosines the
    screens asked for. ``x`` is a contiguous float32 (n, d) tensor. ``block`` rows per matmul
    against the earlier seeds; None picks: the whole group in one call when the screen runs on
    bfloat16 tiles in C (faster than the matmul at these shapes), else ``EXACT_BLOCK``."""
    with WORKSPACES.take() as space:
        return _seed_clusters_native(x, threshold, block, lib, screened, space)


def _seed_clusters_native(x, threshold, block, lib, screened, space) -> tuple[np.ndarray, int]:
    n, d = x.shape
    xs = x.numpy()
    if screened:                     # one pass: norms and the bfloat16 copy
        x_bf16 = scratch(space, "x_bf16", (n, d), torch.bfloat16)
        raw_norm = np.empty(n, dtype=np.float32)
        lib.bigpo_prepare(xs.ctypes.data, n, d, x_bf16.data_ptr(), raw_norm.ctypes.data)
        low, high = SCREEN_NORM_RANGE    # a finite norm in range: every entry finite, no overflow
        screened = bool(((raw_norm >= low) & (raw_norm <= high)).all())
    else:
        raw_norm = torch.linalg.vector_norm(x, dim=1).numpy()
    norm = np.maximum(raw_norm, np.float32(1e-12))
    if block is None:
        block = n if screened and lib.bigpo_has_bf16_tiles() else EXACT_BLOCK
    seed_row = np.empty(n, dtype=np.int64)
    owner = np.empty(n, dtype=np.int64)
    settled = np.zeros(1, dtype=np.int64)
    seed_vec = seed_bf16 = None      # seed copies for the matmul against earlier seeds
    if screened:
        delta = screen_bound(d)
        if block < n:
            seed_bf16 = scratch(space, "seed_bf16", (n, d), torch.bfloat16)
        rows_mm, seeds_mm = x_bf16, seed_bf16
    else:
        x_bf16, delta = None, 0.0
        if block < n:
            seed_vec = scratch(space, "seed_vec", (n, d), torch.float32)
        rows_mm, seeds_mm = x, seed_vec
    pointers = (xs.ctypes.data, x_bf16.data_ptr() if screened else None, norm.ctypes.data)
    seeds_out = (seed_vec.data_ptr() if seed_vec is not None else None,
                 seed_bf16.data_ptr() if seed_bf16 is not None else None, seed_row.ctypes.data,
                 owner.ctypes.data, settled.ctypes.data)
    k = 0
    for start in range(0, n, block):
        b = min(block, n - start)
        old = torch.mm(rows_mm[start:start + b], seeds_mm[:k].t()) if k else None
        k = lib.bigpo_decide_block(*pointers, start, b, d, old.data_ptr() if old is not None else None, k,
                                   threshold, delta, *seeds_out)
    return owner, int(settled[0])


def mean_clusters_native(x: torch.Tensor, threshold: float, lib: ctypes.CDLL,
                         screened: bool = False) -> tuple[torch.Tensor, int]:
    """Cluster index (local) of every row of one group with running-mean centroids, in C
    (``bigpo_mean_clusters``), and the number of exact cosines the screen asked for. ``x`` is a
    contiguous float32 (n, d) tensor. ``screened`` takes the tiles in bfloat16 when the compiled
    code has bfloat16 tiles (same labels)."""
    n, d = x.shape
    label = np.empty(n, dtype=np.int64)
    settled = np.zeros(1, dtype=np.int64)
    with WORKSPACES.take() as space:
        unit = torch.nn.functional.normalize(x, dim=1, out=scratch(space, "mean_unit", (n, d), torch.float32))
        sums = scratch(space, "mean_sums", (n, d), torch.float32)
        cent = scratch(space, "mean_centroids", (n, d), torch.float32)
        unit_bf16 = cent_bf16 = None
        if screened and lib.bigpo_has_bf16_tiles():
            unit_bf16 = scratch(space, "x_bf16", (n, d), torch.bfloat16)
            unit_norm = np.empty(n, dtype=np.float32)
            lib.bigpo_prepare(unit.data_ptr(), n, d, unit_bf16.data_ptr(), unit_norm.ctypes.data)
            low, high = SCREEN_NORM_RANGE    # zero rows (norm 0) or non-finite ones: unscreened
            if bool(((unit_norm >= low) & (unit_norm <= high)).all()):
                cent_bf16 = scratch(space, "mean_centroids_bf16", (n, d), torch.bfloat16)
            else:
                unit_bf16 = None
        delta = screen_bound(d) if cent_bf16 is not None else 0.0
        k = lib.bigpo_mean_clusters(unit.data_ptr(), unit_bf16.data_ptr() if unit_bf16 is not None else None, n, d,
                                    threshold, delta, sums.data_ptr(), cent.data_ptr(),
                                    cent_bf16.data_ptr() if cent_bf16 is not None else None, label.ctypes.data,
                                    settled.ctypes.data)
    if k < 0:
        raise MemoryError(f"BiGPO mean-centroid clustering could not allocate its {n}-row dot buffer")
    return torch.from_numpy(label), int(settled[0])


def describe_path() -> str:
    """Which seed pass ``greedy_cosine_clusters`` runs here by default, for benchmark reports."""
    lib = native_kernel()
    if lib is None:
        return f"numpy ({kernel_loader.native_status(NATIVE_SOURCE)})"
    if not screen_available():
        return "native, float32"
    tiles = "bfloat16 tiles in C" if lib.bigpo_has_bf16_tiles() else "bfloat16 matmul, float32 tiles in C"
    return f"native, bfloat16 screen ({tiles}) with float32 settling"


__all__ = ["NATIVE_SOURCE", "WORKSPACES", "describe_path", "mean_clusters_native", "native_kernel", "scratch",
           "screen_available", "screen_bound", "seed_clusters_native"]
