"""Reuse of SFT warm starts across runs (``trainer.sft.cache_dir``).

A tiny recipe's warm start (trained tokenizer, seeded random initialisation, SFT on the expert's
demonstrations) depends only on the model, tokenizer, environment and prompt settings, the SFT
settings and the seed: not on the estimator, the RL learning rate or the rollout temperature. A
sweep of four estimators x three seeds therefore needs three warm starts, not twelve. The cache
keys each warm start by a hash of exactly those settings plus the agentrl version, and stores
the finished ``sft_model`` directory under ``<cache_dir>/<key>``. The techniques' settings
(``trainer.sft.dagger.tasks`` ...) enter the key under the flat names they had before each
technique had its section (``dagger_tasks``), so warm starts cached then are still found.

Only step-bounded SFT is cached: with ``trainer.sft.max_minutes > 0`` the number of steps
depends on the machine's speed and load, so two runs with the same settings would differ.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path

import agentrl
from agentrl.config import Config
from agentrl.config.sft_options import TECHNIQUES
from agentrl.warmstart.demonstrations import demonstration_split

# the environment and rollout settings that shape the demonstrations, prompts and tokenizer corpus
ENV_KEYS = ("name", "max_steps", "train_split", "history_length", "history_count_repeats", "kwargs")
ROLLOUT_KEYS = ("max_prompt_tokens", "prompt_truncation", "enable_thinking", "show_admissible", "prompt_style")
# trainer.sft settings that say where, whether or how fast SFT runs, not what it trains: the same warm
# start is found through "runs/cache", "./runs/cache" or an absolute path, with enabled=auto or true and
# with any number of demonstration workers; the split is keyed as env.train_split, the split the
# demonstrations come from
SFT_KEYS_NOT_IN_KEY = ("cache_dir", "enabled", "split", "demonstration_workers")
# the techniques' settings (trainer.sft.<technique>.<key>) under the names they had when they were
# trainer.sft.<name>, so keys made then stay the same; a setting not listed is keyed as "<technique>.<key>"
FLAT_NAMES = {"dagger.tasks": "dagger_tasks", "dagger.rounds": "dagger_rounds", "dagger.epochs": "dagger_epochs",
              "dagger.lr": "dagger_lr", "recovery.variants": "recovery_variants",
              "balance.action_repeats": "action_repeats"}


def _flat_sft_settings(cfg: Config) -> dict:
    """``trainer.sft``'s settings that shape the warm start, one flat dict: the general keys, then
    each technique's keys under their :data:`FLAT_NAMES`."""

    sft = dataclasses.asdict(cfg.trainer.sft)
    flat = {k: v for k, v in sft.items() if k not in SFT_KEYS_NOT_IN_KEY and k not in TECHNIQUES}
    for technique in TECHNIQUES:
        for key, value in sft[technique].items():
            flat[FLAT_NAMES.get(f"{technique}.{key}", f"{technique}.{key}")] = value
    return flat


def warm_start_settings(cfg: Config) -> dict:
    """Every setting the warm start depends on, as plain data. The split recorded is the one the
    demonstrations come from (``trainer.sft.split`` or ``env.train_split``), so a run doing RL on
    another split finds the warm start of a run that trained on the demonstration split, and
    keys made before ``trainer.sft.split`` existed stay the same."""

    env = dataclasses.asdict(cfg.env)
    env["train_split"] = demonstration_split(cfg)
    rollout = dataclasses.asdict(cfg.rollout)
    sft = _flat_sft_settings(cfg)
    for option in ("action_repeats", "dagger_tasks", "dagger_rounds"):  # keys made before an option existed
        if not sft[option]:                                                  # stay the same
            del sft[option]
    if "dagger_rounds" not in sft:  # the rounds' epochs and learning rate train nothing then
        del sft["dagger_epochs"], sft["dagger_lr"]
    return {"agentrl": agentrl.__version__, "model": dataclasses.asdict(cfg.model),
            "tokenizer": dataclasses.asdict(cfg.tokenizer), "env": {k: env[k] for k in ENV_KEYS},
            "rollout": {k: rollout[k] for k in ROLLOUT_KEYS}, "sft": sft,
            "seed": cfg.trainer.seed}


def cache_key(cfg: Config) -> str:
    text = json.dumps(warm_start_settings(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cache_entry(cfg: Config) -> Path | None:
    """The cache directory for this configuration's warm start, or None when caching is off or the
    warm start is bounded by time (not reproducible)."""
    sft = cfg.trainer.sft
    if not sft.cache_dir or sft.max_minutes > 0:
        return None
    return Path(sft.cache_dir).expanduser() / cache_key(cfg)


def copy_model_dir(src: Path, dst: Path) -> None:
    """Copy a model directory so that ``dst`` appears complete or not at all (copy, then rename).
    When another process published ``dst`` first, its copy is kept."""
    tmp = dst.with_name(f"{dst.name}.partial-{uuid.uuid4().hex[:8]}")
    shutil.copytree(src, tmp)
    try:
        os.rename(tmp, dst)
    except OSError:
        if not (dst / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def store(cfg: Config, entry: Path, sft_dir: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    copy_model_dir(sft_dir, entry)
    settings = entry / "warm_start_settings.json"
    if not settings.exists():
        settings.write_text(json.dumps(warm_start_settings(cfg), indent=2, sort_keys=True, default=str))


__all__ = ["cache_entry", "cache_key", "copy_model_dir", "store", "warm_start_settings"]
