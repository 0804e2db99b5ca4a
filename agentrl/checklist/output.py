"""What the checklist leaves in OUT, and nothing else: ``checklist.json`` and ``logs.tar.gz``.

The GPU test machine returns at most 8 files from a command's output folder, 16 MiB each, none deeper
than ``OUT/a/b/file`` (anything deeper is dropped without a word). So every stage's stdout and stderr,
the probes' own result files, the smoke's metrics and Ray's logs are written into a staging folder
outside OUT (``<work>/checklist``), and after every stage both files are rewritten whole, each into a
temporary name and then renamed over the old one: a command killed at any moment leaves the JSON and
the tarball of the last stage that ended (at most one half-written ``*.tmp`` beside them).

Ray's logs explain what the driver never hears (an actor's traceback goes to ``*.err`` when
``log_to_driver=False``; a raylet's or GCS's death to ``raylet.out`` and ``gcs_server.out``): the
runner gives its stages a Ray temp folder of their own, and after each stage the logs of the Ray
sessions it started (:data:`RAY_LOG_NAMES` and every non-empty ``*.err``) join the tarball. Standard
library only.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

from agentrl.errors import UsageError

RETURNED = ("checklist.json", "logs.tar.gz")
MAX_FILES = 8                 # what the device machine returns from OUT
MAX_PARTS = 3                 # OUT/a/b/file: at most three path parts below OUT
MAX_FILE_BYTES = 16 * 2**20   # each returned file
LOG_TAIL_BYTES = 2_000_000    # a stage's stdout or stderr: its last bytes go into the tarball
RAY_LOG_TAIL_BYTES = 1_000_000
RAY_LOG_NAMES = ("raylet.out", "gcs_server.out", "dashboard_agent.log", "runtime_env_agent.log")
ARCHIVE_ROOT = "checklist"    # the folder the tarball unpacks into


def out_entries(out: Path) -> list[Path]:
    """Every file and folder under ``out``."""
    return sorted(out.rglob("*")) if out.is_dir() else []


def layout_problems(out: Path) -> list[str]:
    """What would not come back from ``out`` (too many files, too deep, too large); empty when all of it does."""
    files = [p for p in out_entries(out) if p.is_file()]
    problems = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files (at most {MAX_FILES} come back)")
    problems += [f"{p.relative_to(out)} is deeper than OUT/a/b/file" for p in files
                 if len(p.relative_to(out).parts) > MAX_PARTS]
    problems += [f"{p.relative_to(out)} is {p.stat().st_size / 2**20:.1f} MiB (at most 16 MiB come back)" for p in files
                 if p.stat().st_size > MAX_FILE_BYTES]
    return problems


def ray_temp_root(env: dict[str, str]) -> Path:
    """The folder Ray keeps its sessions in for a process with environment ``env`` (``$RAY_TMPDIR/ray``,
    else ``$TMPDIR/ray``, else ``/tmp/ray``: Ray's own rule)."""
    return Path(env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp") / "ray"


def _tail(path: Path, limit: int) -> bytes:
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - limit))
        return f.read()


class Output:
    """OUT (the two returned files) and the staging folder their contents come from."""

    def __init__(self, out: Path, staging: Path):
        self.out, self.staging = Path(out), Path(staging)
        self.logs = self.staging / "logs"          # <stage>.log (stderr), <stage>.out (stdout), <stage>.json
        self.ray_sessions_seen: set[str] = set()

    def check_out(self) -> None:
        """OUT holds nothing but what an earlier checklist left there: anything else would come back with it
        (and count against the 8 files), so it is refused rather than removed."""
        if self.staging.resolve().is_relative_to(self.out.resolve()):
            raise UsageError(f"--work {self.staging.parent} is inside the output folder {self.out}: its models and "
                             "logs would be returned with OUT; put --work elsewhere")
        own = set(RETURNED) | {name + ".tmp" for name in RETURNED}
        other = [p.name for p in sorted(self.out.iterdir())] if self.out.is_dir() else []
        other = [name for name in other if name not in own]
        if other:
            raise UsageError(f"the output folder {self.out} already holds {len(other)} other entries "
                             f"({', '.join(other[:3])}): pass an empty or new folder (the checklist writes only "
                             f"{' and '.join(RETURNED)} there)")

    def prepare(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)

    def keep(self, source: Path, relative: str) -> None:
        """A copy of ``source`` in the tarball as ``checklist/<relative>``."""
        if source.is_file():
            target = self.staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target)

    def collect_ray_logs(self, stage: str, since_epoch: float, root: Path) -> list[str]:
        """The logs of the Ray sessions under ``root`` not collected before and touched since ``since_epoch``,
        into ``ray/<stage>/<session>/``; the folders added (as the tarball names them)."""
        added = []
        for session in sorted(root.glob("session_2*")) if root.is_dir() else []:
            if session.name in self.ray_sessions_seen or not session.is_dir() or \
                    session.stat().st_mtime < since_epoch - 5:
                continue
            self.ray_sessions_seen.add(session.name)
            logs = session / "logs"
            chosen = [logs / name for name in RAY_LOG_NAMES if (logs / name).is_file()]
            chosen += [p for p in sorted(logs.glob("*.err")) if p.stat().st_size > 0]
            target = self.staging / "ray" / stage / session.name
            for path in chosen:
                target.mkdir(parents=True, exist_ok=True)
                (target / path.name).write_bytes(_tail(path, RAY_LOG_TAIL_BYTES))
            if chosen:
                added.append(f"{ARCHIVE_ROOT}/{target.relative_to(self.staging)}")
        return added

    # ----- the two returned files ---------------------------------------------------------------------
    def write(self, report: dict[str, Any]) -> None:
        """``checklist.json``, then ``logs.tar.gz`` of the staging folder, each renamed into place whole."""
        self._replace("checklist.json", (json.dumps(report, indent=1, default=str) + "\n").encode())
        limit = LOG_TAIL_BYTES
        for _ in range(4):          # a tarball over 16 MiB would not come back: keep shorter tails
            self._write_tarball(limit)
            if (self.out / "logs.tar.gz").stat().st_size <= MAX_FILE_BYTES:
                return
            limit //= 4

    def _replace(self, name: str, data: bytes) -> None:
        tmp = self.out / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.out / name)

    def _write_tarball(self, limit: int) -> None:
        tmp = self.out / "logs.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.staging.rglob("*")):
                if not path.is_file():
                    continue
                data = _tail(path, limit)
                info = tarfile.TarInfo(f"{ARCHIVE_ROOT}/{path.relative_to(self.staging)}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, self.out / "logs.tar.gz")


__all__ = ["ARCHIVE_ROOT", "MAX_FILES", "Output", "RAY_LOG_NAMES", "RETURNED", "layout_problems", "out_entries",
           "ray_temp_root"]
