"""Per-run numbers from a results directory: what ``agentrl table`` and the plots are built from.

A results directory is a sweep's output directory (its ``manifest.json`` lists the runs) or any
directory holding run directories (a ``config.yaml`` each, searched three levels deep). One run
gives one :class:`RunResult`, from the first of:

1. an ``agentrl eval`` summary in ``<run>/eval/*/summary.json`` (complete, of the requested split,
   else of the run's ``env.eval_split``), averaged over its evaluation seeds; the WebShop score
   comes only from here;
2. the validation records of ``<run>/metrics.jsonl``: the last one (``metric=final``) or the one
   with the highest ``val/success_rate`` (``metric=peak``, how some papers report). With
   ``metric=peak`` these come first, since an evaluation summary is of the final policy only.

Values are percentages. Column names are declared by each environment in its spec's ``results``
(:class:`agentrl.envs.spec.ResultSpec`): a column per task type (by its declared column name, e.g.
ALFWorld's Pick ... Pick2, TextCraft's ``depthN``), the success column (``All``; WebShop
``Success``) and a score column where the environment has a task score (WebShop ``Score``). A
run of an environment not found here gets the defaults (task types, then ``All``).

When the run validated before training (a ``val/success_rate`` record at step 0: the starting
policy, e.g. the SFT warm start), two more columns: ``Start``, that success, and ``Gain``, the
run's success (the success column) minus ``Start``. Runs of one seed share their warm
start across estimators, so ``Gain`` is the RL effect with the warm start's own spread removed.
It is meaningful when the two numbers come from the same tasks (``agentrl eval`` of the whole
validation split, or the run's last validation).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrl.config.schema import EnvConfig
from agentrl.envs.spec import ENVS, ResultSpec, env_spec
from agentrl.estimators import builtin_estimators, estimator_title
from agentrl.plugins import PluginError
from agentrl.runs.tracking import read_metrics

START_COLUMNS = ("Start", "Gain")   # success before training, and the run's success minus it


@dataclass
class RunResult:
    run_dir: Path
    env: str
    model: str
    method: str          # estimator name (+ the sweep variant)
    estimator: str
    seed: int
    values: dict[str, float] = field(default_factory=dict)  # column -> percent
    source: str = ""     # "eval <split>" or "val final|peak"


def result_spec(env: str) -> ResultSpec:
    """What ``env`` declares about its results; the defaults for an environment not found here (a
    results directory copied from a machine that has it)."""
    try:
        return env_spec(env).results
    except PluginError:
        return ResultSpec()


def _natural(column: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", column)]


def env_columns(env: str, present: set[str] | None = None) -> tuple[str, ...]:
    """The result columns of ``env``: its fixed ones, else the task types in ``present`` (natural
    order: depth2 before depth10), then the success column."""
    declared = result_spec(env)
    if declared.columns:
        return tuple(declared.columns)
    skip = {declared.success_column, declared.score_column, *START_COLUMNS}
    types = sorted((c for c in (present or ()) if c and c not in skip), key=_natural)
    return (*types, declared.success_column)


def _type_column(declared: ResultSpec, task_type: str) -> str:
    return declared.type_columns.get(task_type, task_type)


def model_label(name_or_path: str) -> str:
    return "tiny" if name_or_path == "tiny" else Path(str(name_or_path)).name


def unfinished_cells(results: Path) -> dict[str, str]:
    """Cell name -> state of a sweep's cells that are not done (none without a manifest)."""
    manifest = results / "manifest.json"
    if not manifest.is_file():
        return {}
    cells = json.loads(manifest.read_text()).get("cells", {})
    return {name: cell.get("state", "?") for name, cell in cells.items() if cell.get("state") != "done"}


def find_runs(results: Path) -> list[tuple[Path, str | None]]:
    """``(run_dir, variant)`` of every run under ``results``: with a sweep manifest, its done cells
    (a running, pending or failed cell's numbers are partial); else every run directory found."""
    manifest = results / "manifest.json"
    if manifest.is_file():
        cells = json.loads(manifest.read_text()).get("cells", {})
        runs = []
        for name, cell in cells.items():
            if cell.get("state") != "done":
                continue
            run_dir = Path(cell["run_dir"])
            if not run_dir.is_absolute() and not run_dir.exists():
                run_dir = results / "runs" / name
            if (run_dir / "config.yaml").is_file():
                runs.append((run_dir, cell.get("variant")))
        return runs
    found = sorted({p.parent for depth in ("*", "*/*", "*/*/*") for p in results.glob(f"{depth}/config.yaml")})
    if (results / "config.yaml").is_file():
        found.insert(0, results)
    return [(p, None) for p in found]


