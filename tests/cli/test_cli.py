"""The agentrl CLI as a user runs it: a subprocess, exit codes, one-line errors."""

import subprocess
import sys

import pytest

from agentrl.cli.main import main


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli.main", *args], capture_output=True, text=True,
                          timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_help_lists_commands():
    code, out, _ = run_cli("--help")
    assert code == 0
    for command in ("recipes", "config", "train", "bench", "envs"):
        assert command in out


def test_recipes_lists_every_environment_estimator_and_size_with_descriptions(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(len(line.split(None, 1)) == 2 for line in lines)
    expected = {f"{env}_{estimator}_{size}" for env in ("alfworld", "webshop", "textcraft", "sokoban", "scienceworld")
                for estimator in ("grpo", "gigpo", "gagpo", "bipace") for size in ("tiny", "qwen1.5b", "qwen7b")}
    assert sorted(line.split()[0] for line in lines) == sorted(expected)        # 60: 5 x 4 x 3


def test_config_prints_resolved_yaml_with_override(capsys):
    import yaml

    assert main(["config", "recipe=alfworld_bipace_qwen7b", "learner.lr=2e-6"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["learner"]["lr"] == 2e-6 and cfg["algorithm"]["estimator"] == "bipace"
    assert cfg["model"]["name_or_path"] == "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("args, expected", [
    (("config", "recipe=alfworld_bipace_qwen7b", "learner.lrr=1"), "`learner.lrr`; did you mean `learner.lr`?"),
    (("config", "recipe=alfworld_bipace_qwn7b"), "alfworld_bipace_qwen7b"),
    (("config", "env.max_steps=0"), "`env.max_steps`"),
    (("config", "learner.lr"), "not key=value"),
    (("train", "recipe=nope_nope_nope"), "unknown recipe"),
    (("nonsense",), "invalid choice"),
    (("envs", "alfworld", "bench", "--split", "train", "--workers", "1", "2"), "run `agentrl bench alfworld-steps`"),
])
def test_bad_input_exits_2_with_one_line_and_no_traceback(args, expected):
    code, out, err = run_cli(*args)
    assert code == 2
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_config_keys_lists_every_field_with_help(capsys):
    assert main(["config", "--keys"]) == 0
    out = capsys.readouterr().out
    assert "learner.lr = 1e-06" in out and "# actor learning rate" in out
    assert "algorithm.bipace.pace = 'q' [q|first_token|action_tag|state_only]" in out
