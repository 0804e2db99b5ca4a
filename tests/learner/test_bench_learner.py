"""``agentrl bench learner`` times the real Learner on an iteration-sized batch at each precision."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

from agentrl.bench import learner as bench
from agentrl.bench._common import parse_target_args


def _args(*argv: str) -> argparse.Namespace:
    return parse_target_args(bench, argv)


def test_batch_has_the_asked_rows_and_lengths_and_trains_every_row():
    batch = bench.make_batch(200, 100, 8, 512, seed=3)
    assert len(batch) == 200 and batch.num_trajectories == 25 and batch.num_groups == 4
    prompts, responses = batch.prompt_lengths, batch.response_mask.sum(1)
    assert 75 <= int(prompts.min()) and int(prompts.max()) <= 125 and abs(float(prompts.float().mean()) - 100) < 5
    assert 4 <= int(responses.min()) and int(responses.max()) <= 12
    real = torch.arange(batch.prompt_ids.shape[1]) < prompts.unsqueeze(1)   # the rest is padding
    assert int(batch.prompt_ids[real].max()) < 512 - 3 and bool((batch.advantages != 0).all())
    assert torch.equal(bench.make_batch(200, 100, 8, 512, seed=3).prompt_ids, batch.prompt_ids)
    with pytest.raises(ValueError, match="--rows"):
        bench.make_batch(0, 100, 8, 512, seed=0)


def test_each_precision_runs_the_learner_and_reports_its_logprob_gap():
    report = bench._measure(_args("--rows", "8", "--prompt-tokens", "16", "--response-tokens", "4"))
    meta, rows = report["meta"], report["results"]
    assert list(rows) == ["fp32", "bf16"]
    assert meta["rows"] == 8 and meta["kl_coef"] == 0.1 and "4 layers" in meta["model"]
    for row in rows.values():
        assert row["learner_pass_s"] > 0 and row["update_s"] > 0 and row["tokens_per_s"] > 0
        assert row["optimizer_steps"] == 1 and row["total_s"] == row["learner_pass_s"] + row["update_s"]
    assert rows["fp32"]["speedup"] == 1.0 and "logprob_gap_mean" not in rows["fp32"]
    # the same weights scored in bf16: rounding, not a different model (random weights: near-uniform
    # log-probs of ~ -7.6, bf16 keeps ~3 significant digits)
    assert 0 < rows["bf16"]["logprob_gap_mean"] <= rows["bf16"]["logprob_gap_max"] < 0.1


def test_json_output_is_the_only_thing_on_stdout():
    # a fresh process group: not the address an in-process Learner of an earlier test put in os.environ
    rank_keys = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in rank_keys}
    out = subprocess.run([sys.executable, "-m", "agentrl.cli.main", "bench", "learner", "--json", "--rows", "8",
                          "--prompt-tokens", "16", "--response-tokens", "2", "--precisions", "fp32"],
                         capture_output=True, text=True, check=True, timeout=300, env=env)
    report = json.loads(out.stdout)
    assert list(report["results"]) == ["fp32"] and report["meta"]["rows"] == 8


def test_a_given_model_directory_is_timed_instead_of_random_weights(tmp_path):
    from types import SimpleNamespace

    from agentrl.models.architectures import build_tiny_model

    shape = SimpleNamespace(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                            max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True)
    build_tiny_model(shape, bench._Vocabulary(300), seed=1).save_pretrained(tmp_path)
    report = bench._measure(_args("--model", str(tmp_path), "--precisions", "fp32", "--rows", "8",
                                  "--prompt-tokens", "20", "--response-tokens", "3"))
    meta = report["meta"]
    assert meta["weights"] == str(tmp_path) and meta["model"].startswith("qwen2 hidden 64, 2 layers")
    assert meta["model"].endswith("vocab 300") and report["results"]["fp32"]["update_s"] > 0


def test_variants_run_side_by_side_with_the_same_logprobs_and_less_memory_in_chunks():
    # a vocabulary large enough that today's [rows x kept positions x V] float32 logits dominate a micro-batch
    report = bench._measure(_args("--rows", "8", "--warmup-rows", "4", "--prompt-range", "100-300", "--response-range",
                                  "2-6", "--variants", "today,all", "--precisions", "fp32", "--chunk-tokens", "16",
                                  "--set", "tokenizer.vocab_size=64000", "--set", "learner.micro_batch_size=4"))
    meta, rows = report["meta"], report["results"]
    assert list(rows) == ["today", "all"] and meta["model"].endswith("vocab 64000")
    assert "learner.logprob_chunk_tokens=0" in meta["settings"]["today"]
    assert {"learner.padding_free=true", "learner.logprob_chunk_tokens=16"} <= set(meta["settings"]["all"])
    budget = [s for s in meta["settings"]["all"] if s.startswith("learner.max_tokens_per_micro_batch=")]
    assert budget and int(budget[0].split("=")[1]) > 0         # micro-batch size x mean row length
    assert rows["all"]["logprob_gap_max"] < 1e-4                # the same numbers, another path
    for row in rows.values():
        assert row["tokens_per_s_all"] > 0 and row["update_peak_mb"] >= row["micro_peak_mb"] >= 0
    # today: 4 rows x up to ~200 kept positions x 64,000 x 4 bytes (~200 MB), several times; in chunks: 16 x 64,000
    assert rows["today"]["micro_peak_mb"] > 3 * rows["all"]["micro_peak_mb"]


def test_a_length_range_is_low_dash_high():
    assert bench._span("700-1800") == (700, 1800) and bench._span("") is None
    with pytest.raises(ValueError, match="LOW-HIGH"):
        bench._span("1800-700")
    batch = bench.make_batch(50, 1, 1, 512, seed=0, prompt_range=(7, 9), response_range=(2, 3))
    assert set(batch.prompt_lengths.tolist()) <= {7, 8, 9} and set(batch.response_mask.sum(1).int().tolist()) <= {2, 3}
