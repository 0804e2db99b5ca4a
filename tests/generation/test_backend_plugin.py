"""A back end of one's own, defined in this file and named by import path (rollout.backend=module:Class,
its settings under rollout.backend_params): the config checks its settings, `agentrl plan` plans with
its GPUs per engine and its memory estimate (and refuses with its own check), a rollout worker builds
it and plays real TextCraft episodes with it, and a bad setting is one line. Nothing in agentrl/ names
it."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import pytest
import torch

from agentrl.cli.main import main
from agentrl.config import load_config
from agentrl.envs import TaskRef
from agentrl.envs.server.http_server import ShardedHTTPServer
from agentrl.errors import UsageError
from agentrl.generation import (GB, EngineMemory, Generation, GenerationBackend, MemoryInputs, SamplingParams,
                                make_backend, setting)
from agentrl.models import load_tokenizer, stop_token_ids
from agentrl.placement import plan_placement
from agentrl.rollout.engine import make_sampling_params
from agentrl.rollout.prompts import format_response
from agentrl.rollout.workers import RolloutWorker


@dataclasses.dataclass
class ScriptedSettings:
    action: str = setting("inventory", "the action every response takes")
    logprob: float = setting(-0.5, "the log-prob reported for every token", max=0)
    engine_gpus: int = setting(1, "GPUs one engine takes", min=1)
    working_gb: float = setting(2.0, "GB one engine takes beyond its share of the weights", min=0)


class ScriptedBackend(GenerationBackend):
    """Test only: every response is the same well-formed action, every token's log-prob the configured one."""

    name = "scripted"
    title = "scripted"
    Settings = ScriptedSettings
    engine_gpus_setting = "engine_gpus"
    weight_paths = ("packed",)

    def __init__(self, tokenizer, settings: ScriptedSettings):
        self.settings = settings
        self.reply = list(tokenizer(format_response(settings.action, "scripted"), add_special_tokens=False)["input_ids"])
        self.loaded = 0

    @classmethod
    def build(cls, model_dir, settings, *, device, dtype, max_model_len, seed) -> "ScriptedBackend":
        return cls(load_tokenizer(model_dir), settings)

    @classmethod
    def memory(cls, settings: ScriptedSettings, inputs: MemoryInputs) -> EngineMemory:
        weights = inputs.weight_bytes / settings.engine_gpus / GB
        return EngineMemory(budget=weights + settings.working_gb, weights=weights, asleep=weights + settings.working_gb,
                            backend=cls.name, engine="scripted engine",
                            text=f"scripted: weights {weights:.1f} + working memory {settings.working_gb:.1f}")

    @classmethod
    def memory_problem(cls, memory, settings, inputs):
        if memory.budget <= inputs.gpu_memory_gb / 2:
            return None
        return (f"the scripted engine takes {memory.budget:.1f} GB, more than half of a {inputs.gpu_memory_gb:g} GB GPU",
                "lower rollout.backend_params.working_gb")

    def generate(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        tokens = (self.reply + [sampling.stop_token_ids[0]])[:sampling.max_tokens]
        reason = "stop" if tokens[-1] == sampling.stop_token_ids[0] else "length"
        return [Generation(list(tokens), [self.settings.logprob] * len(tokens), reason) for _ in prompt_ids]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self.loaded += 1


SPEC = f"rollout.backend={__name__}:ScriptedBackend"
SEVEN_B = "alfworld_bipace_qwen7b"
P7 = 7_615_616_512


def test_its_settings_are_checked_and_coerced_when_the_config_loads():
    cfg = load_config(None, [SPEC, "rollout.backend_params.logprob=-1", "rollout.backend_params.engine_gpus=2"])
    assert cfg.rollout.backend_params == {"logprob": -1.0, "engine_gpus": 2}
    assert isinstance(cfg.rollout.backend_params["logprob"], float)
    for overrides, message in [
        (["rollout.backend_params.logprb=-1"], r"unknown config key `rollout.backend_params.logprb` .*; did you mean "
                                               r"`rollout.backend_params.logprob`\?"),
        (["rollout.backend_params.logprob=0.5"], r"`rollout.backend_params.logprob` = 0.5 is invalid: expected"),
        (["rollout.weight_sync=broadcast"], r"rollout.weight_sync=broadcast: the scripted back end receives weights "
                                            r"only by packed"),
    ]:
        with pytest.raises(UsageError, match=message):
            load_config(None, [SPEC, *overrides])
    with pytest.raises(UsageError, match=r"rollout.backend_params is for a back end loaded by import path; "
                                         r"rollout.backend=vllm reads rollout.vllm.<key>"):
        load_config(None, ["rollout.backend=vllm", "rollout.backend_params.logprob=-1"])


def test_agentrl_plan_uses_its_gpus_per_engine_and_its_memory_estimate(capsys):
    code = main(["plan", f"recipe={SEVEN_B}", SPEC, "rollout.backend_params.engine_gpus=2",
                 "rollout.backend_params.working_gb=5", "placement.nodes=1", "placement.gpus_per_node=8"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    engine_gb = 2 * P7 / 2 / 1e9 + 5                                  # bf16 weights over 2 GPUs + 5 GB: 12.6
    assert lines[0] == f"{SEVEN_B} on 1 node x 8 GPUs of 80 GB: split layout, 6 of 8 GPUs used"
    assert "ZeRO-3; rollout 1 scripted engine(s) x 2 GPU(s)" in lines[1]
    assert f"  GPU 5  rollout engine 0 [2/2]                       {engine_gb:4.1f} GB" in lines
    assert "  engine GPU: scripted: weights 7.6 + working memory 5.0" in lines
    assert "1 x {GPU: 2, CPU: 1} rollout engine" in lines[-2]
    # colocated: the learner's phase adds what the engine keeps (it never sleeps)
    cfg = load_config(SEVEN_B, [SPEC, "rollout.backend_params.engine_gpus=4", "placement.layout=colocated",
                                "learner.micro_batch_size=2"])
    plan = plan_placement(cfg, 1, 8)
    assert plan.rollout.budget == pytest.approx(2 * P7 / 4 / 1e9 + 2.0)
    assert plan.gpu(0, 0).memory_gb == pytest.approx(plan.learner.peak + plan.rollout.budget)


def test_its_own_memory_check_refuses_the_plan_in_one_line(capsys):
    code = main(["plan", f"recipe={SEVEN_B}", SPEC, "rollout.backend_params.working_gb=50", "placement.nodes=1",
                 "placement.gpus_per_node=8"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == ["agentrl: error: the scripted engine takes 65.2 GB, more than half of a 80 GB GPU; "
                                "lower rollout.backend_params.working_gb"]


def test_a_fixed_engine_size_is_named_by_its_back_end():
    """A back end without a setting for its GPUs: the refusal names rollout.backend, not a key it lacks."""
    with pytest.raises(UsageError, match=r"^a rollout engine of rollout.backend=.*:WideBackend needs 4 GPUs on one "
                                         r"node and the nodes have at most 2 .*; add GPUs to a node or choose another "
                                         r"rollout.backend$"):
        plan_placement(load_config(SEVEN_B, [f"rollout.backend={__name__}:WideBackend"]), 2, 2)


class WideBackend(ScriptedBackend):
    name = "wide"
    engine_gpus_setting = None

    @classmethod
    def engine_gpus(cls, settings) -> int:
        return 4


def test_a_rollout_worker_builds_it_and_plays_textcraft_with_it(tiny_model_dir, tiny_tokenizer):
    cfg = load_config(None, [SPEC, "rollout.backend_params.logprob=-0.25", "rollout.prompt_style=compact",
                             "rollout.max_response_tokens=64", "env.max_steps=2"])
    server = ShardedHTTPServer("textcraft", 4)
    server.start_background()
    try:
        worker = RolloutWorker(tiny_model_dir, cfg.rollout, cfg.env, f"http://127.0.0.1:{server.port}", range(4))
        assert isinstance(worker.backend, ScriptedBackend) and worker.backend.settings.logprob == -0.25
        sampling = make_sampling_params(cfg.rollout, stop_token_ids(tiny_tokenizer))
        result = worker.run([TaskRef("depth2", 0), TaskRef("depth2", 1)], 2, [0, 1], 0, sampling, seed=3)
    finally:
        server.close()
    batch = result.batch
    assert len(result.episodes) == 4 and len(batch) == 8                 # 2 tasks x 2 episodes x 2 steps
    assert set(batch.action) == {"inventory"} and bool(batch.action_valid.all())
    mask = batch.response_mask.bool()
    assert torch.all(batch.rollout_logprobs[mask] == -0.25)
    reply = worker.backend.reply + [stop_token_ids(tiny_tokenizer)[0]]
    assert batch.response_ids[0, :len(reply)].tolist() == reply


def test_make_backend_builds_it_with_its_settings_from_the_config(tiny_model_dir):
    cfg = load_config(None, [SPEC, "rollout.backend_params.action=look"])
    backend = make_backend(cfg.rollout.backend, tiny_model_dir, cfg.rollout)
    assert isinstance(backend, ScriptedBackend) and backend.settings == ScriptedSettings(action="look")
