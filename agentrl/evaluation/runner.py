"""``agentrl eval``: play every task of a split with a trained policy, one JSONL line per episode.

    policy = resolve_policy(Path("runs/textcraft_gigpo_tiny-seed0"))   # a run dir or a model dir
    summary = evaluate(cfg, policy.model_dir, out_dir, split="depth2", seeds=[0, 1])

Episodes are rolled out by a :class:`~agentrl.rollout.workers.RolloutWorkerGroup` (with
``rollout.agent`` set, played by that outside agent through each worker's gateway, docs/agents.md) in
chunks of ``eval.chunk_size`` tasks; each finished chunk is appended to ``episodes.jsonl`` before the next
one starts, so a killed evaluation loses at most one chunk and a re-run plays only the episodes
that are not in the log yet. Chunk ``c`` of seed ``s`` always samples with the seed
``s * 1_000_003 + c``, whatever was already done.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agentrl.config import Config, load_config
from agentrl.config.schema import RolloutConfig
from agentrl.errors import UsageError
from agentrl.evaluation.episodes import (EpisodeLog, episode_key, episode_record, summarize_records,
                                         write_json_atomically)
from agentrl.generation import engine_gpus
from agentrl.learner.group import LearnerGroup
from agentrl.rollout.validation import eval_tasks
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.runs.directory import TrainerState
from agentrl.runs.task_schedule import TaskSchedule
from agentrl.runtime.ray_start import start_ray


@dataclass
class Policy:
    model_dir: Path           # a Hugging Face model directory
    run_dir: Path | None      # the run it belongs to, if any (its config.yaml configures the evaluation)
    source: str               # final_model, checkpoint iter_N, sft_model, or model directory


@dataclass
class TranscriptRolloutConfig(RolloutConfig):
    """The rollout settings with transcripts switched on or off (read by the rollout engine)."""

    record_transcripts: bool = True


def with_transcripts(rollout_cfg: RolloutConfig, on: bool) -> TranscriptRolloutConfig:
    values = {f.name: getattr(rollout_cfg, f.name) for f in dataclasses.fields(RolloutConfig)}
    return TranscriptRolloutConfig(**values, record_transcripts=bool(on))


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _export_checkpoint(run_dir: Path, checkpoint: Path, log: Callable[[str], None]) -> Path:
    """A learner checkpoint written once as a model directory under ``<run>/eval/``."""
    # absolute: the learner ranks (Ray actors) run in the directory of their node's `ray start`
    run_dir, checkpoint = run_dir.absolute(), checkpoint.absolute()
    out = run_dir / "eval" / f"policy_{checkpoint.name}"
    if _is_model_dir(out):
        return out
    cfg = load_config(str(run_dir / "config.yaml"))
    state = TrainerState.from_json((checkpoint / "trainer_state.json").read_text())
    log(f"exporting {checkpoint} to {out}")
    start_ray(cfg)
    learner = LearnerGroup(cfg, state.model_dir, shared_directory=str(run_dir))
    try:
        learner.load_checkpoint(str(checkpoint / "learner"))
        learner.export_hf(str(out))
    finally:
        learner.shutdown()
    return out


def resolve_policy(path: Path, log: Callable[[str], None] = print) -> Policy:
    """The policy a path names: a model directory as it is; a run directory's ``final_model``,
    else its newest checkpoint (exported once), else its ``sft_model``; a ``checkpoints/iter_N``."""
    path = path.expanduser()
    if not path.exists():
        raise UsageError(f"checkpoint={path} does not exist")
    if (path / "trainer_state.json").is_file():  # checkpoints/iter_N
        run_dir = path.parent.parent
        return Policy(_export_checkpoint(run_dir, path, log), run_dir, f"checkpoint {path.name}")
    if _is_model_dir(path):
        run_dir = path.parent if (path.parent / "config.yaml").is_file() else None
        return Policy(path, run_dir, path.name if run_dir else "model directory")
    if (path / "config.yaml").is_file():
        if _is_model_dir(path / "final_model"):
            return Policy(path / "final_model", path, "final_model")
        latest = path / "checkpoints" / "latest"
        if latest.is_file():
            checkpoint = path / "checkpoints" / latest.read_text().strip()
            return Policy(_export_checkpoint(path, checkpoint, log), path, f"checkpoint {checkpoint.name}")
        if _is_model_dir(path / "sft_model"):
            return Policy(path / "sft_model", path, "sft_model")
        raise UsageError(f"run directory {path} has no final_model, checkpoint or sft_model yet")
    raise UsageError(f"checkpoint={path} is neither a model directory (config.json) nor a run directory "
                     "(config.yaml)")


def default_output_dir(policy: Policy, env: str, split: str) -> Path:
    base = policy.run_dir if policy.run_dir is not None else policy.model_dir
    return base / "eval" / f"{env}_{split}"


def _device(cfg: Config) -> str:
    import torch

    if cfg.trainer.device == "cuda" or (cfg.trainer.device == "auto" and torch.cuda.is_available()):
        return "cuda"
    return "cpu"


def evaluate(cfg: Config, model_dir: Path, out_dir: Path, *, split: str, seeds: Sequence[int],
             log: Callable[[str], None] = print, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Evaluate ``model_dir`` on ``split`` once per seed; writes ``episodes.jsonl`` and
    ``summary.json`` under ``out_dir`` and returns the summary."""
    sizes = TaskSchedule.split_sizes(cfg.env)
    if split not in sizes:
        raise UsageError(f"split={split!r} is not a split of {cfg.env.name}; available: {', '.join(sorted(sizes))}")
    if not seeds:
        raise UsageError("evaluation needs at least one seed")
    tasks = eval_tasks(sizes, split, cfg.eval.num_tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    episodes = EpisodeLog(out_dir / "episodes.jsonl")
    done = {episode_key(r) for r in episodes.load()}
    chunk = cfg.eval.chunk_size
    work = []
    for seed in seeds:
        for c, start in enumerate(range(0, len(tasks), chunk)):
            todo = [t for t in tasks[start:start + chunk] if (int(seed), t.split, t.index) not in done]
            if todo:
                work.append((int(seed), c, todo))
    pending = sum(len(todo) for _, _, todo in work)
    log(f"{cfg.env.name} {split}: {len(tasks)} tasks x {len(seeds)} seed(s); {len(done)} episode(s) already in "
        f"{episodes.path}, {pending} to play")
    if work:
        _play(cfg, model_dir, work, episodes, log)
    wanted = {(int(s), t.split, t.index) for s in seeds for t in tasks}
    records = [r for r in episodes.load() if episode_key(r) in wanted]
    summary = summarize_records(records, env=cfg.env.name, split=split, seeds=seeds, expected_tasks=len(tasks))
    summary.update({"model_dir": str(model_dir), "temperature": cfg.eval.temperature, **(meta or {})})
    if cfg.rollout.agent:       # the episodes were played by an outside agent through the gateway
        summary["agent"] = cfg.rollout.agent
    write_json_atomically(out_dir / "summary.json", summary)
    return summary


def _play(cfg: Config, model_dir: Path, work: list[tuple[int, int, list]], episodes: EpisodeLog,
          log: Callable[[str], None]) -> None:
    start_ray(cfg)
    device = _device(cfg)
    largest = max(len(todo) for _, _, todo in work)
    num_envs = max(cfg.rollout.num_workers, min(largest, cfg.eval.chunk_size))
    group = RolloutWorkerGroup(str(model_dir), with_transcripts(cfg.rollout, cfg.eval.record_transcripts), cfg.env,
                               num_envs=num_envs, device=device,
                               dtype=cfg.model.dtype if device == "cuda" else "float32",
                               # an engine owns the GPUs its back end declares (vLLM: its tensor-parallel ranks')
                               num_gpus_per_worker=float(engine_gpus(cfg.rollout, device)))
    played = 0
    try:
        for seed, c, todo in work:
            sampling = group.sampling_params(temperature=cfg.eval.temperature, seed=seed)
            result = group.run(todo, 1, sampling=sampling, seed=seed * 1_000_003 + c)
            played += episodes.append(episode_record(e, seed) for e in result.episodes)
            wins = sum(e.won for e in result.episodes)
            log(f"seed {seed} chunk {c}: {wins}/{len(todo)} won ({played} played)")
    finally:
        group.close()


def summary_line(summary: dict[str, Any]) -> str:
    keys = ("env", "split", "episodes", "success_rate", "mean_score", "complete")
    return json.dumps({k: summary.get(k) for k in keys})


__all__ = ["Policy", "TranscriptRolloutConfig", "default_output_dir", "evaluate", "resolve_policy",
           "with_transcripts"]
