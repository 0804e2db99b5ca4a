"""Small C kernels compiled on first use and loaded with ctypes.

A kernel is one C file shipped inside the package. ``load_kernel(path)`` compiles it with the
system C compiler (``$CC``, else ``cc`` or ``gcc``) into
``$AGENTRL_CACHE_DIR/native`` (default ``~/.cache/agentrl/native``) under a name that hashes the
source, the flags, the compiler and the CPU's feature flags, so a cache shared by machines with
different CPUs never loads code built for another one; the file is written to a temporary name
and renamed, so concurrent first uses (Ray workers, learner ranks) are safe, and a cached file
that does not load (damaged) is built again. It returns the
``ctypes.CDLL`` or ``None`` when no compiler works, or when ``AGENTRL_NATIVE=0``; callers then use
their pure-Python path, which gives the same results, and ``native_status()`` says why. Calls
through ctypes release the GIL.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

FLAG_SETS = (("-O3", "-march=native"), ("-O3",))     # the first that compiles is used
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_why_not: dict[str, str] = {}


def cache_dir() -> Path:
    root = os.environ.get("AGENTRL_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl"
    return Path(root).expanduser() / "native"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cpu_signature() -> str:
    """The CPU's model and feature flags (``-march=native`` code runs only where these match)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
        lines = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(lines))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _build(source: Path, cc: str) -> tuple[Path | None, str]:
    text = source.read_bytes()
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join([text, " ".join(flags).encode(), cc.encode(),
                                         cpu_signature().encode()])).hexdigest()[:16]
        target = cache_dir() / f"{source.stem}-{key}.so"
        if target.exists():
            return target, ""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        cmd = [cc, *flags, "-std=c11", "-fPIC", "-shared", "-o", tmp, str(source)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            proc = None
            errors.append(f"{' '.join(cmd)}: {exc}")
        if proc is not None and proc.returncode == 0:
            os.replace(tmp, target)
            return target, ""
        if proc is not None:
            errors.append(f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}")
        Path(tmp).unlink(missing_ok=True)
    return None, "; ".join(errors)


def load_kernel(source: Path) -> ctypes.CDLL | None:
    """The compiled ``source`` (a C file), or None when native kernels are off or cannot be built."""
    key = str(source)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        library, reason = None, ""
        if os.environ.get("AGENTRL_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
            reason = "AGENTRL_NATIVE=0"
        elif (cc := compiler()) is None:
            reason = "no C compiler found (set $CC, or install gcc)"
        else:
            try:
                path, reason = _build(source, cc)
                if path is not None:
                    try:
                        library = ctypes.CDLL(str(path))
                    except OSError:                  # a damaged cache entry: build it again, once
                        path.unlink(missing_ok=True)
                        path, reason = _build(source, cc)
                        library = ctypes.CDLL(str(path)) if path is not None else None
            except OSError as exc:
                reason = f"cannot build or load {source.name} into {cache_dir()}: {exc}"
        if library is None:
            warnings.warn(f"agentrl: the native kernel {source.name} is not used ({reason}); "
                          "falling back to the slower pure-Python path with the same results", stacklevel=3)
        _loaded[key] = library
        _why_not[key] = reason
        return library


def native_status(source: Path) -> str:
    """'native' when ``source`` is loaded, else the reason it is not (after ``load_kernel``)."""
    key = str(source)
    return "native" if _loaded.get(key) is not None else _why_not.get(key, "not loaded yet")


def forget_kernels() -> None:
    """Drop the in-process memo (tests switch ``AGENTRL_NATIVE`` or ``CC`` and load again)."""
    with _lock:
        _loaded.clear()
        _why_not.clear()


__all__ = ["cache_dir", "compiler", "forget_kernels", "load_kernel", "native_status"]
