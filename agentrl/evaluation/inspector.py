"""``agentrl inspect``: one self-contained HTML page that shows what every estimator did with one
saved training batch.

A run saves the StepBatch of every ``logging.save_batches``-th iteration to
``<run>/batches/iter_NNNNNN/`` (the batch's safetensors and strings, plus ``transcript.json``: the
decoded responses and the episodes). The page shows, for that iteration, every task group with its
trajectories as step rows (observation, action, response, reward, valid, done) and, computed here
on the very same batch, the advantage of every estimator side by side on one colour scale: the
built-in ones configured from the run's ``config.yaml`` (each with the run's section of it, e.g. the
hidden-state layer and radius of a clustering estimator), the run's own estimator, and any named
with ``--estimators`` (an import path works too).

The step groups an estimator formed (:meth:`~agentrl.estimators.Estimator.step_groups`: anchor-state
groups, hidden-state clusters) are behind every advantage cell: clicking one highlights
the rows that share its group. Per estimator, a summary: mean |A|, the share of rows whose
advantage is 0, the number of step groups, their singleton rate and mean size. The page filters by
task type and by won / lost trajectories and sorts groups by the spread of their outcomes. It needs
no server and no network: styles, script and data are inline.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml

from agentrl.data import StepBatch
from agentrl.errors import UsageError
from agentrl.estimators import (Estimator, build_params, builtin_estimators, estimator_class, is_import_path,
                                SHARED_FIELDS)

BATCHES_DIR = "batches"
TRANSCRIPT = "transcript.json"


# ----------------------------------------------------------------------------------- saved batches
def batch_dir(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / BATCHES_DIR / f"iter_{iteration:06d}"


def save_batch(run_dir: Path, iteration: int, batch: StepBatch, responses: Sequence[str],
               episodes: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write one iteration's batch and its transcript (what ``logging.save_batches`` keeps)."""
    target = batch_dir(run_dir, iteration)
    batch.save(target)
    (target / TRANSCRIPT).write_text(json.dumps({"iteration": iteration, **meta, "responses": list(responses),
                                                 "episodes": list(episodes)}))
    return target


def saved_iterations(run_dir: Path) -> list[int]:
    root = Path(run_dir) / BATCHES_DIR
    found = []
    for path in root.glob("iter_*") if root.is_dir() else ():
        if (path / TRANSCRIPT).is_file() and path.name[5:].isdigit():
            found.append(int(path.name[5:]))
    return sorted(found)


@dataclasses.dataclass
class SavedBatch:
    run_dir: Path
    iteration: int
    batch: StepBatch
    transcript: dict[str, Any]
    config: dict[str, Any]


def load_saved(run_dir: Path, iteration: int | None = None) -> SavedBatch:
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"{run_dir} is not a run directory (no config.yaml); pass the directory `agentrl train` "
                         "wrote (runs/<recipe>-seed<seed>)")
    iterations = saved_iterations(run_dir)
    if not iterations:
        raise UsageError(f"{run_dir} has no saved batches: train with logging.save_batches=N (every N iterations; "
                         "docs/evaluation.md, 'Inspecting credit assignment')")
    if iteration is None:
        iteration = iterations[-1]
    elif iteration not in iterations:
        raise UsageError(f"{run_dir} has no saved batch of iteration {iteration}; saved: "
                         f"{', '.join(map(str, iterations))}")
    path = batch_dir(run_dir, iteration)
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    return SavedBatch(run_dir, iteration, StepBatch.load(path), json.loads((path / TRANSCRIPT).read_text()), config)


# ------------------------------------------------------------------------------------- estimators
@dataclasses.dataclass
class EstimatorView:
    """One estimator's column: advantages, step-group labels (or None), summary, or why it could not run."""

    spec: str
    title: str
    advantages: list[float] | None = None
    groups: list[int] | None = None
    summary: dict[str, float] = dataclasses.field(default_factory=dict)
    error: str | None = None


def configured_estimator(spec: str, algorithm: dict[str, Any]) -> Estimator:
    """Estimator ``spec`` with the run's settings: the shared keys ``algorithm.<key>`` and its section
    (``algorithm.<name>``, or ``algorithm.params`` when the run trained with this import path)."""
    cls = estimator_class(spec)
    fields = {f.name for f in dataclasses.fields(cls.Params)}
    values = {k: v for k, v in algorithm.items() if k in SHARED_FIELDS and k in fields}
    own = algorithm.get("params", {}) if is_import_path(spec) and algorithm.get("estimator") == spec else \
        algorithm.get(cls.name, {})
    values.update({k: v for k, v in (own or {}).items() if k in fields})
    return cls(build_params(cls, values))


