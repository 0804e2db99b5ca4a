"""``agentrl sweep``: a grid of training runs (recipes x variants x seeds), resumable.

A sweep file (YAML)::

    name: mini_textcraft                 # default: the file's stem
    output_dir: runs/sweeps/mini         # default: runs/sweeps/<name>
    concurrency: 1                       # cells at once; default 1 on CPU, GPUs // gpus_per_cell with GPUs
    gpus_per_cell: 0                     # each running cell sees its own CUDA_VISIBLE_DEVICES slice
    recipes: [textcraft_grpo_tiny, textcraft_gigpo_tiny]
    seeds: [0, 1, 2]
    overrides: [trainer.iterations=30]   # every cell (a list of key=value, or a mapping)
    variants:                            # optional named override sets, crossed with recipes and seeds
      lr_low: [learner.lr=1e-5]
      lr_high: {learner.lr: 1e-4}
    eval:                                # optional: `agentrl eval` of each finished run (`eval: true`:
      split: test                        #   the run's eval split and eval.seeds)
      seeds: [0]
      overrides: [eval.num_tasks=100]

One cell is one ``agentrl train`` subprocess (then its ``agentrl eval``, when asked for) with the
run directory ``<output_dir>/runs/<cell>`` and the log ``<output_dir>/logs/<cell>.log``. Cells share
SFT warm starts through ``trainer.sft.cache_dir=<output_dir>/sft_cache`` (a cell whose warm start
settings and seed match an earlier cell's copies it; see ``agentrl.warmstart.cache``). The
manifest ``<output_dir>/manifest.json`` (rewritten atomically at every change) holds each cell's
state: pending, running, done or failed (with the return code and the tail of its log). Restarting
the sweep skips done cells and runs the others again; an interrupted training run continues from
its newest checkpoint (``trainer.resume=auto``). A failed cell is recorded and reported; the
other cells go on, and the sweep exits with status 1.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from agentrl.config.loading import recipe_path
from agentrl.errors import UsageError
from agentrl.evaluation.episodes import write_json_atomically
from agentrl.runtime.child_env import child_environment

STATES = ("pending", "running", "done", "failed")
ERROR_TAIL_LINES = 30


@dataclass
class Cell:
    name: str
    recipe: str
    variant: str | None
    seed: int
    overrides: list[str]

    def train_args(self, runs_dir: Path) -> list[str]:
        # the cells of one sweep share SFT warm starts (before the overrides, so a sweep file can change it)
        return ["train", f"recipe={self.recipe}", f"trainer.sft.cache_dir={runs_dir.parent / 'sft_cache'}",
                *self.overrides, f"trainer.seed={self.seed}", f"trainer.output_dir={runs_dir}",
                f"trainer.run_name={self.name}"]


@dataclass
class SweepSpec:
    name: str
    output_dir: Path
    cells: list[Cell]
    concurrency: int
    gpus_per_cell: int = 0
    eval: dict[str, Any] | None = None
    source: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def eval_args(self, run_dir: Path) -> list[str] | None:
        if self.eval is None:
            return None
        args = ["eval", f"checkpoint={run_dir}"]
        if self.eval.get("split"):
            args.append(f"split={self.eval['split']}")
        if self.eval.get("seeds") is not None:
            args.append("seeds=" + ",".join(str(int(s)) for s in self.eval["seeds"]))
        return args + _override_list(self.eval.get("overrides"), "eval.overrides")


def _override_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [f"{k}={_yaml_scalar(v)}" for k, v in value.items()]
    if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
        return list(value)
    raise UsageError(f"sweep file: {where} must be a list of key=value strings or a mapping")


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _default_concurrency(gpus_per_cell: int) -> int:
    try:
        import torch

        gpus = torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no torch/CUDA: CPU
        gpus = 0
    if gpus and gpus_per_cell:
        return max(1, gpus // gpus_per_cell)
    return 1


def load_sweep(path: str | os.PathLike, output_dir: str | None = None) -> SweepSpec:
    """Read and check a sweep file; the cells in grid order (recipe, variant, seed)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UsageError(f"sweep file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UsageError(f"sweep file {path} is not valid YAML: {err}") from None
    known = {"name", "output_dir", "concurrency", "gpus_per_cell", "recipes", "seeds", "overrides", "variants",
             "eval", "env"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"sweep file {path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    recipes = data.get("recipes")
    if not recipes or not isinstance(recipes, list):
        raise UsageError(f"sweep file {path}: `recipes` must be a non-empty list of recipe names")

    for recipe in recipes:
        recipe_path(str(recipe))  # raises a UsageError naming the unknown recipe
    seeds = [int(s) for s in data.get("seeds", [0])]
    common = _override_list(data.get("overrides"), "overrides")
    variants = data.get("variants") or {}
    if not isinstance(variants, dict):
        raise UsageError(f"sweep file {path}: `variants` must map a name to its overrides")
    variant_items: list[tuple[str | None, list[str]]] = (
        [(str(k), _override_list(v, f"variants.{k}")) for k, v in variants.items()] or [(None, [])])
    cells = []
    for recipe in recipes:
        stem = Path(str(recipe)).stem if str(recipe).endswith((".yaml", ".yml")) else str(recipe)
        for variant, extra in variant_items:
            for seed in seeds:
                name = f"{stem}-{variant}-seed{seed}" if variant else f"{stem}-seed{seed}"
                cells.append(Cell(name, str(recipe), variant, seed, common + extra))
    if len({c.name for c in cells}) != len(cells):
        raise UsageError(f"sweep file {path}: two cells have the same name (repeated recipe or seed?)")
    name = str(data.get("name") or path.stem)
    out = Path(output_dir or data.get("output_dir") or Path("runs") / "sweeps" / name).expanduser()
    gpus_per_cell = int(data.get("gpus_per_cell", 0))
    concurrency = int(data.get("concurrency") or _default_concurrency(gpus_per_cell))
    if concurrency < 1:
        raise UsageError(f"sweep file {path}: concurrency must be >= 1")
    ev = data.get("eval")
    ev = {} if ev is True else (None if ev is False else ev)
    if ev is not None and not isinstance(ev, dict):
        raise UsageError(f"sweep file {path}: `eval` must be a mapping (split, seeds, overrides)")
    env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
    return SweepSpec(name, out, cells, concurrency, gpus_per_cell, ev, str(path), env)


class Manifest:
    """The sweep's cells and their states, in ``manifest.json`` (atomic rewrites, thread-safe)."""

    def __init__(self, path: Path, spec: SweepSpec):
        self.path = path
        self.lock = threading.Lock()
        old = json.loads(path.read_text()).get("cells", {}) if path.is_file() else {}
        self.cells: dict[str, dict[str, Any]] = {}
        for cell in spec.cells:
            entry = dict(old.get(cell.name, {}))
            entry.update({"recipe": cell.recipe, "variant": cell.variant, "seed": cell.seed,
                          "overrides": cell.overrides, "run_dir": str(spec.output_dir / "runs" / cell.name),
                          "log": str(spec.output_dir / "logs" / f"{cell.name}.log")})
            entry.setdefault("state", "pending")
            entry.setdefault("attempts", 0)
            self.cells[cell.name] = entry
        self.extra = {"sweep": spec.name, "file": spec.source, "output_dir": str(spec.output_dir)}
        self.save()

    def save(self) -> None:
        counts = {s: sum(c["state"] == s for c in self.cells.values()) for s in STATES}
        write_json_atomically(self.path, {**self.extra, "updated": time.time(), "counts": counts,
                                          "cells": self.cells})

    def update(self, name: str, **values: Any) -> None:
        with self.lock:
            self.cells[name].update(values)
            self.save()


def _tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16_000))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def cell_environment(base: dict[str, str] | os._Environ, spec_env: dict[str, str], gpus: str | None
                     ) -> dict[str, str]:
    """The environment of one cell's ``agentrl train``: the sweep's, less any inherited rendezvous,
    plus the spec's ``env`` and the cell's GPUs."""
    env = child_environment(base)       # every cell is a run of its own: no inherited rendezvous
    env.update(spec_env)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


