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
    from agentrl.trainer import Trainer

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
