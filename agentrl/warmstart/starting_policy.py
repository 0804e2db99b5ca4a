"""The starting policy of a run.

* ``trainer.init_checkpoint``: that model directory (an exported policy or SFT model).
* ``model.name_or_path=tiny``: a tokenizer trained on the environment's expert episodes, a tiny
  Qwen2 model with random weights, then (``trainer.sft.enabled`` auto/yes) the SFT warm start on
  expert demonstrations, so RL starts from a policy that sometimes succeeds.
* otherwise the named checkpoint (or its architecture with random weights when
  ``model.random_init``), fine-tuned first only when ``trainer.sft.enabled=yes``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from agentrl.config import Config
from agentrl.errors import UsageError
from agentrl.models import is_model_dir, prepare_initial_model
from agentrl.models.loading import TINY
from agentrl.warmstart import cache
from agentrl.warmstart.demonstrations import corpus_texts, demonstration_env_kwargs, demonstration_split
from agentrl.warmstart.sft import run_sft


def corpus_builder(cfg: Config) -> Callable[[], list[str]]:
    def build() -> list[str]:
        return corpus_texts(cfg.env.name, demonstration_env_kwargs(cfg), demonstration_split(cfg),
                            cfg.tokenizer.corpus_tasks, history_length=cfg.env.history_length,
                            think=cfg.rollout.enable_thinking, style=cfg.rollout.prompt_style,
                            show_admissible=cfg.rollout.show_admissible,
                            count_repeats=cfg.env.history_count_repeats,
                            recovery_variants=cfg.trainer.sft.recovery.variants,
                            workers=cfg.trainer.sft.demonstration_workers)

    return build


def initial_model(cfg: Config, run, status: Callable[[str], None] | None = None) -> str:
    """The policy before any training, in ``<run>/init_model`` where it is made here (tiny: a tokenizer
    trained on the expert's text, then the model from its config)."""
    if status and cfg.model.name_or_path == TINY and not is_model_dir(run.path / "init_model"):
        status(f"init: a tokenizer trained on the expert's text of {cfg.tokenizer.corpus_tasks} {cfg.env.name} tasks, "
               "then the tiny model from its config")
    return prepare_initial_model(cfg.model, cfg.tokenizer, run.path / "init_model", corpus=corpus_builder(cfg),
                                 seed=cfg.trainer.seed)


def starting_policy(cfg: Config, run, log: Callable[[dict], None] | None = None,
                    status: Callable[[str], None] | None = None) -> str:
    """Return the model directory (or hub name) the learner and the rollout workers start from.

    ``log`` receives the SFT metrics (for the metrics file), ``status`` progress lines (for stderr)."""
    if cfg.trainer.init_checkpoint:
        if not is_model_dir(cfg.trainer.init_checkpoint):
            raise UsageError(f"trainer.init_checkpoint={cfg.trainer.init_checkpoint!r} is not a model directory "
                             "(no config.json); pass a directory written by `agentrl export` or `agentrl sft`")
        return cfg.trainer.init_checkpoint
    model = initial_model(cfg, run, status)
    sft = cfg.trainer.sft.enabled
    if sft == "yes" or (sft == "auto" and cfg.model.name_or_path == TINY):
        sft_dir = run.path / "sft_model"
        if is_model_dir(sft_dir):
            return str(sft_dir)
        return warm_start(cfg, model, sft_dir, log, status)
    return model


def warm_start(cfg: Config, model: str, sft_dir: Path, log: Callable[[dict], None] | None,
               status: Callable[[str], None] | None = None) -> str:
    """SFT ``model`` into ``sft_dir``, or copy the same warm start from ``trainer.sft.cache_dir``."""
    entry = cache.cache_entry(cfg)
    if entry is not None and is_model_dir(entry):
        cache.copy_model_dir(entry, sft_dir)
        if status:
            status(f"sft: warm start reused from trainer.sft.cache_dir ({entry})")
        if log:
            log({"sft/cache_hit": 1.0})
        return str(sft_dir)
    summary = run_sft(cfg, model, sft_dir, log=log, status=status)
    if log:
        log({f"sft/summary/{k}": v for k, v in summary.items()})
    if entry is not None:
        cache.store(cfg, entry, sft_dir)
    return str(sft_dir)