def estimator_specs(algorithm: dict[str, Any], requested: Sequence[str] | None) -> list[str]:
    """The estimators to show: ``requested``, else every built-in one plus the run's own."""
    if requested:
        return list(dict.fromkeys(requested))
    specs = list(builtin_estimators())
    trained = algorithm.get("estimator")
    if trained and trained not in specs:
        specs.append(trained)
    return specs


def view_of(spec: str, batch: StepBatch, algorithm: dict[str, Any]) -> EstimatorView:
    try:
        estimator = configured_estimator(spec, algorithm)
    except (UsageError, ValueError) as err:
        return EstimatorView(spec, spec, error=str(err))
    title = type(estimator).title or type(estimator).name
    needs = estimator.row_inputs()
    if needs.hidden_layer is not None and batch.hidden is None:
        return EstimatorView(spec, title, error="needs the actor's hidden states, which this batch does not hold")
    try:
        advantages, _ = estimator.advantages(batch, estimator.new_state())
        groups = estimator.step_groups(batch, estimator.new_state())
    except Exception as err:  # noqa: BLE001 - a user's estimator may fail; the page says so and goes on
        return EstimatorView(spec, title, error=f"{type(err).__name__}: {err}")
    adv = advantages.double()
    summary = {"mean_abs": float(adv.abs().mean()) if len(adv) else 0.0,
               "zero_share": float((adv == 0).double().mean()) if len(adv) else 0.0}
    labels = None
    if groups is not None:
        ids, labels_t = torch.unique(groups, return_inverse=True)
        sizes = torch.bincount(labels_t)
        summary.update(step_groups=float(len(ids)), singleton_rate=float((sizes[labels_t] == 1).double().mean()),
                       mean_group_size=float(sizes.double().mean()))
        labels = labels_t.tolist()
    return EstimatorView(spec, title, [float(a) for a in adv.tolist()], labels, summary)


# ------------------------------------------------------------------------------------------- page
def colour(value: float, scale: float) -> str:
    """The shared diverging scale: blue for negative, red for positive, white at 0."""
    if scale <= 0 or value == 0 or not math.isfinite(value):
        return "transparent"
    strength = min(abs(value) / scale, 1.0)
    rgb = (178, 24, 43) if value > 0 else (33, 102, 172)
    return f"rgba({rgb[0]},{rgb[1]},{rgb[2]},{0.08 + 0.72 * strength:.3f})"


