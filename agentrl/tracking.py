"""Metrics tracking: a JSONL file always, TensorBoard and wandb when enabled, a progress line.

Every ``log(metrics, step)`` call appends one JSON object to ``metrics.jsonl`` (flushed at once,
so a killed run keeps everything logged so far) and forwards the numbers to the enabled trackers.
wandb runs offline when no API key is configured (``logging.wandb.mode=auto``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any


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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file (a torn last line from a kill is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
