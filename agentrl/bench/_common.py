"""Helpers shared by the benchmark targets: their flags, the machine's CPU name and ``--json`` output."""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import agentrl
from agentrl.errors import UsageError


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


def run_report(args: argparse.Namespace, measure: Callable[[argparse.Namespace], dict[str, Any]],
               show: Callable[[dict[str, Any], dict[str, Any]], None]) -> int:
    """A target's ``run``: ``measure(args)`` gives ``{"meta": ..., "results": ...}``, printed as one
    JSON object with ``--json``, else as text by ``show(meta, results)``."""
    if args.json:
        return print_json_report(lambda: measure(args))
    report = measure(args)
    show(report["meta"], report["results"])
    return 0


def target_name(target: ModuleType) -> str:
    """The target's name on the command line: its module's name, ``_`` written ``-`` (``webshop_steps``
    is ``agentrl bench webshop-steps``)."""
    return target.__name__.rsplit(".", 1)[-1].replace("_", "-")


def add_target_arguments(parser: argparse.ArgumentParser, target: ModuleType) -> None:
    """A target's flags and the ``--json`` every target has (``agentrl bench TARGET``)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object with the results")
    target.add_arguments(parser)


def parse_target_args(target: ModuleType, argv: Sequence[str] = ()) -> argparse.Namespace:
    """``argv`` parsed as ``agentrl bench <target>`` would (for calling a target from Python)."""
    parser = argparse.ArgumentParser(prog=f"agentrl bench {target_name(target)}")
    add_target_arguments(parser, target)
    return parser.parse_args(list(argv))


def extract_revision(revision: str, into: Path, target: str) -> Path:
    """agentrl's package at git ``revision`` (``git archive``) under ``into``; the directory to put on
    PYTHONPATH (``agentrl bench <target> --baseline``). A one-line error when agentrl is not a git
    checkout or the revision is unknown."""
    repo = Path(agentrl.__file__).resolve().parents[1]
    if not (repo / ".git").exists():
        raise UsageError(f"bench {target} takes its baseline (--baseline {revision}) from git, but {repo} is not a "
                         "git checkout of agentrl: run it from a clone")
    archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", revision, "agentrl"],
                             capture_output=True)
    if archive.returncode != 0:
        raise UsageError(f"--baseline {revision}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into
