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

from agentrl.data.demonstrations import Demonstration, expert_episodes
from agentrl.envs import make_env
from agentrl.models import load_model, load_tokenizer
from agentrl.models.tokenizer import IM_END
from agentrl.rollout.prompts import render_chat

IGNORE_INDEX = -100


@dataclass
class SftExample:
    input_ids: list[int]
    labels: list[int]


@dataclass
class PackedEpisode:
    """The steps of one demonstration episode in one row: their shared prompt beginning once, then
    each step's rest of prompt + response. Each step attends to the shared part and to itself only,
    with the positions it would have alone, so the loss equals the per-step examples' loss while
    the shared tokens (the task text: most of a TextCraft prompt) are computed once per episode."""

    input_ids: list[int]
    labels: list[int]
    position_ids: list[int]
    segments: list[int]   # 0 for the shared part, i + 1 for step i's tokens
    prefix_len: int


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


def _common_prefix(rows: list[list[int]]) -> int:
    n = min(len(r) for r in rows)
    for i in range(n):
        token = rows[0][i]
        if any(r[i] != token for r in rows):
            return i
    return n


def pack_episode(examples: list[SftExample]) -> PackedEpisode:
    """One row for the steps of an episode (see :class:`PackedEpisode`)."""
    prompts = [[t for t, l in zip(e.input_ids, e.labels) if l == IGNORE_INDEX] for e in examples]
    # keep at least one prompt token per step, so every step's first response token has a predictor
    p = min(_common_prefix(prompts), min(len(x) for x in prompts) - 1)
    ids, labels = list(examples[0].input_ids[:p]), [IGNORE_INDEX] * p
    positions, segments = list(range(p)), [0] * p
    for i, e in enumerate(examples):
        rest = len(e.input_ids) - p
        ids += e.input_ids[p:]
        labels += e.labels[p:]
        positions += range(p, p + rest)
        segments += [i + 1] * rest
    return PackedEpisode(ids, labels, positions, segments, p)


def group_episodes(demos: list[Demonstration], examples: list[SftExample]) -> list[list[SftExample]]:
    """Consecutive steps of one played episode (a new episode starts at step 0)."""
    episodes: list[list[SftExample]] = []
    for demo, example in zip(demos, examples):
        if demo.step == 0 or not episodes:
            episodes.append([])
        episodes[-1].append(example)
    return episodes


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


def _collate_packed(batch: list[PackedEpisode], pad_id: int) -> dict[str, torch.Tensor]:
    """Packed episodes, right-padded, with a boolean (B, 1, T, T) mask: token j is visible from
    token i when j <= i and j is in the shared part or in i's own step (padding sees itself)."""
    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((len(batch), width), dtype=torch.long)
    segments = torch.full((len(batch), width), -1, dtype=torch.long)
    for i, e in enumerate(batch):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        positions[i, :n] = torch.tensor(e.position_ids)
        segments[i, :n] = torch.tensor(e.segments)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    seg_i, seg_j = segments[:, :, None], segments[:, None, :]
    visible = (seg_j == 0) | (seg_i == seg_j)
    mask = causal[None] & visible
    mask |= torch.eye(width, dtype=torch.bool)[None]
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": mask[:, None]}


def sft_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled tokens, projecting only those positions
    onto the vocabulary (the prompt positions, most of the tokens, skip the LM head)."""
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = model.get_decoder()(**inputs, use_cache=False).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE_INDEX
    logits = model.get_output_embeddings()(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


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
    tasks = training_tasks(env.name, env.kwargs, env.train_split, sft.tasks, cfg.trainer.seed)
    demos = list(expert_episodes(env.name, env.kwargs, env.train_split, tasks, history_length=env.history_length,
                                 think=cfg.rollout.enable_thinking, style=cfg.rollout.prompt_style,
                                 show_admissible=cfg.rollout.show_admissible))
    if not demos:
        raise RuntimeError(f"the {env.name} expert produced no winning demonstration on split {env.train_split!r}")
    examples = [encode_demonstration(tokenizer, d, cfg.rollout.max_prompt_tokens) for d in demos]
    packed = [pack_episode(e) for e in group_episodes(demos, examples)]
    # batch_size counts steps (examples); a batch holds that many steps' worth of whole episodes
    episodes_per_batch = max(1, round(sft.batch_size * len(packed) / len(examples)))
    steps_per_epoch = math.ceil(len(packed) / episodes_per_batch)
    total_steps = max(1, int(steps_per_epoch * sft.epochs))
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, weight_decay=0.0)
    warmup = max(1, total_steps // 20)
    start, step, loss_ema = time.time(), 0, None
    budget_s = sft.max_minutes * 60 if sft.max_minutes > 0 else math.inf

    def progress() -> float:
        """How far through the run: by steps, or by the time budget when that ends first (the
        cosine decay then still reaches its end inside ``max_minutes``)."""
        return min(1.0, max(step / total_steps, (time.time() - start) / budget_s))

    prompt_tokens = sum(len(e.input_ids) for e in examples)
    packed_tokens = sum(len(e.input_ids) for e in packed)
    while step < total_steps and time.time() - start < budget_s:
        for batch in _batches(packed, episodes_per_batch, rng):
            if step >= total_steps or time.time() - start >= budget_s:
                break
            lr = sft.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress()))
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_t = sft_loss(model, _collate_packed(batch, tokenizer.pad_token_id))
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
    summary = {"examples": len(examples), "episodes": len(packed), "tokens": prompt_tokens,
               "packed_tokens": packed_tokens, "steps": step, "planned_steps": total_steps, "final_loss_ema": loss_ema,
               "minutes": (time.time() - start) / 60}
    (tmp / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return summary
