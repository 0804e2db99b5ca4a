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

from agentrl.envs import make_env
from agentrl.models import load_model, load_tokenizer
from agentrl.models.tokenizer import IM_END
from agentrl.rollout.prompts import render_chat
from agentrl.warmstart.dagger import policy_demonstrations
from agentrl.warmstart.demonstrations import (Demonstration, demonstration_env_kwargs, demonstration_split,
                                              expert_episodes, repeat_by_action)

IGNORE_INDEX = -100
STATUS_EVERY_S = 60.0   # a progress line at most this often during a training phase (and at its end)


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
    """The greedy episodes of the model in ``model_dir`` on ``trainer.sft.dagger.tasks`` training tasks
    (the first ones of the SFT order), every state labelled by the env's expert (agentrl.warmstart.dagger)."""

    sft, env = cfg.trainer.sft, cfg.env
    start = time.time()
    result = policy_demonstrations(
        env.name, demonstration_env_kwargs(cfg), split,
        training_tasks(env.name, env.kwargs, split, sft.dagger.tasks, cfg.trainer.seed), model_dir=model_dir,
        rollout_cfg=cfg.rollout, history_length=env.history_length, count_repeats=env.history_count_repeats,
        max_steps=env.max_steps, workers=sft.demonstration_workers)
    if not result.demonstrations:
        raise RuntimeError(f"the DAgger pass labelled no state of {result.episodes} {env.name} episodes")
    return result, (time.time() - start) / 60


@dataclass
class _Phase:
    """What one training phase did: optimizer steps (planned and run), the loss EMA, minutes."""
    steps: int
    planned_steps: int
    loss_ema: float | None
    minutes: float


def _progress_line(name: str, step: int, total_steps: int, loss_ema: float, elapsed_s: float,
                   budget_s: float) -> str:
    left = min(elapsed_s / step * (total_steps - step) if step else 0.0, max(0.0, budget_s - elapsed_s))
    return (f"sft {name}: step {step}/{total_steps} ({100 * step / total_steps:.0f} %), loss {loss_ema:.3f}, "
            f"{elapsed_s / 60:.1f} min, ~{left / 60:.1f} min left")


def _train_phase(model, examples: list[SftExample], *, epochs: float, lr: float, batch_size: int,
                 max_minutes: float, pad_id: int, rng: random.Random, log: Callable[[dict], None] | None,
                 status: Callable[[str], None] | None = None, name: str = "expert epochs",
                 step_offset: int = 0) -> _Phase:
    """``epochs`` passes over ``examples`` with AdamW, a 5 % warmup and a cosine decay to 0 (by steps, or
    by ``max_minutes`` when that ends first, so the decay still reaches its end inside the bound).
    Logged steps count on from ``step_offset`` (a later phase continues the first one's numbering);
    ``status`` gets a progress line named ``name`` every ``STATUS_EVERY_S`` and at the phase's end."""
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    total_steps = max(1, int(steps_per_epoch * epochs))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, total_steps // 20)
    start, step, loss_ema = time.time(), 0, None
    if status:
        status(f"sft {name}: {len(examples)} examples x {epochs:g} epochs = {total_steps} steps of {batch_size}"
               + (f", at most {max_minutes:g} min" if max_minutes > 0 else ""))
    last_status = start
    budget_s = max_minutes * 60 if max_minutes > 0 else math.inf

    def progress() -> float:
        return min(1.0, max(step / total_steps, (time.time() - start) / budget_s))

    while step < total_steps and time.time() - start < budget_s:
        for batch in _batches(examples, batch_size, rng):
            if step >= total_steps or time.time() - start >= budget_s:
                break
            step_lr = lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress()))
            for group in optimizer.param_groups:
                group["lr"] = step_lr
            loss_t = sft_loss(model, _collate(batch, pad_id))
            optimizer.zero_grad(set_to_none=True)
            loss_t.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            loss = loss_t.item()
            loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
            if log and (step % 20 == 0 or step == total_steps):
                log({"sft/step": step_offset + step, "sft/loss": loss, "sft/loss_ema": loss_ema, "sft/lr": step_lr,
                     "sft/elapsed_s": time.time() - start})
            if status and time.time() - last_status >= STATUS_EVERY_S and step < total_steps:
                last_status = time.time()
                status(_progress_line(name, step, total_steps, loss_ema, last_status - start, budget_s))
    if status and step:
        status(_progress_line(name, step, total_steps, loss_ema, time.time() - start, budget_s)
               + (" (stopped by trainer.sft.max_minutes)" if step < total_steps else ""))
    return _Phase(step, total_steps, loss_ema, (time.time() - start) / 60)


def _save(model, tokenizer, directory: Path) -> None:
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))


