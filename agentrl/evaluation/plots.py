"""Learning curves: success against iteration, one line per method, shaded over seeds.

Read from every run's ``metrics.jsonl``: ``val/success_rate`` (validation passes) when the runs
have it, else ``rollout/success_rate`` (every training iteration). At each iteration the line is
the mean over the seeds that logged it and the band is ± one standard deviation. One PNG per
(environment, model), drawn with Matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from agentrl.evaluation.results import RunResult, method_rank
from agentrl.tracking import read_metrics

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


__all__ = ["CURVE_METRICS", "curve_data", "plot_learning_curves"]
