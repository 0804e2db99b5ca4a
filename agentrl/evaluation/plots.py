"""The pictures runs leave behind, drawn with Matplotlib's Agg backend (no display needed).

* :func:`plot_learning_curves` (``agentrl table``, sweeps): success against iteration, one line
  per method, shaded over seeds, from every run's ``metrics.jsonl``: ``val/success_rate``
  (validation passes) when the runs have it, else ``rollout/success_rate``. At each iteration the
  line is the mean over the seeds that logged it and the band is ± one standard deviation. One PNG
  per (environment, model).
* :func:`plot_run` (``agentrl train``, at each validation and at the end): one run's
  ``learning_curve.png``: training and validation success, episode length, invalid-action rate,
  KL, and the seconds of each phase of an iteration.
* :func:`plot_task_types` (``agentrl eval``): success per task type, one bar each, as a PNG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from agentrl.evaluation.results import RunResult, method_rank
from agentrl.runs.tracking import read_metrics

CURVE_METRICS = ("val/success_rate", "rollout/success_rate")


def _series(run_dir: Path, key: str) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    return {int(r["step"]): 100 * float(r[key]) for r in read_metrics(path) if key in r and "step" in r}


def curve_data(runs: Sequence[RunResult], metric: str | None = None) -> tuple[str, dict[str, dict[int, list[float]]]]:
    """The metric used and, per method, iteration -> the seeds' values."""
    keys = [metric] if metric else list(CURVE_METRICS)
    for key in keys:
        data: dict[str, dict[int, list[float]]] = {}
        for run in runs:
            for step, value in _series(run.run_dir, key).items():
                data.setdefault(run.method, {}).setdefault(step, []).append(value)
        if data:
            return key, data
    return keys[0], {}


def plot_learning_curves(runs: Sequence[RunResult], out_dir: str | Path, metric: str | None = None) -> list[Path]:
    """Write ``curve_<env>_<model>.png`` for every (environment, model) of ``runs``; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for run in runs:
        groups.setdefault((run.env, run.model), []).append(run)
    written = []
    for (env, model), group in sorted(groups.items()):
        key, data = curve_data(group, metric)
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
        for method in sorted(data, key=method_rank):
            steps = sorted(data[method])
            values = [data[method][s] for s in steps]
            mean = [sum(v) / len(v) for v in values]
            std = [math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
                   for v, m in zip(values, mean)]
            seeds = max(len(v) for v in values)
            line, = ax.plot(steps, mean, marker="o" if len(steps) < 30 else None, markersize=3,
                            label=f"{method} ({seeds} seed{'s' if seeds > 1 else ''})")
            ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                            color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"{key} (%)")
        ax.set_title(f"{env}, {model}: mean ± std over seeds")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"curve_{env}_{model}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


RUN_CURVE = "learning_curve.png"
# (panel title, [(metric key, label)], scale to percent)
RUN_PANELS = (
    ("success (%)", [("rollout/success_rate", "training"), ("val/success_rate", "validation")], 100.0),
    ("episode length (steps)", [("rollout/episode_length", "training"), ("val/episode_length", "validation")], 1.0),
    ("invalid-action rate (%)", [("rollout/invalid_action_rate", "training"),
                                 ("val/invalid_action_rate", "validation")], 100.0),
    ("KL", [("learner/kl_ref", "to the reference"), ("learner/approx_kl", "update (approx)")], 1.0),
)
PHASES = (("time/rollout_s", "rollout"), ("time/learner_pass_s", "log-prob pass"), ("time/estimate_s", "estimator"),
          ("time/update_s", "update"), ("time/sync_s", "weight sync"))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: str | Path, title: str | None = None) -> Path | None:
    """Write ``<run_dir>/learning_curve.png`` from its ``metrics.jsonl``; None when nothing is logged yet."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    records = [r for r in read_metrics(path) if "step" in r] if path.is_file() else []
    series = {key: {int(r["step"]): float(r[key]) for r in records if key in r}
              for panel in RUN_PANELS for key, _ in panel[1]}
    series.update({key: {int(r["step"]): float(r[key]) for r in records if key in r} for key, _ in PHASES})
    if not any(series.values()):
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.6), dpi=100)
    for ax, (label, keys, factor) in zip(axes.flat, RUN_PANELS):
        for key, name in keys:
            points = sorted(series[key].items())
            if points:
                ax.plot([p[0] for p in points], [factor * p[1] for p in points], marker="o", markersize=3,
                        label=name)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax = axes.flat[4]
    steps = sorted({s for key, _ in PHASES for s in series[key] if s > 0})
    bottom = [0.0] * len(steps)
    for key, name in PHASES:
        values = [series[key].get(s, 0.0) for s in steps]
        if any(values):
            ax.bar(steps, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_title("seconds per iteration, by phase", fontsize=10)
    ax.set_xlabel("iteration")
    if steps:
        ax.legend(fontsize=8)
    axes.flat[5].axis("off")
    last = max((r["step"] for r in records if "rollout/success_rate" in r), default=0)
    axes.flat[5].text(0.0, 0.9, f"{title or run_dir.name}\niterations logged: {last}", fontsize=10, va="top")
    fig.tight_layout()
    out = run_dir / RUN_CURVE
    tmp = out.with_name(out.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out


def plot_task_types(summary: dict, out: str | Path) -> Path:
    """Success per task type of an ``agentrl eval`` summary (its ``by_type``), as a bar chart PNG."""
    by_type = summary.get("by_type") or {}
    names = list(by_type)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(names) + 2), 3.6), dpi=100)
    rates = [100 * float(by_type[n]["success_rate"]) for n in names]
    bars = ax.bar(range(len(names)), rates, color="#4c72b0")
    for bar, n in zip(bars, names):
        ax.annotate(f"{bar.get_height():.1f}\n({int(by_type[n]['episodes'])})", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), [n or "(none)" for n in names], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 110)
    overall = 100 * float(summary.get("success_rate", 0.0))
    ax.axhline(overall, color="#c44e52", linestyle="--", linewidth=1, label=f"all: {overall:.1f} %")
    ax.set_title(f"{summary.get('env', '')} {summary.get('split', '')}: success per task type (episodes)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


__all__ = ["CURVE_METRICS", "PHASES", "RUN_CURVE", "curve_data", "plot_learning_curves", "plot_run", "plot_task_types"]