class SweepRunner:
    def __init__(self, spec: SweepSpec, *, retry_failed: bool = True, log: Callable[[str], None] = print):
        self.spec = spec
        self.retry_failed = retry_failed
        self.log = log
        spec.output_dir.mkdir(parents=True, exist_ok=True)
        (spec.output_dir / "logs").mkdir(exist_ok=True)
        self.manifest = Manifest(spec.output_dir / "manifest.json", spec)
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopping = False
        self.slots: queue.Queue = queue.Queue()
        for i in range(spec.concurrency):
            gpus = range(i * spec.gpus_per_cell, (i + 1) * spec.gpus_per_cell)
            self.slots.put(",".join(map(str, gpus)) if spec.gpus_per_cell else None)

    def todo(self) -> list[Cell]:
        states = {n: c["state"] for n, c in self.manifest.cells.items()}
        skip = {"done"} if self.retry_failed else {"done", "failed"}
        return [c for c in self.spec.cells if states[c.name] not in skip]

    def run(self) -> dict[str, Any]:
        cells = self.todo()
        skipped = len(self.spec.cells) - len(cells)
        self.log(f"sweep {self.spec.name}: {len(self.spec.cells)} cells, {skipped} already finished, "
                 f"{len(cells)} to run, {self.spec.concurrency} at a time -> {self.spec.output_dir}")
        previous = signal.getsignal(signal.SIGTERM)
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            signal.signal(signal.SIGTERM, _interrupt)
        pool = ThreadPoolExecutor(max_workers=self.spec.concurrency)
        try:
            futures = [pool.submit(self._run_cell, cell) for cell in cells]
            for future in futures:
                while not future.done():
                    time.sleep(0.2)
                future.result()
        except KeyboardInterrupt:
            self.stop()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            if in_main:
                signal.signal(signal.SIGTERM, previous)
        return self.report()

    def stop(self) -> None:
        """Stop the running cells (they go back to pending) and start no new one."""
        self.stopping = True
        for name, proc in list(self.procs.items()):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            self.manifest.update(name, state="pending", error="interrupted")

    def _run_cell(self, cell: Cell) -> None:
        if self.stopping:
            return
        slot = self.slots.get()
        try:
            if self.stopping:
                return
            entry = self.manifest.cells[cell.name]
            self.manifest.update(cell.name, state="running", started=time.time(), finished=None, error=None,
                                 returncode=None, attempts=int(entry.get("attempts", 0)) + 1)
            self.log(f"[{cell.name}] running")
            run_dir = self.spec.output_dir / "runs" / cell.name
            steps = [cell.train_args(self.spec.output_dir / "runs")]
            eval_args = self.spec.eval_args(run_dir)
            if eval_args:
                steps.append(eval_args)
            rc = 0
            for args in steps:
                rc = self._subprocess(cell, args, slot)
                if rc != 0 or self.stopping:
                    break
            if self.stopping:
                return
            if rc == 0:
                self.manifest.update(cell.name, state="done", finished=time.time(), returncode=0)
                self.log(f"[{cell.name}] done")
            else:
                tail = _tail(Path(self.manifest.cells[cell.name]["log"]))
                self.manifest.update(cell.name, state="failed", finished=time.time(), returncode=rc, error=tail)
                self.log(f"[{cell.name}] FAILED (exit {rc}); see {self.manifest.cells[cell.name]['log']}")
        finally:
            self.slots.put(slot)

    def _subprocess(self, cell: Cell, args: list[str], gpus: str | None) -> int:
        env = cell_environment(os.environ, self.spec.env, gpus)
        log_path = Path(self.manifest.cells[cell.name]["log"])
        with open(log_path, "a") as log_file:
            log_file.write(f"\n$ agentrl {' '.join(args)}\n")
            log_file.flush()
            proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", *args], stdout=log_file,
                                    stderr=subprocess.STDOUT, env=env)
            self.procs[cell.name] = proc
            try:
                return proc.wait()
            finally:
                self.procs.pop(cell.name, None)

    def report(self) -> dict[str, Any]:
        cells = self.manifest.cells
        counts = {s: sum(c["state"] == s for c in cells.values()) for s in STATES}
        failed = {n: {"returncode": c.get("returncode"), "log": c["log"], "error": c.get("error")}
                  for n, c in cells.items() if c["state"] == "failed"}
        return {"sweep": self.spec.name, "output_dir": str(self.spec.output_dir), "counts": counts, "failed": failed}


__all__ = ["Cell", "Manifest", "SweepRunner", "SweepSpec", "load_sweep"]
