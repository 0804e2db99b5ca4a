"""The episode log of ``agentrl eval`` and the summary computed from it.

``episodes.jsonl`` holds one JSON object per finished episode::

    {"seed": 0, "task": {"split": "test", "index": 3}, "type": "depth2", "success": true,
     "reward": 10.0, "score": 1.0, "steps": 4, "invalid_actions": 0, "env_error": null,
     "transcript": [{"observation": ..., "response": ..., "action": ..., "valid": true, "reward": 0.0},
                    ..., {"observation": <the last one>}]}

The file is only ever appended to, a batch of episodes at a time, each write flushed and synced.
A kill can leave a torn last line: :meth:`EpisodeLog.load` drops it and cuts the file back to its
last complete line, so the next append starts clean and that episode is simply played again.
``score`` is the environment's task score (WebShop's purchase score in [0, 1]); for environments
without one it is 1.0 for a success and 0.0 otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from agentrl.evaluation.stats import describe

EpisodeKey = tuple[int, str, int]  # (seed, split, index)


def episode_key(record: dict[str, Any]) -> EpisodeKey:
    return int(record["seed"]), str(record["task"]["split"]), int(record["task"]["index"])


def episode_record(episode, seed: int) -> dict[str, Any]:
    """One log line from an :class:`~agentrl.rollout.engine.EpisodeResult`."""
    score = episode.score if episode.score is not None else float(bool(episode.won))
    return {"seed": int(seed), "task": episode.task.to_dict(), "type": episode.task_type,
            "success": bool(episode.won), "reward": float(episode.episode_return), "score": float(score),
            "steps": int(episode.length), "invalid_actions": int(episode.invalid_actions),
            "env_error": episode.env_error, "transcript": episode.transcript}


class EpisodeLog:
    """Append-only JSONL of finished episodes, tolerant of a torn last line."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def load(self) -> list[dict[str, Any]]:
        """Every complete record; a torn tail is removed from the file."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        records, good_end, start = [], 0, 0
        while start < len(data):
            end = data.find(b"\n", start)
            if end < 0:
                break  # no newline: a write cut short
            line = data[start:end].strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    break  # a damaged line: it and everything after it are dropped
            good_end = start = end + 1
        if good_end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        return records

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records]
        if not lines:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
        return len(lines)


def _rates(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    n = len(records)
    return {"episodes": n,
            "success_rate": sum(bool(r["success"]) for r in records) / n,
            "mean_score": sum(float(r["score"]) for r in records) / n,
            "mean_reward": sum(float(r["reward"]) for r in records) / n,
            "mean_steps": sum(int(r["steps"]) for r in records) / n}


def _by_type(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r.get("type", "")), []).append(r)
    return {t: _rates(rs) for t, rs in sorted(groups.items())}


def summarize_records(records: Sequence[dict[str, Any]], *, env: str, split: str,
                      seeds: Sequence[int], expected_tasks: int) -> dict[str, Any]:
    """Overall and per-type success and score, the same per seed, and the spread over seeds."""
    per_seed = {}
    for seed in seeds:
        mine = [r for r in records if int(r["seed"]) == int(seed)]
        if mine:
            per_seed[str(seed)] = {**_rates(mine), "by_type": _by_type(mine)}
    summary: dict[str, Any] = {"env": env, "split": split, "seeds": [int(s) for s in seeds],
                               "tasks": expected_tasks, "complete": len(records) == expected_tasks * len(seeds)}
    if not records:
        return {**summary, "episodes": 0, "by_type": {}, "per_seed": {}}
    summary.update(_rates(records))
    summary["by_type"] = _by_type(records)
    summary["per_seed"] = per_seed
    if len(per_seed) > 1:
        spread = {}
        for key in ("success_rate", "mean_score"):
            stat = describe(s[key] for s in per_seed.values())
            spread[key] = {"mean": stat.mean, "std": stat.std, "ci95": list(stat.ci) if stat.ci else None}
        summary["over_seeds"] = spread
    return summary


def write_json_atomically(path: str | os.PathLike, data: Any) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


__all__ = ["EpisodeLog", "episode_key", "episode_record", "summarize_records", "write_json_atomically"]
