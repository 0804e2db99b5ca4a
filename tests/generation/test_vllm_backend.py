"""vLLM backend: log-probs equal the HF model's before and after load_weights, seeds, temperature.

Runs where vllm imports: .venv-vllm (scripts/setup_vllm_cpu.sh; the main test run starts it there
through test_vllm_venv.py) or a GPU box with vllm installed."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from rollout_helpers import TINY

REQUIRED = os.environ.get("AGENTRL_VLLM_REQUIRED") == "1"  # set by test_vllm_venv.py: never skip
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not REQUIRED,
                                reason="vllm is not importable in this interpreter; test_vllm_venv.py runs this "
                                       "file in .venv-vllm (build it: bash scripts/setup_vllm_cpu.sh)")


def _hf_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].float(), -1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_vllm_logprobs_match_hf_after_load_weights(tiny_model_dir, tiny_tokenizer):
    from agentrl.models import build_tiny_model, load_model, stop_token_ids
    from agentrl.generation import SamplingParams, make_backend

    backend = make_backend("vllm", tiny_model_dir, max_model_len=512)
    assert (0, 26) <= backend.version[:2] <= (0, 33)    # vllm_compat's tested range
    assert backend.sleep() == 0.0 and not backend.asleep   # sleep mode is GPU-only: nothing happens on CPU
    texts = ["Crafting commands:\ncraft 4 oak planks using 1 oak logs", "Goal: craft stick.", "Inventory: [oak planks] (4)"]
    prompts = [tiny_tokenizer(t)["input_ids"] for t in texts]
    greedy = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=tuple(stop_token_ids(tiny_tokenizer)))
    before = backend.generate(prompts, greedy)
    original = load_model(tiny_model_dir)
    for prompt, gen in zip(prompts, before):
        assert torch.allclose(_hf_logprobs(original, prompt, gen.token_ids), torch.tensor(gen.logprobs), atol=1e-4)

    other = build_tiny_model(TINY, tiny_tokenizer, seed=123).eval()
    backend.load_weights(other.state_dict())
    after = backend.generate(prompts, greedy)
    changed = False
    for prompt, old, gen in zip(prompts, before, after):
        reference = _hf_logprobs(other, prompt, gen.token_ids)
        assert torch.allclose(reference, torch.tensor(gen.logprobs), atol=1e-4)
        changed |= old.token_ids != gen.token_ids or not torch.allclose(
            torch.tensor(old.logprobs), torch.tensor(gen.logprobs), atol=1e-3)
    assert changed

    sampled = SamplingParams(max_tokens=10, temperature=0.8, seed=7, stop_token_ids=greedy.stop_token_ids)
    first, again = backend.generate(prompts, sampled), backend.generate(prompts, sampled)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    for prompt, gen in zip(prompts, first):  # log_softmax(logits / T) of the sampled token
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(other(ids).logits[0, len(prompt) - 1:-1].float() / 0.8, -1)
        reference = logp.gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(reference, torch.tensor(gen.logprobs), atol=1e-4)
    # vLLM exposes no intermediate layer: it declines to record hidden states, and the trainer's
    # BiPACE path then takes them from the learner's pass (docs/learner.md)
    assert not backend.record_hidden(1) and backend.prompt_hidden(prompts) is None
    assert all(g.hidden is None for g in first)
    backend.close()


def test_bench_replays_the_engines_calls_through_raw_vllm():
    """`agentrl bench rollout` measures the engine with vLLM against raw LLM.generate on the very same
    calls: the same steps, and (seeded) the same generated tokens."""
    from agentrl.bench import rollout as bench
    from agentrl.bench._common import parse_target_args

    report = bench._measure(parse_target_args(bench, ["--backends", "vllm", "--no-naive", "--tasks", "2",
                                                      "--group-size", "2", "--max-steps", "3"]))
    rows = report["results"]
    assert set(rows) == {"vllm", "vllm-raw"} and report["meta"]["device"] == "cpu"
    assert rows["vllm"]["env_steps"] == rows["vllm-raw"]["env_steps"] == 12
    assert rows["vllm"]["generated_tokens"] == rows["vllm-raw"]["generated_tokens"] > 0
    assert rows["vllm-raw"]["seconds"] > 0
    assert rows["vllm"]["engine_overhead_vs_raw"] == pytest.approx(
        rows["vllm"]["seconds"] / rows["vllm-raw"]["seconds"] - 1)

