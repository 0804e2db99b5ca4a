"""Throughput report of a training run, from its metrics.jsonl.

    python scripts/smoke_report.py RUN_DIR_OR_METRICS_JSONL [--expect-iterations N] [--json]
    python -m agentrl.runs.smoke_report ...            (the same; the GPU checklist's smoke stage reads it too)

One line per training iteration and a summary:

* rollout tokens/s: generated (response) tokens of the iteration's rollout divided by the
  rollout's wall time (``rollout/response_tokens / time/rollout_s``; prompt tokens not counted);
* learner tokens/s: tokens (prompt + response) through forward and backward in the PPO update,
  summed over learner ranks, per second of update (``learner/tokens_per_s``);
* iteration s: rollout + learner pass + estimate + update + weight sync (``time/iteration_s``);
* sync s and sleep s: the weight sync (a sleeping vLLM engine's wake-up included) and the engine's
  sleep after the rollout (``rollout.vllm.sleep_level``);
* peak GPU memory (GB) of each phase, every process on the device included
  (``memory/<phase>_peak_gb``; logged on a GPU);
* logprob gap: the largest absolute difference between the rollout backend's log-prob of a sampled
  token and the learner's (``learner/rollout_logprob_gap_max``): bf16 generation leaves a small
  one, a weight sync that did not arrive a large one (shown as nan when the run did not log it).

The summary averages iterations 2..N when there are several (iteration 1 carries one-off costs:
CUDA graph capture, allocator warm-up) and iteration 1 otherwise. Only the standard library is
used, so any Python runs it (agentrl/__init__ and agentrl/runs/__init__ import nothing). Exit status: 0 ok; 1 when the file has fewer training iterations
than ``--expect-iterations`` (or none); 2 when the file does not exist.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ITERATION_KEY = "time/iteration_s"
COLUMNS = ("rollout_tokens_per_s", "learner_tokens_per_s", "iteration_s")


def metrics_path(path: str | Path) -> Path:
    """``path`` itself, or ``path/metrics.jsonl`` when ``path`` is a run directory."""
    path = Path(path)
    return path / "metrics.jsonl" if path.is_dir() else path


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Every JSON object in the file; a torn line (a run killed mid-write) is skipped."""
    records = []
    for line in metrics_path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def iteration_rows(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """One row per training iteration, in iteration order. A resumed run may have logged an
    iteration twice (killed after logging, before its checkpoint): the last record wins."""
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        if ITERATION_KEY in record and int(record.get("step", 0)) >= 1:
            by_step[int(record["step"])] = record
    rows = []
    for step in sorted(by_step):
        r = by_step[step]
        rows.append({
            "iteration": float(step),
            "rollout_tokens_per_s": _ratio(float(r.get("rollout/response_tokens", 0.0)),
                                           float(r.get("time/rollout_s", 0.0))),
            "learner_tokens_per_s": float(r.get("learner/tokens_per_s", 0.0)),
            "iteration_s": float(r[ITERATION_KEY]),
            "rollout_s": float(r.get("time/rollout_s", 0.0)),
            "learner_pass_s": float(r.get("time/learner_pass_s", 0.0)),
            "update_s": float(r.get("time/update_s", 0.0)),
            "sync_s": float(r.get("time/sync_s", 0.0)),
            "sleep_s": float(r.get("time/sleep_s", 0.0)),
            **{f"peak_gb_{k[len('memory/'):-len('_peak_gb')]}": float(v) for k, v in r.items()
               if k.startswith("memory/") and k.endswith("_peak_gb")},
            "response_tokens": float(r.get("rollout/response_tokens", 0.0)),
            "step_records": float(r.get("rollout/step_records", 0.0)),
            "logprob_gap_max": float(r.get("learner/rollout_logprob_gap_max", float("nan"))),
        })
    return rows


def summarize(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Means of the report's columns over iterations 2..N (iteration 1 alone when N == 1)."""
    if not rows:
        return {"iterations": 0, "averaged_over": []}
    used = rows[1:] if len(rows) > 1 else rows
    summary: dict[str, Any] = {"iterations": len(rows), "averaged_over": [int(r["iteration"]) for r in used]}
    for key in COLUMNS:
        summary[key] = sum(r[key] for r in used) / len(used)
    return summary


def format_report(rows: list[dict[str, float]], summary: dict[str, Any]) -> str:
    lines = [f"{'iter':>4} {'rollout tok/s':>14} {'learner tok/s':>14} {'iteration s':>12}   "
             "(rollout s, learner pass s, update s, sync s, sleep s; generated tokens, step records; logprob gap "
             "max; peak GPU GB per phase)"]
    for r in rows:
        peaks = ", ".join(f"{k[len('peak_gb_'):]} {v:.1f}" for k, v in r.items() if k.startswith("peak_gb_"))
        lines.append(f"{int(r['iteration']):>4} {r['rollout_tokens_per_s']:>14.1f} {r['learner_tokens_per_s']:>14.1f} "
                     f"{r['iteration_s']:>12.2f}   ({r['rollout_s']:.2f}, {r['learner_pass_s']:.2f}, "
                     f"{r['update_s']:.2f}, {r['sync_s']:.2f}, {r['sleep_s']:.2f}; {int(r['response_tokens'])}, "
                     f"{int(r['step_records'])}; {r['logprob_gap_max']:.3g}" + (f"; {peaks})" if peaks else ")"))
    if rows:
        span = summary["averaged_over"]
        which = f"iteration {span[0]}" if len(span) == 1 else f"iterations {span[0]}-{span[-1]}"
        lines.append(f"rollout tokens/s {summary['rollout_tokens_per_s']:.1f}, learner tokens/s "
                     f"{summary['learner_tokens_per_s']:.1f}, iteration time {summary['iteration_s']:.2f} s "
                     f"(mean over {which})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a run directory or its metrics.jsonl")
    parser.add_argument("--expect-iterations", type=int, default=1,
                        help="fail (exit 1) when fewer training iterations were logged (default 1)")
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args(argv)
    path = metrics_path(args.path)
    if not path.is_file():
        print(f"smoke_report: no metrics file at {path}", file=sys.stderr)
        return 2
    rows = iteration_rows(load_records(path))
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=2))
    else:
        print(format_report(rows, summary))
    if len(rows) < max(args.expect_iterations, 1):
        print(f"smoke_report: {len(rows)} training iteration(s) in {path}, expected {args.expect_iterations}",
              file=sys.stderr)
        return 1
    return 0


__all__ = ["COLUMNS", "ITERATION_KEY", "format_report", "iteration_rows", "load_records", "main", "metrics_path",
           "summarize"]


if __name__ == "__main__":
    sys.exit(main())