def shared_scale(views: Sequence[EstimatorView]) -> float:
    values = sorted(abs(a) for v in views if v.advantages for a in v.advantages if math.isfinite(a))
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(0.98 * len(values)))] or values[-1]


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def render(saved: SavedBatch, views: Sequence[EstimatorView]) -> str:
    batch, transcript = saved.batch, saved.transcript
    responses = transcript.get("responses") or [""] * len(batch)
    scale = shared_scale(views)
    group_ids, traj_ids = batch.group_id.tolist(), batch.traj_id.tolist()
    steps, valid, done = batch.step.tolist(), batch.action_valid.tolist(), batch.done.tolist()
    reward, expert, success = batch.reward.tolist(), batch.is_expert.tolist(), batch.success.tolist()
    task_of = {e["traj_id"]: e for e in transcript.get("episodes", [])}
    rows_of: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        rows_of.setdefault(g, []).append(i)
    sections = []
    for g, rows in rows_of.items():
        rows.sort(key=lambda i: (expert[i], traj_ids[i], steps[i]))
        returns, won_of = {}, {}
        for i in rows:
            returns[traj_ids[i]] = returns.get(traj_ids[i], 0.0) + reward[i]
            won_of[traj_ids[i]] = bool(success[i])
        spread = float(torch.tensor(list(returns.values()), dtype=torch.float64).std()) if len(returns) > 1 else 0.0
        wins = sum(won_of.values())
        task_type = batch.task_type[rows[0]]
        first_episode = next((task_of[t] for t in returns if t in task_of), {})
        task = first_episode.get("task", {})
        body = []
        previous = None
        for i in rows:
            new_traj = traj_ids[i] != previous
            previous = traj_ids[i]
            won = bool(success[i])
            label = (f"{'expert' if expert[i] else 'episode'} {traj_ids[i]}: {'won' if won else 'lost'}, "
                     f"return {returns[traj_ids[i]]:g}") if new_traj else ""
            cells = [f'<td class="traj">{_esc(label)}</td>', f"<td>{steps[i]}</td>",
                     f'<td><div class="obs">{_esc(batch.anchor_obs[i])}</div></td>',
                     f'<td class="action">{_esc(batch.action[i]) or "<em>invalid</em>"}</td>',
                     f'<td><div class="response">{_esc(responses[i])}</div></td>',
                     f"<td>{reward[i]:g}</td>", f"<td>{'yes' if valid[i] else 'no'}</td>",
                     f"<td>{'yes' if done[i] else ''}</td>"]
            for k, view in enumerate(views):
                if view.advantages is None:
                    cells.append('<td class="adv na">-</td>')
                    continue
                a = view.advantages[i]
                cluster = f' data-cluster="{k}:{view.groups[i]}"' if view.groups is not None else ""
                cells.append(f'<td class="adv" data-est="{k}"{cluster} style="background:{colour(a, scale)}">'
                             f"{a:+.3f}</td>")
            classes = "step" + (" first" if new_traj else "") + (" expert" if expert[i] else "")
            body.append(f'<tr class="{classes}" data-traj="{traj_ids[i]}" data-won="{int(won)}">{"".join(cells)}</tr>')
        heading = (f"Group {g}: {_esc(task_type) or 'task'}"
                   + (f" ({_esc(task.get('split', ''))} #{_esc(task.get('index', ''))})" if task else "")
                   + f", {wins} of {len(returns)} won, return spread {spread:.2f}")
        sections.append(f'<section class="group" data-group="{g}" data-type="{_esc(task_type)}" '
                        f'data-spread="{spread:.6f}"><h2>{heading}</h2><table class="steps"><thead>{_head(views)}'
                        f'</thead><tbody>{"".join(body)}</tbody></table></section>')
    types = sorted(set(batch.task_type))
    title = f"agentrl inspect: {saved.run_dir.name}, iteration {saved.iteration}"
    return PAGE.format(
        title=_esc(title), style=STYLE, script=SCRIPT,
        intro=_esc(f"{len(batch)} steps in {len(rows_of)} groups; trained with "
                   f"{saved.config.get('algorithm', {}).get('estimator', '?')}; policy version "
                   f"{int(batch.policy_version.max()) if len(batch) else 0}; colour scale +-{scale:.3g} "
                   "(98th percentile of |A| over every estimator)"),
        summary=_summary(views), types="".join(f'<option value="{_esc(t)}">{_esc(t)}</option>' for t in types),
        scale=f"{scale:.3g}", groups="".join(sections))


def _head(views: Sequence[EstimatorView]) -> str:
    cols = ["trajectory", "step", "observation", "action", "response", "reward", "valid", "done"]
    cells = [f"<th>{c}</th>" for c in cols]
    cells += [f'<th class="adv" title="{_esc(v.error or v.spec)}">{_esc(v.title)}'
              f'{" (n/a)" if v.advantages is None else ""}</th>' for v in views]
    return f"<tr>{''.join(cells)}</tr>"


def _summary(views: Sequence[EstimatorView]) -> str:
    rows = []
    for v in views:
        if v.advantages is None:
            rows.append(f'<tr><td>{_esc(v.title)}</td><td colspan="5" class="na">{_esc(v.error)}</td></tr>')
            continue
        s = v.summary
        group_cells = (f"<td>{s['step_groups']:.0f}</td><td>{s['singleton_rate']:.1%}</td>"
                       f"<td>{s['mean_group_size']:.2f}</td>") if "step_groups" in s else \
            '<td colspan="3" class="na">no step groups (episode-level)</td>'
        rows.append(f"<tr><td>{_esc(v.title)}</td><td>{s['mean_abs']:.3f}</td><td>{s['zero_share']:.1%}</td>"
                    f"{group_cells}</tr>")
    return ('<table class="summary"><thead><tr><th>estimator</th><th>mean |A|</th><th>rows with A = 0</th>'
            "<th>step groups</th><th>singleton rate</th><th>mean group size</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def inspect_run(run_dir: Path, iteration: int | None = None, estimators: Sequence[str] | None = None,
                out: Path | None = None) -> Path:
    """Write the page for one saved iteration of ``run_dir``; its path."""
    saved = load_saved(run_dir, iteration)
    algorithm = saved.config.get("algorithm", {}) or {}
    views = [view_of(spec, saved.batch, algorithm) for spec in estimator_specs(algorithm, estimators)]
    out = Path(out) if out else Path(run_dir) / f"inspect_iter_{saved.iteration:06d}.html"
    out.write_text(render(saved, views))
    return out


