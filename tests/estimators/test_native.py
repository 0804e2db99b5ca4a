"""agentrl.estimators.builtin.bipace.kernel_loader: C kernels compiled on first use into a cache, with a
clear fallback (BiPACE's clustering kernel is the one there is)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from agentrl.estimators.builtin.bipace import kernel, kernel_loader
from agentrl.estimators.builtin.bipace.clustering import greedy_cosine_clusters
from agentrl.estimators.builtin.bipace.kernel import NATIVE_SOURCE

needs_compiler = pytest.mark.skipif(kernel_loader.compiler() is None, reason="no C compiler")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty kernel cache and no memo; the memo is dropped again afterwards."""
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "cache"))
    kernel_loader.forget_kernels()
    yield tmp_path
    kernel_loader.forget_kernels()


def clustering_case():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(8, 48, generator=gen)[torch.randint(0, 8, (90,), generator=gen)]
    rows = rows + 0.05 * torch.randn(90, 48, generator=gen)
    return rows, torch.zeros(90, dtype=torch.int64)


@needs_compiler
def test_kernel_is_built_once_into_the_cache_and_reused(fresh):
    lib = kernel_loader.load_kernel(NATIVE_SOURCE)
    assert lib is not None and kernel_loader.native_status(NATIVE_SOURCE) == "native"
    built = list((fresh / "cache" / "native").glob("bigpo_block-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    assert list((fresh / "cache" / "native").glob("*.so")) == built      # no temporary left behind
    kernel_loader.forget_kernels()
    assert kernel_loader.load_kernel(NATIVE_SOURCE) is not None
    assert built[0].stat().st_mtime_ns == mtime                           # loaded, not rebuilt


@needs_compiler
def test_a_damaged_cache_entry_is_built_again(fresh):
    """Fresh processes (a process that loaded a library keeps it whatever happens to the file)."""
    import subprocess
    import sys

    load = ("from agentrl.estimators.builtin.bipace import kernel_loader; "
            "from agentrl.estimators.builtin.bipace.kernel import NATIVE_SOURCE; "
            "kernel_loader.load_kernel(NATIVE_SOURCE); print(kernel_loader.native_status(NATIVE_SOURCE))")
    env = {**os.environ, "AGENTRL_CACHE_DIR": str(fresh / "cache")}
    first = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=120)
    assert first.stdout.strip() == "native", first.stderr
    [built] = list((fresh / "cache" / "native").glob("bigpo_block-*.so"))
    built.write_bytes(b"not a shared object")
    second = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True, timeout=120)
    assert second.stdout.strip() == "native", second.stderr
    assert built.read_bytes()[:4] == b"\x7fELF"


def test_switched_off_falls_back_with_a_warning_and_the_same_labels(fresh, monkeypatch):
    rows, group = clustering_case()
    slow, _ = greedy_cosine_clusters(rows, group, 1, 0.1, use_native=False)
    monkeypatch.setenv("AGENTRL_NATIVE", "0")
    with pytest.warns(UserWarning, match="AGENTRL_NATIVE=0"):
        assert kernel.native_kernel() is None
    labels, _ = greedy_cosine_clusters(rows, group, 1, 0.1)
    assert torch.equal(labels, slow)
    assert not (fresh / "cache").exists()


def test_a_failing_compiler_is_reported_and_nothing_is_cached(fresh, monkeypatch):
    broken = fresh / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(broken))
    with pytest.warns(UserWarning, match="cannot compile"):
        assert kernel_loader.load_kernel(NATIVE_SOURCE) is None
    assert "broken-cc: cannot compile" in kernel_loader.native_status(NATIVE_SOURCE)
    assert list((fresh / "cache" / "native").glob("*")) == []             # temporaries removed
    rows, group = clustering_case()
    labels, _ = greedy_cosine_clusters(rows, group, 1, 0.1)               # the numpy path
    assert torch.equal(labels, greedy_cosine_clusters(rows, group, 1, 0.1, use_native=False)[0])


@needs_compiler
def test_flags_the_compiler_rejects_fall_back_to_portable_ones(fresh, monkeypatch):
    """A compiler without -march=native (some non-x86 toolchains) still builds the kernel with -O3."""
    real = kernel_loader.compiler()
    picky = fresh / "picky-cc"
    picky.write_text(f'#!/bin/sh\ncase "$*" in *-march=native*) echo "unknown flag" >&2; exit 1;; esac\n'
                     f'exec {real} "$@"\n')
    picky.chmod(picky.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(picky))
    lib = kernel.native_kernel()
    assert lib is not None
    assert lib.bigpo_has_bf16_tiles() == 0             # portable build: the in-block screen is float32
    rows, group = clustering_case()
    expected, _ = greedy_cosine_clusters(rows, group, 1, 0.1, use_native=False)
    for screen in (False, True):                       # screened: bfloat16 matmul + float32 tiles
        for block in (None, 5):
            labels, _ = greedy_cosine_clusters(rows, group, 1, 0.1, native_block=block, screen=screen)
            assert torch.equal(labels, expected)


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE_DIR", str(tmp_path / "x"))
    assert kernel_loader.cache_dir() == tmp_path / "x" / "native"
    monkeypatch.delenv("AGENTRL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_loader.cache_dir() == tmp_path / "xdg" / "agentrl" / "native"
    assert Path(os.fspath(NATIVE_SOURCE)).is_file()                       # shipped next to the module


def test_bfloat16_screen_switch(monkeypatch):
    assert kernel.bf16_products_accumulate_in_float32(512)    # torch's CPU matmul, any CPU
    try:
        monkeypatch.setenv("AGENTRL_BIGPO_BF16", "0")
        kernel.screen_available.cache_clear()
        assert kernel.screen_available() is False
        monkeypatch.setenv("AGENTRL_BIGPO_BF16", "1")
        kernel.screen_available.cache_clear()
        assert kernel.screen_available() is True
    finally:
        kernel.screen_available.cache_clear()


@needs_compiler
def test_prepare_pass_matches_torch_rounding_and_norms():
    """The one-pass bfloat16 copy is torch's round-to-nearest-even; the norms are float32 norms."""
    import numpy as np

    lib = kernel.native_kernel()
    x = torch.randn(50, 3590, generator=torch.Generator().manual_seed(1)) * torch.logspace(-10, 10, 50)[:, None]
    x_bf16 = torch.empty_like(x, dtype=torch.bfloat16)
    norms = np.empty(50, dtype=np.float32)
    lib.bigpo_prepare(x.numpy().ctypes.data, 50, 3590, x_bf16.data_ptr(), norms.ctypes.data)
    assert torch.equal(x_bf16, x.to(torch.bfloat16))
    exact = x.double().norm(dim=1)
    assert float(((torch.from_numpy(norms).double() - exact).abs() / exact).max()) < 1e-6


@needs_compiler
@pytest.mark.parametrize("flags", kernel_loader.FLAG_SETS)
def test_kernel_compiles_without_warnings(flags, tmp_path):
    """Warnings are errors here (a missing header once left malloc implicitly declared). The
    portable flags must compile cleanly; a compiler may reject ``-march=native`` itself (the
    loader then falls back to the portable flags), but nothing else."""
    import subprocess

    cc = kernel_loader.compiler()
    proc = subprocess.run([cc, *flags, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-psabi", "-fPIC", "-c",
                           "-o", str(tmp_path / "kernel.o"), str(NATIVE_SOURCE)], capture_output=True, text=True)
    rejected_march = proc.returncode != 0 and "-march=native" in flags and "march" in proc.stderr
    assert proc.returncode == 0 or rejected_march, proc.stderr
