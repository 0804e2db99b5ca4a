"""Metrics tracking: a JSONL file always, TensorBoard and wandb when enabled, a progress line.

Every ``log(metrics, step)`` call appends one JSON object to ``metrics.jsonl`` (flushed at once,
so a killed run keeps everything logged so far) and forwards the numbers to the enabled trackers.
wandb runs offline when no API key is configured (``logging.wandb.mode=auto``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator


def _finite_numbers(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


class Tracker:
    def __init__(self, run_dir: str | Path, logging_cfg, run_name: str, config_dict: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self._jsonl = open(self.jsonl_path, "a", buffering=1)
        self.progress = logging_cfg.progress_bar
        self._tb = None
        if logging_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        self._wandb = None
        mode = logging_cfg.wandb.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        if mode != "disabled":
            import wandb

            self._wandb = wandb.init(project=logging_cfg.wandb.project, entity=logging_cfg.wandb.entity,
                                     name=run_name, dir=str(self.run_dir), mode=mode, config=config_dict or {},
                                     id=run_name.replace("/", "-"), resume="allow")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        record = {"step": int(step), "time": time.time(), **metrics}
        self._jsonl.write(json.dumps(record, default=str) + "\n")
        numbers = _finite_numbers(metrics)
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def status(self, text: str) -> None:
        """One progress line on stderr (iteration, success rate, phase times)."""
        if self.progress:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class GpuMemory:
    """The peak GPU memory in use on the learner's device during each phase of an iteration, every
    process included (the learner's, a colocated vLLM engine's): ``used()`` is sampled every
    ``interval_s`` by a daemon thread while a phase is open, and once as it opens and closes."""

    def __init__(self, used: Callable[[], int], interval_s: float = 0.05):
        self.used, self.interval_s = used, interval_s
        self.peaks: dict[str, int] = {}
        self._phase: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agentrl-gpu-memory", daemon=True)
        self._thread.start()

    @classmethod
    def for_device(cls, device: str) -> "GpuMemory | None":
        """A monitor of the current CUDA device (``torch.cuda.mem_get_info``), or None off a GPU."""
        if device != "cuda":
            return None
        import torch

        index = torch.cuda.current_device()

        def used() -> int:
            free, total = torch.cuda.mem_get_info(index)
            return int(total - free)

        return cls(used)

    def _sample(self) -> None:
        if self._phase is not None:
            self.peaks[self._phase] = max(self.peaks.get(self._phase, 0), self.used())

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                self._sample()

    def begin(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            self._sample()

    def end(self) -> None:
        with self._lock:
            self._sample()
            self._phase = None

    def take(self) -> dict[str, float]:
        """``memory/<phase>_peak_gb`` since the last call."""
        with self._lock:
            out = {f"memory/{phase}_peak_gb": used / 1e9 for phase, used in self.peaks.items()}
            self.peaks = {}
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


class Phases:
    """The seconds of each phase of an iteration (``time/<phase>_s``, summed when a phase runs twice)
    and, with a :class:`GpuMemory`, its peak GPU memory (``memory/<phase>_peak_gb``)."""

    def __init__(self, memory: GpuMemory | None = None, always: tuple[str, ...] = ()):
        self.memory = memory
        self.times = {f"time/{name}_s": 0.0 for name in always}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.memory is not None:
            self.memory.begin(name)
        try:
            yield
        finally:
            key = f"time/{name}_s"
            self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start
            if self.memory is not None:
                self.memory.end()

    def metrics(self) -> dict[str, float]:
        out = dict(self.times)
        out["time/iteration_s"] = sum(self.times.values())
        if self.memory is not None:
            out.update(self.memory.take())
        return out


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line from a kill is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
