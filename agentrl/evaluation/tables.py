"""The papers' tables from per-run results: Markdown, LaTeX or CSV.

One table per (environment, model). A measured row is one method over its seeds: each cell is
``mean ± std [95% t interval]`` of the per-seed percentages (just the mean for one seed); the
best mean of every column among the measured rows is marked (bold, or ``best=true`` in CSV), except
``Start`` (the starting policy's success, see :mod:`agentrl.evaluation.results`).
Reference rows hold the papers' published numbers (the file each environment declares in its
spec's ``results.published``), labelled with their
source; they are never marked best. For a tiny model every reference row of the environment is
shown, for a Qwen2.5 model those of its size.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Sequence

from agentrl.evaluation.results import START_COLUMNS, RunResult, env_columns, method_rank, published_rows, result_spec
from agentrl.evaluation.stats import Stat, describe

FORMATS = ("md", "latex", "csv")


@dataclass
class Row:
    method: str
    cells: dict[str, Stat]
    seeds: int
    kind: str = "measured"   # or "published"
    source: str = ""


@dataclass
class Table:
    env: str
    model: str
    columns: tuple[str, ...]
    rows: list[Row]
    best: dict[str, set[str]]  # column -> methods with the best mean

    @property
    def title(self) -> str:
        return f"{result_spec(self.env).title or self.env}, model {self.model}"


def _size(model: str) -> str | None:
    for size in ("1.5B", "7B"):
        if size.lower() in model.lower():
            return size
    return None


def _reference_rows(env: str, model: str, columns: Sequence[str]) -> list[Row]:
    size = _size(model)
    rows = []
    for ref in published_rows(env):
        if (size is not None and _size(ref["model"]) != size):
            continue
        cells = {}
        for col, value in ref["values"].items():
            mean, std = (value[0], value[1]) if isinstance(value, list) else (value, None)
            if col in columns:
                cells[col] = Stat(float(mean), None if std is None else float(std), 3, None)
        label = ref["method"] if size is not None else f"{ref['method']}, {ref['model']}"
        rows.append(Row(f"{label} (published)", cells, 3, "published", ref["source_text"]))
    return rows


def build_tables(runs: Sequence[RunResult], *, references: bool = True) -> list[Table]:
    groups: dict[tuple[str, str], dict[str, list[RunResult]]] = {}
    for run in runs:
        groups.setdefault((run.env, run.model), {}).setdefault(run.method, []).append(run)
    tables = []
    for (env, model), methods in sorted(groups.items()):
        present = {c for rs in methods.values() for r in rs for c in r.values}
        columns = env_columns(env, present) + tuple(c for c in START_COLUMNS if c in present)
        rows = []
        for method in sorted(methods, key=method_rank):
            seed_runs = methods[method]
            cells = {col: describe(r.values[col] for r in seed_runs if col in r.values)
                     for col in columns if any(col in r.values for r in seed_runs)}
            rows.append(Row(method, cells, len(seed_runs)))
        best = {}
        for col in columns:
            if col == "Start":      # the starting policy is not a result to rank
                continue
            means = {r.method: r.cells[col].mean for r in rows if col in r.cells}
            if means:
                top = max(means.values())
                best[col] = {m for m, v in means.items() if abs(v - top) < 1e-9}
        if references:
            rows += _reference_rows(env, model, columns)
        tables.append(Table(env, model, columns, rows, best))
    return tables


def _cell_text(stat: Stat | None, *, pm: str, interval: bool = True) -> str:
    if stat is None:
        return "–"
    text = f"{stat.mean:.1f}"
    if stat.std is not None:
        text += f" {pm} {stat.std:.1f}"
    if interval and stat.ci is not None:
        text += f" [{stat.ci[0]:.1f}, {stat.ci[1]:.1f}]"
    return text


def to_markdown(tables: Sequence[Table]) -> str:
    out = []
    for table in tables:
        out.append(f"### {table.title}\n")
        out.append("| Method | Seeds | " + " | ".join(table.columns) + " |")
        out.append("|---|---|" + "---|" * len(table.columns))
        for row in table.rows:
            cells = []
            for col in table.columns:
                text = _cell_text(row.cells.get(col), pm="±")
                if row.kind == "measured" and row.method in table.best.get(col, ()):
                    text = f"**{text}**"
                cells.append(text)
            seeds = str(row.seeds) if row.kind == "measured" else "3"
            out.append(f"| {row.method} | {seeds} | " + " | ".join(cells) + " |")
        out.append("")
        out.append("Measured rows: mean ± std over training seeds [95% Student-t interval]; best mean per column "
                   "in bold.")
        if "Start" in table.columns:
            out.append("Start: success of the starting policy (validation before training); Gain: the run's "
                       "success minus its own Start, per seed.")
        sources = sorted({r.source for r in table.rows if r.kind == "published"})
        if sources:
            out.append("Published rows (mean ± std over 3 seeds as printed): " + "; ".join(sources) + ".")
        out.append("")
    return "\n".join(out)


def _latex_escape(text: str) -> str:
    text = text.replace("\\", "\0")
    for a, b in (("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$"), ("{", r"\{"),
                 ("}", r"\}")):
        text = text.replace(a, b)
    return text.replace("\0", r"\textbackslash{}")


def to_latex(tables: Sequence[Table]) -> str:
    out = []
    for table in tables:
        out.append(r"\begin{table}[t]")
        out.append(r"\centering")
        out.append(r"\caption{" + _latex_escape(table.title) + r". Mean $\pm$ std over seeds with the 95\% "
                   r"Student-$t$ interval; best measured mean in bold; published rows as printed.}")
        out.append(r"\begin{tabular}{l" + "c" * len(table.columns) + "}")
        out.append(r"\toprule")
        out.append("Method & " + " & ".join(_latex_escape(c) for c in table.columns) + r" \\")
        out.append(r"\midrule")
        published_started = False
        for row in table.rows:
            if row.kind == "published" and not published_started:
                out.append(r"\midrule")
                published_started = True
            cells = []
            for col in table.columns:
                text = _cell_text(row.cells.get(col), pm=r"$\pm$")
                if text == "–":
                    text = "--"
                if row.kind == "measured" and row.method in table.best.get(col, ()):
                    text = r"\textbf{" + text + "}"
                cells.append(text)
            out.append(_latex_escape(row.method) + " & " + " & ".join(cells) + r" \\")
        out.append(r"\bottomrule")
        out.append(r"\end{tabular}")
        out.append(r"\end{table}")
        out.append("")
    return "\n".join(out)


def to_csv(tables: Sequence[Table]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["env", "model", "method", "kind", "column", "mean", "std", "ci95_low", "ci95_high", "n",
                     "best", "source"])
    fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
    for table in tables:
        for row in table.rows:
            for col in table.columns:
                stat = row.cells.get(col)
                if stat is None:
                    continue
                best = row.kind == "measured" and row.method in table.best.get(col, ())
                writer.writerow([table.env, table.model, row.method, row.kind, col, fmt(stat.mean), fmt(stat.std),
                                 fmt(stat.ci[0] if stat.ci else None), fmt(stat.ci[1] if stat.ci else None),
                                 stat.n, "true" if best else "false", row.source])
    return buffer.getvalue()


def render(tables: Sequence[Table], fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return {"md": to_markdown, "latex": to_latex, "csv": to_csv}[fmt](tables)


__all__ = ["FORMATS", "Row", "Table", "build_tables", "render", "to_csv", "to_latex", "to_markdown"]
