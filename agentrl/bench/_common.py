"""Helpers shared by the benchmark targets: the machine's CPU name and ``--json`` output."""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any, Callable


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def print_json_report(measure: Callable[[], dict[str, Any]]) -> int:
    """Run ``measure`` with stdout sent to stderr (libraries print notices on stdout: DeepSpeed's
    accelerator line), then print its report as the only JSON object on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        report = measure()
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    print(json.dumps(report, indent=2))
    return 0
