"""Supervised warm start on the environments' expert demonstrations.

Each demonstration step becomes one example: the chat-rendered prompt (exactly what the rollout
shows the model) followed by the expert's well-formed response and the end-of-turn token; the
loss covers the response tokens only. Plain PyTorch on one process: the warm start is for tiny
models on CPU (a few million parameters); large models start from their instruct checkpoints.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from agentrl.data.demonstrations import (
    Demonstration, demonstration_env_kwargs, demonstration_split, expert_episodes, repeat_by_action)
from agentrl.envs import make_env
from agentrl.models import load_model, load_tokenizer
from agentrl.models.tokenizer import IM_END
from agentrl.rollout.prompts import render_chat

IGNORE_INDEX = -100


@dataclass
class SftExample:
    input_ids: list[int]
    labels: list[int]


def training_tasks(env_name: str, env_kwargs: dict, split: str, count: int, seed: int) -> list[int]:
    """``count`` task indices of ``split`` in a seeded order (all of them, repeated, if the split is smaller)."""
    size = make_env(env_name, **dict(env_kwargs)).split_sizes()[split]
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return [order[i % size] for i in range(count)]


def encode_demonstration(tokenizer, demo: Demonstration, max_prompt_tokens: int) -> SftExample:
    prompt_ids = tokenizer(render_chat(tokenizer, demo.prompt), add_special_tokens=False)["input_ids"]
    prompt_ids = prompt_ids[-max_prompt_tokens:]
    response_ids = tokenizer(demo.response + IM_END, add_special_tokens=False)["input_ids"]
    return SftExample(prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids)


def _batches(examples: list, batch_size: int, rng: random.Random) -> list[list]:
    """Length-bucketed batches (little padding), in random order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].input_ids), rng.random()))
    batches = [[examples[i] for i in order[s:s + batch_size]] for s in range(0, len(order), batch_size)]
    rng.shuffle(batches)
    return batches


def _collate(batch: list[SftExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded rows without an attention mask: under causal attention no real token sees the
    padding after it, and padded positions carry no label, so the mask would only cost time."""
    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
    return {"input_ids": ids, "labels": labels}


def _loss_on(model, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled tokens, projecting only those positions
    onto the vocabulary (the prompt positions, most of the tokens, skip the LM head)."""
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The SFT loss of a batch of plain examples from :func:`_collate`."""
    hidden = model.get_decoder()(input_ids=batch["input_ids"], use_cache=False).last_hidden_state
    return _loss_on(model, hidden, batch["labels"])


def _dagger_demonstrations(cfg, model_dir: str, split: str):
    """The starting model's greedy episodes on ``trainer.sft.dagger_tasks`` training tasks (the
    first ones of the SFT order), every state labelled by the env's expert (agentrl.data.dagger)."""
    from agentrl.data.dagger import policy_demonstrations

    sft, env = cfg.trainer.sft, cfg.env
    start = time.time()
    result = policy_demonstrations(
        env.name, demonstration_env_kwargs(cfg), split,
        training_tasks(env.name, env.kwargs, split, sft.dagger_tasks, cfg.trainer.seed), model_dir=model_dir,
        rollout_cfg=cfg.rollout, history_length=env.history_length, count_repeats=env.history_count_repeats,
        max_steps=env.max_steps, workers=sft.demonstration_workers)
    if not result.demonstrations:
        raise RuntimeError(f"the DAgger pass labelled no state of {result.episodes} {env.name} episodes")
    return result, (time.time() - start) / 60


def run_sft(cfg, model_dir: str, out_dir: str | Path, log: Callable[[dict], None] | None = None) -> dict:
    """Fine-tune ``model_dir`` on expert demonstrations; write the result to ``out_dir``.

    Returns a summary (examples, optimizer steps, final loss, minutes). ``log`` receives one dict
    per logged step (the trainer writes them to its metrics file).
    """
    sft, env = cfg.trainer.sft, cfg.env
    torch.manual_seed(cfg.trainer.seed)
    rng = random.Random(cfg.trainer.seed)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    model.train()
    split = demonstration_split(cfg)
    tasks = training_tasks(env.name, env.kwargs, split, sft.tasks, cfg.trainer.seed)
    demos = list(expert_episodes(env.name, demonstration_env_kwargs(cfg), split, tasks,
                                 history_length=env.history_length,
                                 think=cfg.rollout.enable_thinking, style=cfg.rollout.prompt_style,
                                 show_admissible=cfg.rollout.show_admissible,
                                 count_repeats=env.history_count_repeats,
                                 recovery_variants=sft.recovery_variants,
                                 workers=sft.demonstration_workers))
    if not demos:
        raise RuntimeError(f"the {env.name} expert produced no winning demonstration on split {split!r}")
    episodes, recovery_examples = sum(d.step == 0 for d in demos), sum(d.recovery for d in demos)
    dagger_summary = {}
    if sft.dagger_tasks > 0:
        dagger, minutes = _dagger_demonstrations(cfg, model_dir, split)
        demos += dagger.demonstrations
        dagger_summary = {**dagger.summary(), "dagger_minutes": minutes}
    played = len(demos)
    demos = repeat_by_action(demos, sft.action_repeats, env.name)
    examples = [encode_demonstration(tokenizer, d, cfg.rollout.max_prompt_tokens) for d in demos]
    steps_per_epoch = math.ceil(len(examples) / sft.batch_size)
    total_steps = max(1, int(steps_per_epoch * sft.epochs))
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    warmup = max(1, total_steps // 20)
    start, step, loss_ema = time.time(), 0, None
    budget_s = sft.max_minutes * 60 if sft.max_minutes > 0 else math.inf

    def progress() -> float:
        """How far through the run: by steps, or by the time budget when that ends first (the
        cosine decay then still reaches its end inside ``max_minutes``)."""
        return min(1.0, max(step / total_steps, (time.time() - start) / budget_s))

    tokens = sum(len(e.input_ids) for e in examples)
    while step < total_steps and time.time() - start < budget_s:
        for batch in _batches(examples, sft.batch_size, rng):
            if step >= total_steps or time.time() - start >= budget_s:
                break
            lr = sft.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress()))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_t = sft_loss(model, _collate(batch, tokenizer.pad_token_id))
            optimizer.zero_grad(set_to_none=True)
            loss_t.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            loss = loss_t.item()
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            if log and (step % 20 == 0 or step == total_steps):
                log({"sft/step": step, "sft/loss": loss, "sft/loss_ema": loss_ema, "sft/lr": lr,
                     "sft/elapsed_s": time.time() - start})
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    summary = {"examples": len(examples), "episodes": episodes, "recovery_examples": recovery_examples,
               "repeated_examples": len(demos) - played, **dagger_summary, "tokens": tokens,
               "steps": step, "planned_steps": total_steps, "final_loss_ema": loss_ema,
               "minutes": (time.time() - start) / 60}
    (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return summary