STYLE = """
body{font:13px/1.35 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px} h2{font-size:14px;margin:18px 0 4px}
table{border-collapse:collapse} th,td{border:1px solid #ddd;padding:2px 5px;vertical-align:top}
th{background:#f4f4f4;position:sticky;top:0}
table.summary td,table.summary th{text-align:right} table.summary td:first-child{text-align:left}
tr.first td{border-top:2px solid #777} tr.expert td.traj{color:#7a4b00}
td.traj{white-space:nowrap;font-weight:600} td.adv{text-align:right;font-variant-numeric:tabular-nums;cursor:pointer}
td.na{color:#999;text-align:left}
.obs,.response{max-width:420px;max-height:3.9em;overflow:auto;white-space:pre-wrap}
.response{max-width:260px;color:#555}
td.adv.hl{outline:2px solid #111;outline-offset:-2px} tr.dim{opacity:.35}
#controls{margin:10px 0;display:flex;gap:14px;align-items:center;flex-wrap:wrap}
#legend{display:inline-block;width:160px;height:12px;vertical-align:middle;
background:linear-gradient(90deg,rgba(33,102,172,.8),#fff,rgba(178,24,43,.8))}
#status{color:#333;font-style:italic}
"""

SCRIPT = """
(function(){
  const groups=[...document.querySelectorAll('section.group')];
  const main=document.getElementById('groups');
  function apply(){
    const type=document.getElementById('type').value, outcome=document.getElementById('outcome').value;
    for(const g of groups){
      let shown=0;
      for(const r of g.querySelectorAll('tr.step')){
        const ok=(outcome==='all'||(outcome==='won')===(r.dataset.won==='1'));
        r.hidden=!ok; if(ok) shown++;
      }
      g.hidden=(type!=='all'&&g.dataset.type!==type)||shown===0;
    }
    const order=document.getElementById('sort').value;
    const sorted=[...groups].sort((a,b)=>order==='spread'?b.dataset.spread-a.dataset.spread:a.dataset.group-b.dataset.group);
    for(const g of sorted) main.appendChild(g);
  }
  function clear(){
    document.querySelectorAll('td.adv.hl').forEach(c=>c.classList.remove('hl'));
    document.querySelectorAll('tr.dim').forEach(r=>r.classList.remove('dim'));
    document.getElementById('status').textContent='';
  }
  let active=null;
  main.addEventListener('click',e=>{
    const cell=e.target.closest('td.adv[data-cluster]'); if(!cell) return;
    const key=cell.dataset.cluster; clear();
    if(active===key){active=null;return;} active=key;
    const section=cell.closest('section.group');
    const members=[...section.querySelectorAll('td.adv[data-cluster="'+key+'"]')];
    members.forEach(c=>c.classList.add('hl'));
    section.querySelectorAll('tr.step').forEach(r=>{if(!r.querySelector('td.adv.hl')) r.classList.add('dim');});
    const title=section.querySelectorAll('thead th.adv')[+cell.dataset.est].textContent;
    document.getElementById('status').textContent=title+': '+members.length+' step(s) share this step group';
  });
  for(const id of ['type','outcome','sort']) document.getElementById(id).addEventListener('change',apply);
  apply();
})();
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>
<body><h1>{title}</h1><p>{intro}</p>
<h2>Estimators on this batch</h2>{summary}
<div id="controls">
<label>task type <select id="type"><option value="all">all</option>{types}</select></label>
<label>trajectories <select id="outcome"><option value="all">all</option><option value="won">won</option>
<option value="lost">lost</option></select></label>
<label>groups by <select id="sort"><option value="group">group id</option><option value="spread">outcome spread
</option></select></label>
<span>advantage -{scale} <span id="legend"></span> +{scale}</span>
<span>click an advantage to highlight its step group</span> <span id="status"></span>
</div>
<main id="groups">{groups}</main>
<script>{script}</script>
</body></html>
"""
