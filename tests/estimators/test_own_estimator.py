"""Bring your own estimator: `agentrl train` with an estimator class from a module outside the
package (algorithm.estimator=package.module:ClassName, its keys under algorithm.params), and the
one-line errors for a bad import path, a class without the interface and an unknown parameter."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.models import prepare_initial_model
from agentrl.runs.tracking import read_metrics
from agentrl.warmstart.starting_policy import corpus_builder

TINY = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.intermediate_size=128",
        "model.tiny.num_heads=4", "model.tiny.num_kv_heads=2", "tokenizer.vocab_size=600", "tokenizer.corpus_tasks=40"]

# the user's module: an estimator with its own parameter, a shared key, a state, the hidden states
# of the last layer as row input and the action-level ratio as loss option
OWN_MODULE = '''
import dataclasses

import torch

from agentrl.estimators import Estimator, LossOptions, RowInputs, param, shared


@dataclasses.dataclass
class Seen:
    batches: int = 0

    def as_dict(self):
        return {"batches": self.batches}

    @classmethod
    def from_dict(cls, data):
        return cls(int(data["batches"]))


class MeanOfOthers(Estimator):
    """Each trajectory's return minus the mean return of the other trajectories of its group."""

    name = "mean_of_others"
    title = "Mean of others"
    State = Seen

    @dataclasses.dataclass(frozen=True)
    class Params:
        penalty_mode: str = shared("penalty_mode")
        scale: float = param(1.0, "multiplies every advantage", gt=0)
        layer: int = param(-1, "hidden_states entry the estimator reads")

    def row_inputs(self):
        return RowInputs(hidden_layer=self.params.layer)

    def loss_options(self):
        return LossOptions(action_level_ratio=True)

    def advantages(self, batch, state=None):
        assert batch.hidden is not None and batch.hidden.shape[0] == len(batch)
        state.batches += 1
        reward = batch.reward if self.params.penalty_mode == "in_reward" else batch.env_reward - batch.noop_penalty
        returns = {}
        for t, r in zip(batch.traj_id.tolist(), reward.tolist()):
            returns[t] = returns.get(t, 0.0) + r
        adv = []
        for g, t in zip(batch.group_id.tolist(), batch.traj_id.tolist()):
            others = [returns[u] for u, h in zip(batch.traj_id.tolist(), batch.group_id.tolist()) if h == g and u != t]
            others = list(dict.fromkeys(others)) if others else [returns[t]]
            adv.append(returns[t] - sum(others) / len(others))
        adv = torch.tensor(adv, dtype=torch.float32) * self.params.scale - batch.invalid_penalty
        return adv, {"batches_seen": float(state.batches), "scale": float(self.params.scale)}


class NoMethod(Estimator):
    name = "no_method"

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass
'''


@pytest.fixture(scope="module")
def own_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_code")
    (root / "my_estimators").mkdir()
    (root / "my_estimators" / "__init__.py").write_text("")
    (root / "my_estimators" / "others.py").write_text(textwrap.dedent(OWN_MODULE))
    return root


def run_cli(args, pythonpath: Path, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                            "LOCAL_RANK")}
    env.update(RAY_USAGE_STATS_ENABLED="0", WANDB_SILENT="true", OMP_NUM_THREADS="1", **(extra_env or {}),
               PYTHONPATH=os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, "-m", "agentrl.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.parametrize("override, message", [
    ("algorithm.estimator=my_estimators.nothing_here:Thing", "cannot import 'my_estimators.nothing_here'"),
    ("algorithm.estimator=my_estimators.others:Missing", "module 'my_estimators.others' has no 'Missing'"),
    ("algorithm.estimator=my_estimators.others:NoMethod", "does not define advantages"),
    ("algorithm.estimator=my_estimators.others:MeanOfOthers algorithm.params.scael=2",
     "unknown config key `algorithm.params.scael`"),
    ("algorithm.estimator=my_estimators.others:MeanOfOthers algorithm.params.scale=-1",
     "`algorithm.params.scale` = -1 is invalid: expected float > 0"),
])
def test_bad_estimator_exits_2_with_one_line(own_package, override, message):
    done = run_cli(["config", "recipe=textcraft_grpo_tiny", *override.split()], own_package)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_config_shows_an_own_estimators_parameters(own_package):
    done = run_cli(["config", "recipe=textcraft_grpo_tiny", "algorithm.estimator=my_estimators.others:MeanOfOthers",
                    "algorithm.params.scale=2"], own_package)
    assert done.returncode == 0, done.stderr
    assert "estimator: my_estimators.others:MeanOfOthers" in done.stdout and "scale: 2.0" in done.stdout


@pytest.mark.slow
def test_train_one_iteration_with_an_estimator_from_outside_the_package(tmp_path, own_package, ray_head):
    """The estimator runs in the driver (one learner rank, in the driver too); the rollout workers,
    on the session's Ray head, never import the user's module."""
    cfg = load_config("textcraft_grpo_tiny", TINY)
    start = prepare_initial_model(cfg.model, cfg.tokenizer, tmp_path / "init", corpus=corpus_builder(cfg), seed=0)
    out = tmp_path / "runs"
    done = run_cli(["train", "recipe=textcraft_grpo_tiny", *TINY, f"trainer.output_dir={out}", "trainer.run_name=own",
                    f"trainer.init_checkpoint={start}", "trainer.iterations=1", "trainer.eval_every=0",
                    "env.tasks_per_iteration=2", "env.group_size=2", "env.max_steps=3",
                    "rollout.max_response_tokens=8", "learner.mini_batch_size=8", "learner.micro_batch_size=8",
                    # a random policy never wins: the penalty gives the estimator something to tell apart
                    "rollout.invalid_action_penalty=0.1", "learner.skip_zero_advantage=false",
                    "logging.wandb.mode=disabled", "logging.tensorboard=false",
                    "algorithm.estimator=my_estimators.others:MeanOfOthers", "algorithm.params.scale=2"],
                   own_package, extra_env=ray_head)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run = out / "own"
    record = next(r for r in read_metrics(run / "metrics.jsonl") if r.get("step") == 1 and "learner/loss" in r)
    assert record["estimator/batches_seen"] == 1.0 and record["estimator/scale"] == 2.0
    assert record["learner/optimizer_steps"] >= 1
    state = json.loads((run / "checkpoints" / "iter_000001" / "trainer_state.json").read_text())
    assert state["estimator_state"] == {"batches": 1}       # the estimator's State, checkpointed
    assert (run / "final_model").is_dir()
