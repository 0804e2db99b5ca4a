"""trainer.sft.dagger.rounds: after the expert epochs, the model trained so far plays, the expert labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.config import load_config
from agentrl.errors import UsageError
from agentrl.models import load_model
from agentrl.runs.directory import RunDirectory
from agentrl.warmstart.cache import cache_key
from agentrl.warmstart.starting_policy import starting_policy

SMALL = ["trainer.sft.tasks=3", "trainer.sft.epochs=2", "trainer.sft.batch_size=4", "trainer.sft.max_minutes=0",
         "trainer.sft.demonstration_workers=1", "tokenizer.corpus_tasks=3", "env.max_steps=8",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.intermediate_size=64",
         "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "logging.wandb.mode=disabled"]


def _config(tmp_path, pool, *extra):
    return load_config("alfworld_grpo_tiny", [*SMALL, f"env.kwargs.data_dir={pool}",
                                              f"trainer.output_dir={tmp_path / 'runs'}", *extra])


def _weights(model_dir) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_model(str(model_dir), dtype=torch.float32).state_dict().items()}


def test_a_round_plays_the_model_after_the_expert_epochs_and_trains_on_its_labels(tmp_path, alfworld_search_games,
                                                                                  monkeypatch):
    import agentrl.warmstart.sft as sft_module

    played = []
    real = sft_module._dagger_demonstrations

    def spy(cfg, model_dir, split):
        played.append(_weights(model_dir))
        return real(cfg, model_dir, split)

    monkeypatch.setattr(sft_module, "_dagger_demonstrations", spy)
    monkeypatch.setattr(sft_module, "STATUS_EVERY_S", 0.0)   # a progress line after every step
    logged, lines = [], []
    cfg = _config(tmp_path, alfworld_search_games, "trainer.run_name=rounds", "trainer.sft.dagger.tasks=2",
                  "trainer.sft.dagger.rounds=1", "trainer.sft.dagger.epochs=1", "trainer.sft.dagger.lr=5e-4")
    run = RunDirectory.create(cfg, None)
    final = Path(starting_policy(cfg, run, log=logged.append, status=lines.append))
    summary = json.loads((final / "sft_summary.json").read_text())

    # the expert epochs alone, from the same initial model and seed
    plain_cfg = _config(tmp_path, alfworld_search_games, "trainer.run_name=plain", "trainer.sft.dagger.rounds=0",
                        "trainer.sft.dagger.tasks=0")
    plain = sft_module.run_sft(plain_cfg, str(run.path / "init_model"), tmp_path / "plain_model")
    assert len(played) == 1, "one round, one DAgger pass"
    after_expert_epochs = _weights(tmp_path / "plain_model")
    assert all(torch.equal(played[0][k], v) for k, v in after_expert_epochs.items()), \
        "the round's pass must play the model the expert epochs made, not the starting model"
    assert any(not torch.equal(v, after_expert_epochs[k]) for k, v in _weights(final).items()), \
        "the round's epoch must train the model further"

    assert summary["dagger_episodes_round1"] == 2 and summary["dagger_examples_round1"] >= 1
    assert "dagger_episodes" not in summary, "no pass before training when rounds are set"
    assert summary["examples"] == plain["examples"] and summary["examples_round1"] > summary["examples"]
    assert summary["steps"] == plain["steps"] + summary["steps_round1"]
    assert summary["steps_round1"] == -(-summary["examples_round1"] // 4)  # one epoch of batches of 4
    steps = [row["sft/step"] for row in logged if "sft/step" in row]
    assert steps == sorted(steps) and steps[-1] == summary["steps"], "a round's steps continue the numbering"
    assert not (run.path / "sft_model.partial").exists()
    _assert_progress_lines(lines, summary, plain, final)


def _assert_progress_lines(lines: list[str], summary: dict, plain: dict, final: Path) -> None:
    """What `agentrl train` prints on stderr while it makes the warm start, phase by phase."""
    assert lines[0] == ("init: a tokenizer trained on the expert's text of 3 alfworld tasks, "
                        "then the tiny model from its config")
    assert lines[1] == "sft: the alfworld expert plays 3 train tasks for demonstrations"
    assert lines[2].startswith("sft: ") and "winning expert episodes" in lines[2]
    expert_steps, round_steps = plain["steps"], summary["steps_round1"]
    assert lines[3] == f"sft expert epochs: {summary['examples']} examples x 2 epochs = {expert_steps} steps of 4"

    def steps_of(phase: str) -> list[int]:
        prefix = f"sft {phase}: step "
        return [int(line[len(prefix):].split("/")[0]) for line in lines if line.startswith(prefix)]

    assert steps_of("expert epochs") == list(range(1, expert_steps + 1)), "one line per step here, the last once"
    played = lines.index("sft DAgger round 1: the model plays 2 tasks, the expert labels its states")
    assert lines[played - 1].startswith(f"sft expert epochs: step {expert_steps}/{expert_steps} (100 %), loss ")
    assert lines[played + 1].startswith("sft DAgger round 1: ") and "labelled states in" in lines[played + 1]
    assert lines[played + 2] == (f"sft DAgger round 1: {summary['examples_round1']} examples x 1 epochs = "
                                 f"{round_steps} steps of 4")
    assert steps_of("DAgger round 1") == list(range(1, round_steps + 1))
    assert lines[-1].startswith(f"sft: done, {summary['steps']} steps in ") and lines[-1].endswith(f" -> {final}")


def test_rounds_without_tasks_stop_before_any_work(tmp_path, alfworld_search_games):
    with pytest.raises(UsageError, match="trainer.sft.dagger.tasks=N"):  # when the config loads: nothing has run
        _config(tmp_path, alfworld_search_games, "trainer.sft.dagger.rounds=1", "trainer.sft.dagger.tasks=0")
    assert not (tmp_path / "runs").exists()


def test_round_settings_enter_the_cache_key_only_with_rounds(tmp_path, alfworld_search_games):
    def key(*extra):
        return cache_key(_config(tmp_path, alfworld_search_games, "trainer.sft.dagger.rounds=0", *extra))

    base = key()
    assert key("trainer.sft.dagger.epochs=3") == base and key("trainer.sft.dagger.lr=1e-2") == base
    with_round = key("trainer.sft.dagger.rounds=1")
    assert with_round != base
    assert key("trainer.sft.dagger.rounds=1", "trainer.sft.dagger.epochs=3") != with_round
