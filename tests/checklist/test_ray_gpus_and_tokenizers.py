"""Two fixes the GPU checklist asked for outside it: a local Ray node is told its GPUs where CUDA is
present (Ray's own detection can fail in a sandbox, and a one-GPU actor then waits forever), and a
model folder without tokenizer files has no tokenizer (transformers 5 hands back an empty one)."""

from __future__ import annotations

import json

import pytest
import ray
import torch

from agentrl.checklist.probes import PROBE_ARCHITECTURE, PROBE_CORPUS, write_probe_architecture
from agentrl.config.schema import ModelConfig, TokenizerConfig
from agentrl.errors import UsageError
from agentrl.models import load_tokenizer, prepare_initial_model
from agentrl.runtime import ray_start


@pytest.fixture
def ray_init_calls(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    return calls


def test_with_cuda_a_local_ray_node_is_given_the_gpus_and_the_cpus(monkeypatch, ray_init_calls):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ray_start.init_local_ray(6)
    assert ray_init_calls[-1]["num_gpus"] == 2 and ray_init_calls[-1]["num_cpus"] == 6
    ray_start.init_local_ray(3, num_gpus=1)                   # the caller's number wins
    assert ray_init_calls[-1]["num_gpus"] == 1


def test_without_cuda_no_gpus_are_claimed(monkeypatch, ray_init_calls):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ray_start.init_local_ray(2)
    assert "num_gpus" not in ray_init_calls[-1] and ray_init_calls[-1]["num_cpus"] == 2
    assert ray_start.local_gpus() == 0


def test_a_folder_without_tokenizer_files_has_no_tokenizer(tmp_path):
    folder = write_probe_architecture(tmp_path / "arch")              # config.json only
    with pytest.raises(UsageError, match="the folder has no tokenizer files"):
        load_tokenizer(folder)


def test_a_random_model_from_such_a_folder_gets_a_tokenizer_trained_on_the_corpus(tmp_path):
    folder = write_probe_architecture(tmp_path / "arch")
    model_dir = prepare_initial_model(ModelConfig(name_or_path=folder, random_init=True), TokenizerConfig(),
                                      tmp_path / "model", corpus=lambda: PROBE_CORPUS, seed=0)
    tokenizer = load_tokenizer(model_dir)
    assert len(tokenizer) > 100                     # transformers 5 alone would have given it one token
    ids = tokenizer("craft 1 stick using 2 oak planks").input_ids
    assert len(ids) > 2 and max(ids) < PROBE_ARCHITECTURE["vocab_size"]
    assert json.loads((tmp_path / "model" / "config.json").read_text())["vocab_size"] == PROBE_ARCHITECTURE["vocab_size"]