def _from_eval(run_dir: Path, env: str, split: str | None) -> tuple[dict[str, float], str] | None:
    summaries = []
    for path in sorted(run_dir.glob("eval/*/summary.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        if data.get("complete") and data.get("episodes") and (split is None or data.get("split") == split):
            summaries.append(data)
    if not summaries:
        return None
    data = summaries[0]
    per_seed = list(data.get("per_seed", {}).values()) or [data]
    n = len(per_seed)
    declared = result_spec(env)
    values: dict[str, float] = {}
    if declared.score_column:
        values[declared.score_column] = 100 * sum(s["mean_score"] for s in per_seed) / n
    values[declared.success_column] = 100 * sum(s["success_rate"] for s in per_seed) / n
    if declared.per_type:
        types = sorted({t for s in per_seed for t in s.get("by_type", {})})
        for t in types:
            rates = [s["by_type"][t]["success_rate"] for s in per_seed if t in s.get("by_type", {})]
            values[_type_column(declared, t)] = 100 * sum(rates) / len(rates)
    return values, f"eval {data.get('split')}"


def _from_metrics(run_dir: Path, env: str, metric: str) -> tuple[dict[str, float], str] | None:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [r for r in read_metrics(path) if "val/success_rate" in r]
    if not records:
        return None
    record = max(records, key=lambda r: r["val/success_rate"]) if metric == "peak" else records[-1]
    success = 100 * record["val/success_rate"]
    declared = result_spec(env)
    values = {declared.success_column: success}
    if not declared.per_type:
        return values, f"val {metric}"
    prefix = "val/success_rate/"
    for key, value in record.items():
        if key.startswith(prefix):
            values[_type_column(declared, key[len(prefix):])] = 100 * value
    return values, f"val {metric}"


def _starting_success(run_dir: Path) -> float | None:
    """``val/success_rate`` (percent) of the validation before the first iteration, if there was one."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for record in read_metrics(path):
        if "val/success_rate" in record and record.get("step") == 0:
            return 100 * record["val/success_rate"]
    return None


def load_run(run_dir: Path, variant: str | None = None, *, metric: str = "final",
             split: str | None = None) -> RunResult | None:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    env = cfg.get("env", {}).get("name", EnvConfig.name)
    estimator = cfg.get("algorithm", {}).get("estimator", "grpo")
    method = estimator_title(estimator) + (f" ({variant})" if variant else "")
    result = RunResult(run_dir, env, model_label(cfg.get("model", {}).get("name_or_path", "tiny")), method,
                       estimator, int(cfg.get("trainer", {}).get("seed", 0)))
    found = _from_metrics(run_dir, env, metric) if metric == "peak" else None
    if found is None:
        found = _from_eval(run_dir, env, split or cfg.get("eval", {}).get("split") or cfg.get("env", {}).get("eval_split"))
    if found is None and split is None:
        found = _from_eval(run_dir, env, None)
    found = found or _from_metrics(run_dir, env, metric)
    if found is None:
        return None
    result.values, result.source = found
    start = _starting_success(run_dir)
    main = result_spec(env).success_column
    if start is not None and main in result.values:
        result.values["Start"] = start
        result.values["Gain"] = result.values[main] - start
    return result


def collect(results: str | Path, *, metric: str = "final", split: str | None = None) -> list[RunResult]:
    """Every run under ``results`` that has numbers yet (runs without any are left out)."""
    if metric not in ("final", "peak"):
        raise ValueError(f"metric must be final or peak, got {metric!r}")
    out = []
    for run_dir, variant in find_runs(Path(results)):
        run = load_run(run_dir, variant, metric=metric, split=split)
        if run is not None:
            out.append(run)
    return out


def method_rank(method: str) -> tuple[int, str]:
    """Table order: the built-in estimators by their ``table_rank``, then any other method by name."""
    base = method.split(" (")[0]
    order = [cls.title or name for name, cls in builtin_estimators().items()]
    return (order.index(base) if base in order else len(order), method)


def published_rows(env: str | None = None) -> list[dict[str, Any]]:
    """The published numbers ``env`` declares (``results.published``; every environment found
    when None), each row with its ``env`` and its source's text."""
    rows = []
    for name in [env] if env is not None else ENVS.names():
        path = result_spec(name).published
        if not path:
            continue
        data = yaml.safe_load(Path(path).read_text())
        rows += [{"env": name, **row, "source_text": data["sources"][row["source"]]} for row in data["rows"]]
    return rows


__all__ = ["START_COLUMNS", "RunResult", "collect", "env_columns", "find_runs", "load_run", "unfinished_cells", "method_rank", "model_label",
           "published_rows", "result_spec"]
