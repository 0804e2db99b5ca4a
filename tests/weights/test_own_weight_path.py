"""A weight path of one's own, defined here and named by import path (rollout.weight_sync=module:Class):
the real one-rank learner sends through it, real Ray rollout workers receive, and they then generate
with exactly the learner's weights. Nothing in agentrl/ names it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from agentrl.envs import TaskRef
from agentrl.errors import UsageError
from agentrl.learner.group import LearnerGroup
from agentrl.models import build_tiny_model, load_model, train_tokenizer
from agentrl.rollout.worker_group import RolloutWorkerGroup
from agentrl.training.weight_sync import weight_sync_for
from agentrl.weights import WeightPath
from rollout_helpers import TINY, check_logprobs_match, env_config, rollout_config
from tiny_setup import learner_config

pytestmark = pytest.mark.slow


class FileSync(WeightPath):
    """The learner's rank 0 writes a safetensors file; every worker reads it (workers on one filesystem)."""

    name = "file"
    preference = 50

    class Sender:
        def __init__(self, learner):
            self.learner = learner

        def write(self, path: str) -> None:
            weights = {name: value.to("cpu", copy=True).contiguous() for name, value in self.learner.rollout_weights()}
            if self.learner.is_main:
                save_file(weights, path)

    class Receiver:
        def __init__(self, worker):
            self.worker = worker
            self.loads = 0

        def read(self, path: str, version: int | None = None) -> int:
            self.worker.take_weights(load_file(path), version)
            self.loads += 1
            return self.loads

    @classmethod
    def refusal(cls, layout) -> str | None:
        return None if layout.device == "cpu" else "writes a file through host memory only on CPU (a test path)"

    def connect(self) -> None:
        self.directory = Path(self.learner.cfg.trainer.output_dir)

    def send(self, version: int) -> None:
        path = str(self.directory / f"weights-{version}.safetensors")
        self.learner.weights_call(self.Sender, "write", path)
        self.loads = self.rollout.wait(self.rollout.weights_call(self.Receiver, "read", path, version=version))


class NotAPath:
    name = "nope"


def model_dirs(root: Path) -> tuple[str, str]:
    """Two tiny models of one shape and tokenizer: the rollout starts from the first, the learner the second."""
    tokenizer = train_tokenizer(["craft 4 oak planks using 1 oak log", "get 1 oak log", "inventory"] * 8,
                                vocab_size=400)
    dirs = []
    for seed in (0, 7):
        out = root / f"model-{seed}"
        build_tiny_model(TINY, tokenizer, seed=seed).save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        dirs.append(str(out))
    return dirs[0], dirs[1]


def test_a_weight_path_of_ones_own_moves_the_learners_weights_into_every_worker(ray_cluster, tmp_path):
    ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rollout_dir, learner_dir = model_dirs(tmp_path)
    cfg = learner_config()
    cfg.rollout.weight_sync = f"{__name__}:FileSync"
    cfg.trainer.output_dir = str(tmp_path)
    learner = LearnerGroup(cfg, learner_dir)
    env_cfg = env_config("textcraft", max_steps=2, group_size=2, tasks_per_iteration=2)
    rollout_cfg = rollout_config(max_response_tokens=6, max_prompt_tokens=1024, prompt_truncation="left")
    try:
        with RolloutWorkerGroup(rollout_dir, rollout_cfg, env_cfg, num_workers=2, worker_num_cpus=0.5,
                                env_num_cpus=0.5) as workers:
            sync = weight_sync_for(cfg, learner, workers, "cpu")
            assert isinstance(sync, FileSync) and sync.during_rollout
            sync.connect()
            sync.push(3)
            assert sync.loads == [1, 1]                     # each worker built its receiver once and read once
            sync.push(4)
            assert sync.loads == [2, 2]                     # ... and kept it
            tasks = [TaskRef("depth2", 1), TaskRef("depth2", 2)]
            greedy = workers.run(tasks, group_size=2, sampling=workers.sampling_params(temperature=0.0))
            check_logprobs_match(load_model(learner_dir).eval(), greedy.batch, range(len(greedy.batch)))
            assert (greedy.batch.policy_version == 4).all()
    finally:
        learner.shutdown()


def test_a_bad_weight_path_is_refused_in_one_line():
    from agentrl.config import load_config

    with pytest.raises(UsageError, match="unknown weight path rollout.weight_sync='pakced'; did you mean packed"):
        load_config(None, ["rollout.weight_sync=pakced"])
    with pytest.raises(UsageError, match="is not a weight path: subclass agentrl.weights.WeightPath"):
        load_config(None, [f"rollout.weight_sync={__name__}:NotAPath"])
    with pytest.raises(UsageError, match="rollout.weight_sync=ipc needs the learner on GPUs"):
        weight_sync_for(load_config(None, ["rollout.weight_sync=ipc"]), learner=None, rollout=None, device="cpu")