def run_sft(cfg, model_dir: str, out_dir: str | Path, log: Callable[[dict], None] | None = None,
            status: Callable[[str], None] | None = None) -> dict:
    """Fine-tune ``model_dir`` on expert demonstrations; write the result to ``out_dir``.

    The phases, in order (docs/quickstart.md, SFT step; the keys are ``trainer.sft``'s):

    1. with ``dagger.tasks`` > 0 and ``dagger.rounds`` = 0, the starting model's DAgger pass, whose
       labelled states join the demonstrations;
    2. ``epochs`` over the demonstrations (``balance.action_repeats`` applied) at ``lr``;
    3. each of ``dagger.rounds``: the model trained so far plays ``dagger.tasks`` tasks, the expert
       labels the states, and ``dagger.epochs`` at ``dagger.lr`` go over the demonstrations and every
       round's labelled states.

    Returns a summary (examples, optimizer steps, final loss, minutes). ``log`` receives one dict
    per logged step (the trainer writes them to its metrics file); ``status`` one progress line per
    phase start, per minute of training and per phase end (the trainer prints them on stderr).
    """
    say = status or (lambda text: None)
    sft, env = cfg.trainer.sft, cfg.env
    torch.manual_seed(cfg.trainer.seed)
    rng = random.Random(cfg.trainer.seed)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, dtype=torch.float32)
    model.train()
    split = demonstration_split(cfg)
    tasks = training_tasks(env.name, env.kwargs, split, sft.tasks, cfg.trainer.seed)
    say(f"sft: the {env.name} expert plays {len(tasks)} {split} tasks for demonstrations")
    demos = list(expert_episodes(env.name, demonstration_env_kwargs(cfg), split, tasks,
                                 history_length=env.history_length,
                                 think=cfg.rollout.enable_thinking, style=cfg.rollout.prompt_style,
                                 show_admissible=cfg.rollout.show_admissible,
                                 count_repeats=env.history_count_repeats,
                                 recovery_variants=sft.recovery.variants,
                                 workers=sft.demonstration_workers))
    if not demos:
        raise RuntimeError(f"the {env.name} expert produced no winning demonstration on split {split!r}")
    episodes, recovery_examples = sum(d.step == 0 for d in demos), sum(d.recovery for d in demos)
    dagger_summary = {}
    say(f"sft: {episodes} winning expert episodes, {len(demos)} steps ({recovery_examples} recovery steps)")
    if sft.dagger.tasks > 0 and sft.dagger.rounds == 0:
        say(f"sft DAgger pass: the starting model plays {sft.dagger.tasks} tasks, the expert labels its states")
        dagger, minutes = _dagger_demonstrations(cfg, model_dir, split)
        say(f"sft DAgger pass: {len(dagger.demonstrations)} labelled states in {minutes:.1f} min")
        demos += dagger.demonstrations
        dagger_summary = {**dagger.summary(), "dagger_minutes": minutes}

    def encoded(played: list[Demonstration]) -> list[SftExample]:
        return [encode_demonstration(tokenizer, d, cfg.rollout.max_prompt_tokens)
                for d in repeat_by_action(played, sft.balance.action_repeats, env.name)]

    examples = encoded(demos)
    common = dict(pad_id=tokenizer.pad_token_id, rng=rng, log=log, status=status, batch_size=sft.batch_size,
                  max_minutes=sft.max_minutes)
    phases = [_train_phase(model, examples, epochs=sft.epochs, lr=sft.lr, **common)]
    summary = {"examples": len(examples), "episodes": episodes, "recovery_examples": recovery_examples,
               "repeated_examples": len(examples) - len(demos), **dagger_summary,
               "tokens": sum(len(e.input_ids) for e in examples)}
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    for round_ in range(1, sft.dagger.rounds + 1):
        _save(model, tokenizer, tmp)   # the model the round's pass plays
        say(f"sft DAgger round {round_}: the model plays {sft.dagger.tasks} tasks, the expert labels its states")
        dagger, minutes = _dagger_demonstrations(cfg, str(tmp), split)
        say(f"sft DAgger round {round_}: {len(dagger.demonstrations)} labelled states in {minutes:.1f} min")
        demos += dagger.demonstrations
        examples = encoded(demos)
        phases.append(_train_phase(model, examples, epochs=sft.dagger.epochs, lr=sft.dagger.lr, **common,
                                   name=f"DAgger round {round_}", step_offset=sum(p.steps for p in phases)))
        summary.update({f"{k}_round{round_}": v for k, v in dagger.summary().items()})
        summary.update({f"dagger_minutes_round{round_}": minutes, f"examples_round{round_}": len(examples),
                        f"steps_round{round_}": phases[-1].steps,
                        f"final_loss_ema_round{round_}": phases[-1].loss_ema})
    _save(model, tokenizer, tmp)
    summary.update({"steps": sum(p.steps for p in phases), "planned_steps": sum(p.planned_steps for p in phases),
                    "final_loss_ema": phases[-1].loss_ema, "minutes": sum(p.minutes for p in phases)})
    (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    loss = summary["final_loss_ema"]
    say(f"sft: done, {summary['steps']} steps in {summary['minutes']:.1f} min"
        + (f", loss {loss:.3f}" if loss is not None else "") + f" -> {out_dir}")
    return summary
