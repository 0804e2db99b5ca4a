"""Progress lines on stderr while a tiny recipe makes its warm start (`agentrl sft`, `agentrl train`)."""

from __future__ import annotations

import json

import pytest

from agentrl.cli.main import main
from agentrl.config import load_config

SMALL_SFT = ["trainer.sft.tasks=4", "trainer.sft.epochs=1", "trainer.sft.batch_size=8", "trainer.sft.max_minutes=0",
             "tokenizer.corpus_tasks=8", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
             "model.tiny.intermediate_size=64", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
             "logging.wandb.mode=disabled", "logging.tensorboard=false"]


def test_agentrl_sft_prints_each_phase_and_the_result_on_stderr(tmp_path, capsys):
    assert main(["sft", "recipe=textcraft_grpo_tiny", *SMALL_SFT, f"trainer.output_dir={tmp_path}",
                 "trainer.run_name=warm"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out[captured.out.index("{"):])
    lines = [line for line in captured.err.splitlines() if line.startswith(("init:", "sft"))]
    assert lines.pop(0).startswith("init: a tokenizer trained on the expert's text of 8 textcraft tasks")
    assert lines[0] == "sft: the textcraft expert plays 4 pool_depth2 tasks for demonstrations"
    assert lines[2] == f"sft expert epochs: {summary['examples']} examples x 1 epochs = {summary['steps']} steps of 8"
    assert lines[3].startswith(f"sft expert epochs: step {summary['steps']}/{summary['steps']} (100 %), loss ")
    assert lines[-1].startswith(f"sft: done, {summary['steps']} steps") and lines[-1].endswith(summary["sft_model"])


@pytest.mark.parametrize("progress", [True, False])
def test_the_trainer_prints_the_warm_start_progress_unless_told_not_to(tmp_path, capsys, progress):
    from agentrl.training.trainer import Trainer

    def prepare(run_name: str) -> list[str]:
        cfg = load_config("textcraft_grpo_tiny", [*SMALL_SFT, f"trainer.output_dir={tmp_path}",
                                                  f"trainer.run_name={run_name}", f"logging.progress_bar={progress}",
                                                  f"trainer.sft.cache_dir={tmp_path / 'cache'}"])
        trainer = Trainer(cfg, None)
        try:
            trainer.prepare_policy()
        finally:
            trainer.tracker.close()
        return capsys.readouterr().err.splitlines()

    first, second = prepare("first"), prepare("second")
    if not progress:
        assert not [line for line in first + second if line.startswith(("init:", "sft"))]
        return
    assert first[0].startswith("init: a tokenizer trained on the expert's text of 8 textcraft tasks")
    assert first[-1].startswith("sft: done, ")
    assert [line for line in second if line.startswith("sft")] == \
        [f"sft: warm start reused from trainer.sft.cache_dir ({tmp_path / 'cache'}/"
         + next(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) + ")"]


class _Clock:
    """time.time() for agentrl.warmstart.sft that moves 10 s per call."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        self.now += 10.0
        return self.now


def test_progress_lines_come_once_a_minute_and_say_when_the_time_bound_stopped_the_phase(monkeypatch):
    import random

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import agentrl.warmstart.sft as sft_module
    from agentrl.warmstart.sft import IGNORE_INDEX, SftExample

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=True))
    examples = [SftExample(list(range(1, 7)), [IGNORE_INDEX] * 4 + [5, 6])] * 40
    monkeypatch.setattr(sft_module, "time", _Clock())
    lines = []
    phase = sft_module._train_phase(model, examples, epochs=1, lr=1e-3, batch_size=1, max_minutes=3, pad_id=0,
                                    rng=random.Random(0), log=None, status=lines.append)
    assert phase.planned_steps == 40 and 0 < phase.steps < 40, "the 3-minute bound ends the phase early"
    assert lines[0] == "sft expert epochs: 40 examples x 1 epochs = 40 steps of 1, at most 3 min"
    progress = lines[1:-1]
    assert progress and len(progress) < phase.steps, "not one line per step: one per minute of the clock"
    assert all(line.startswith("sft expert epochs: step ") for line in progress)
    left = [float(line.split("~")[1].split(" min left")[0]) for line in progress]
    assert all(0 < t <= 3 for t in left), "the time left counts the bound, not only the steps"
    assert lines[-1].startswith(f"sft expert epochs: step {phase.steps}/40 (")
    assert lines[-1].endswith("(stopped by trainer.sft.max_minutes)")
