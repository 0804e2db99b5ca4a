"""Bring your own environment: a module outside agentrl (and outside envs/) named by import path,
``env.name=package.module:make_env`` (a bare factory) or ``package.module:SPEC`` (a declaration);
the one-line errors for a bad path, an object that is no environment and a spec failing its check;
and `agentrl train` of one iteration on it, with the env pool in Ray and through `agentrl envs serve`."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.envs import TaskRef, env_spec, make_env
from agentrl.envs.server import EnvPool
from agentrl.evaluation.results import env_columns
from agentrl.models import prepare_initial_model
from agentrl.plugins import PluginError
from agentrl.rollout.parsing import parse_response
from agentrl.rollout.prompts import History, build_prompt_text, task_text
from agentrl.runs.tracking import read_metrics
from agentrl.warmstart.starting_policy import corpus_builder

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]

# the user's module: a counter to bring to a target, then submit
OWN_MODULE = '''
from agentrl.envs.base import TaskRef, TextEnv
from agentrl.envs.spec import ActionSpec, EnvSpec, PromptSpec, ResultSpec


class Counter(TextEnv):
    name = "counter"

    def split_sizes(self):
        return {"train": 24, "test": 6}

    def _reset_task(self, task: TaskRef):
        self.target, self.count = 1 + task.index % 3, 0
        goal = f"bring the counter to {self.target}, then submit"
        return f"The counter shows 0. Goal: {goal}.", self._info(goal)

    def _info(self, goal=None):
        goal = goal or f"bring the counter to {self.target}, then submit"
        return {"admissible_actions": ["add", "submit"], "task": goal, "task_type": f"target{self.target}",
                "depth": self.target}

    def _step_text(self, action):
        if action == "add":
            self.count += 1
            return f"The counter shows {self.count}.", 0.0, False, self._info()
        if action == "submit":
            won = self.count == self.target
            return ("Correct." if won else "Wrong."), float(won), True, {**self._info(), "won": won}
        return "Nothing happens.", 0.0, False, {**self._info(), "noop": True}

    def expert_actions(self):
        return ["add"] * self.target + ["submit"]


def make_env(max_steps=8, **kwargs):
    return Counter(max_steps=max_steps)


SPEC = EnvSpec(name="counter", make_env=make_env, splits=("train", "test"),
               prompt=PromptSpec(preamble="You are an expert agent counting.", admissible_layout="lines"),
               actions=ActionSpec(lowercase=True, fallback_chars=10),
               results=ResultSpec(title="Counter (success %)"))
BAD_SPEC = EnvSpec(name="Bad Name", make_env=make_env, prompt=PromptSpec(admissible_layout="table"))
NOT_AN_ENV = 42
'''

# the tiny recipe's TextCraft pool splits are not the counter's
SPLITS = ["env.train_split=train", "env.eval_split=test"]


@pytest.fixture(scope="module")
def own_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_code")
    (root / "my_envs").mkdir()
    (root / "my_envs" / "__init__.py").write_text("")
    (root / "my_envs" / "counter.py").write_text(textwrap.dedent(OWN_MODULE))
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def child_env(pythonpath: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                                            "WORLD_SIZE", "LOCAL_RANK")}
    env.update(RAY_USAGE_STATS_ENABLED="0", WANDB_SILENT="true", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               **(extra or {}),
               PYTHONPATH=os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def run_cli(args, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli.main", *args], env=child_env(pythonpath),
                          capture_output=True, text=True, timeout=900)


def test_a_bare_factory_and_a_spec_are_environments(own_package):
    bare = env_spec("my_envs.counter:make_env")
    assert bare.name == "my_envs.counter:make_env" and bare.prompt.preamble == "You are an expert agent."
    env = make_env("my_envs.counter:SPEC", max_steps=5)
    obs, info = env.reset(TaskRef("train", 1))
    assert obs.startswith("The counter shows 0") and info["task_type"] == "target2"
    # the declaration reaches the shared prompt, parsing and results code
    text = build_prompt_text("my_envs.counter:SPEC", task_text("my_envs.counter:SPEC", obs, info), obs, History(),
                             info["admissible_actions"])
    assert text.startswith("You are an expert agent counting. Your task is to: bring the counter to 2")
    assert "[\n add\n submit\n]" in text
    assert parse_response("<action>ADD</action>", "my_envs.counter:SPEC").action == "add"
    assert parse_response("x" * 40, "my_envs.counter:SPEC").action == "x" * 10
    present = {"target10", "target2", "All", "Start"}
    assert env_columns("my_envs.counter:SPEC", present) == ("target2", "target10", "All")
    # and the pool the env servers serve
    pool = EnvPool("my_envs.counter:make_env", 2, env_kwargs={"max_steps": 4})
    try:
        status, body = pool.handle("reset", {"items": [{"instance_id": 0, "task": {"split": "test", "index": 0}}]})
        assert status == 200 and body["results"][0]["obs"].startswith("The counter shows 0"), body
    finally:
        pool.close()


@pytest.mark.parametrize("name, message", [
    ("my_envs.nothing_here:make_env", "cannot import 'my_envs.nothing_here'"),
    ("my_envs.counter:missing", "module 'my_envs.counter' has no 'missing'"),
    ("my_envs.counter:NOT_AN_ENV", "is a int, not an EnvSpec or a factory function"),
    ("my_envs.counter:BAD_SPEC", "name 'Bad Name' is not lower case letters"),
    ("my_envs.counter:BAD_SPEC", "prompt.admissible_layout 'table' is not one of quoted, lines"),
    ("textcraf", "did you mean textcraft?"),
])
def test_a_bad_environment_exits_2_with_one_line(own_package, name, message):
    with pytest.raises(PluginError, match="env.name"):
        env_spec(name)
    done = run_cli(["config", "recipe=textcraft_grpo_tiny", f"env.name={name}"], own_package)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def _train_args(tmp_path: Path, name: str, run: str, *extra: str) -> list[str]:
    cfg = load_config("textcraft_grpo_tiny", [*TINY, *SPLITS, f"env.name={name}"])
    start = tmp_path / "init"
    if not start.is_dir():
        prepare_initial_model(cfg.model, cfg.tokenizer, start, corpus=corpus_builder(cfg), seed=0)
    return ["train", "recipe=textcraft_grpo_tiny", *TINY, *SPLITS, f"env.name={name}",
            f"trainer.output_dir={tmp_path / 'runs'}", f"trainer.run_name={run}", f"trainer.init_checkpoint={start}",
            "trainer.iterations=1", "trainer.eval_every=0", "trainer.eval_before_train=false",
            "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=4", "rollout.max_response_tokens=8",
            "learner.mini_batch_size=8", "learner.micro_batch_size=8", "rollout.invalid_action_penalty=0.1",
            "learner.skip_zero_advantage=false", "logging.wandb.mode=disabled", "logging.tensorboard=false", *extra]


def _trained_one_iteration(run: Path) -> None:
    record = next(r for r in read_metrics(run / "metrics.jsonl") if r.get("step") == 1 and "learner/loss" in r)
    assert record["learner/optimizer_steps"] >= 1
    assert (run / "final_model").is_dir()


@pytest.mark.slow
def test_train_one_iteration_on_an_environment_from_outside_the_package(tmp_path, own_package):
    """The run starts its own Ray instance, whose workers inherit the command's PYTHONPATH: the env
    pool actors and rollout workers import the user's module there."""
    done = run_cli(_train_args(tmp_path, "my_envs.counter:make_env", "own"), own_package)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    _trained_one_iteration(tmp_path / "runs" / "own")


@pytest.mark.slow
def test_train_one_iteration_through_an_env_server_of_an_outside_environment(tmp_path, own_package):
    server = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "envs", "serve", "my_envs.counter:SPEC",
                               "--port", "0", "--size", "4", "--env-kwargs", '{"max_steps": 4}'],
                              env=child_env(own_package), start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        assert line.startswith("serving 4 x my_envs.counter:SPEC at http://127.0.0.1:"), line
        address = line.split(" at ")[1].split()[0]
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"{address}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        done = run_cli(_train_args(tmp_path, "my_envs.counter:SPEC", "served", f"env.server_url={address}"),
                       own_package)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        _trained_one_iteration(tmp_path / "runs" / "served")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        server.stderr.close()
