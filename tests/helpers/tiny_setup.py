"""A tiny random Qwen2 model directory, a config and a step batch for the learner tests."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.config.schema import Config, TinyModelConfig
from agentrl.data import StepBatch
from agentrl.models import build_tiny_model, train_tokenizer
from agentrl.models.tokenizer import save_tokenizer

TEXTS = [
    "you are in the middle of a room. looking around you see a cabinet, a drawer and a countertop.",
    "your task is to: put a clean mug in the coffee machine.",
    "go to cabinet 1", "open drawer 2", "take mug 1 from countertop 1", "clean mug 1 with sinkbasin 1",
    "craft 4 oak planks using 1 oak log", "search[red running shoes]", "click[buy now]",
] * 4


def write_tiny_model(directory: Path, seed: int = 0) -> str:
    """Save a 2-layer, hidden-64 Qwen2 model with a tokenizer trained on a few strings."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=300)
    tiny = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                           max_position_embeddings=256)
    model = build_tiny_model(tiny, tokenizer, seed=seed)
    model.save_pretrained(str(directory))
    save_tokenizer(tokenizer, directory)
    return str(directory)


def learner_config(**learner) -> Config:
    cfg = Config()
    cfg.trainer.device = "cpu"
    cfg.trainer.seed = 3
    values = dict(lr=1e-3, mini_batch_size=6, micro_batch_size=2, ppo_epochs=1, kl_coef=0.05, entropy_coef=0.01,
                  zero_stage=2, grad_clip=1.0, warmup_steps=0)
    values.update(learner)
    for key, value in values.items():
        setattr(cfg.learner, key, value)
    return cfg


def step_batch(num_rows: int = 6, vocab: int = 300, seed: int = 0) -> StepBatch:
    """Rows with varied prompt and response lengths; one untrained token inside, one at the end."""
    g = torch.Generator().manual_seed(seed)
    records = []
    for i in range(num_rows):
        p_len = int(torch.randint(3, 12, (1,), generator=g))
        r_len = int(torch.randint(2, 7, (1,), generator=g))
        mask = [1.0] * r_len
        if r_len > 3:
            mask[1] = 0.0
            mask[-1] = 0.0
        records.append(dict(
            group_id=i // 3, traj_id=i, step=0, done=True, success=bool(i % 2), reward=float(i % 2),
            prompt_ids=torch.randint(10, vocab, (p_len,), generator=g).tolist(),
            response_ids=torch.randint(10, vocab, (r_len,), generator=g).tolist(),
            response_mask=mask, anchor_obs=f"obs {i}"))
    batch = StepBatch.from_records(records, pad_id=1)
    advantages = torch.linspace(-1.0, 1.0, num_rows)
    return batch.with_columns(advantages=advantages[torch.randperm(num_rows, generator=g)])
