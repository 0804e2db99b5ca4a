"""The back end registry: the built-in back ends and what they declare, what `rollout.backend=auto`
picks, the rollout config section generated from their settings, one-line errors for a bad name or
class, and no module outside agentrl/generation naming a back end."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.config.schema import RolloutConfig
from agentrl.errors import UsageError
from agentrl.generation import (BACKENDS, GenerationBackend, TorchBackend, auto_backend, backend_settings,
                                builtin_backends, engine_gpus, planned_backend, setting_key)
from agentrl.generation.vllm import VllmBackend, VllmConfig
from agentrl.training.modes import check_mode_layout

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl"


def test_the_builtin_back_ends_and_their_declarations():
    assert builtin_backends() == {"torch": TorchBackend, "vllm": VllmBackend}
    vllm = load_config(None, ["rollout.vllm.tensor_parallel_size=2", "rollout.vllm.sleep_level=1"]).rollout
    settings = backend_settings(vllm, VllmBackend)
    assert settings is vllm.vllm and isinstance(settings, VllmConfig)
    assert (VllmBackend.engine_gpus(settings), VllmBackend.can_sleep, VllmBackend.sleeps(settings)) == (2, True, True)
    assert not VllmBackend.sleeps(VllmConfig())
    assert backend_settings(vllm, TorchBackend) is None
    assert (TorchBackend.engine_gpus(None), TorchBackend.can_sleep, TorchBackend.sleeps(None)) == (1, False, False)
    assert TorchBackend.weight_paths is None and VllmBackend.weight_paths is None     # every weight path
    assert setting_key(VllmBackend, "sleep_level") == "rollout.vllm.sleep_level"


def test_auto_picks_by_preference_among_the_installed_and_plans_as_on_a_gpu(monkeypatch):
    assert auto_backend("cpu") is TorchBackend and auto_backend("cpu", installed_only=False) is TorchBackend
    assert auto_backend("cuda", installed_only=False) is VllmBackend
    monkeypatch.setattr(VllmBackend, "installed", classmethod(lambda cls: False))
    assert auto_backend("cuda") is TorchBackend               # a GPU machine without vLLM
    rollout = load_config(None, ["rollout.vllm.tensor_parallel_size=4"]).rollout
    # the plan and the workers' Ray requests assume the GPU default (the workers' nodes may have vLLM)
    assert planned_backend(rollout) is VllmBackend
    assert (engine_gpus(rollout, "cuda"), engine_gpus(rollout, "cpu")) == (4, 0)
    torch_rollout = load_config(None, ["rollout.backend=torch", "rollout.vllm.tensor_parallel_size=4"]).rollout
    assert engine_gpus(torch_rollout, "cuda") == 1            # the torch engine runs on one GPU


def test_the_rollout_section_is_generated_from_the_back_ends_settings():
    fields = {f.name: f for f in dataclasses.fields(RolloutConfig)}
    assert fields["vllm"].type is VllmConfig and "torch" not in fields       # the torch engine has no settings
    assert {f.name for f in dataclasses.fields(VllmConfig)} == {
        "gpu_memory_utilization", "tensor_parallel_size", "enforce_eager", "max_num_seqs", "sleep_level",
        "model_runner"}
    assert fields["backend_params"].default_factory() == {}
    assert "auto (the installed back end that prefers the device: vllm on GPU, torch on CPU), torch, vllm, or" in \
        fields["backend"].metadata["help"]
    cfg = load_config(None, ["rollout.vllm.gpu_memory_utilization=0.3"])
    assert cfg.rollout.vllm.gpu_memory_utilization == 0.3
    with pytest.raises(UsageError, match=r"config key `rollout.vllm.sleep_level` = 3 is invalid"):
        load_config(None, ["rollout.vllm.sleep_level=3"])


class NotABackend:
    name = "nope"


class NoBuild(GenerationBackend):
    name = "no_build"

    def generate(self, prompt_ids, sampling):
        return []

    def load_weights(self, state_dict):
        pass


class NoDefault(NoBuild):
    name = "no_default"

    @dataclasses.dataclass
    class Settings:
        size: int

    @classmethod
    def build(cls, model_dir, settings, **kwargs):
        return cls()


@pytest.mark.parametrize("spec, message", [
    ("vlm", r"^unknown generation back end rollout.backend='vlm'; did you mean vllm\?"),
    ("no_such_module_xyz:Backend", r"cannot import 'no_such_module_xyz'"),
    (f"{__name__}:NotABackend", r"is not a generation back end: subclass agentrl.generation.GenerationBackend"),
    (f"{__name__}:NoBuild", r"does not define the classmethod build\(model_dir, settings, \*, device"),
    (f"{__name__}:NoDefault", r"NoDefault.Settings.size has no default"),
])
def test_a_bad_back_end_is_one_line(spec, message):
    with pytest.raises(UsageError, match=message) as refused:
        load_config(None, [f"rollout.backend={spec}"])
    assert "\n" not in str(refused.value)


def test_an_overlapped_mode_refuses_a_back_end_set_to_sleep_naming_its_key():
    cfg = load_config(None, ["trainer.mode=one_step_off", "rollout.backend=vllm", "rollout.vllm.sleep_level=2"])
    with pytest.raises(UsageError, match=r"so the engine cannot sleep: set rollout.vllm.sleep_level=0 \(and give"):
        check_mode_layout(cfg, sync=None)


# ----- nothing outside agentrl/generation names a back end ------------------------------------------
# benchmarks measure named back ends side by side, and the GPU checklist probes vLLM itself
NAMING_ALLOWED = ("generation", "bench", "checklist")
BACKEND_MODULES = ("torch_engine", "vllm")


def namings(source: str) -> list[str]:
    """Where ``source`` names a built-in back end: compares a value with its name, passes its name as a
    ``backend`` argument, reads its config section (``rollout.vllm``) or imports its module."""
    names = set(builtin_backends())
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                found += [f"line {node.lineno}: compares with {c.value!r}" for c in items
                          if isinstance(c, ast.Constant) and c.value in names]
        elif isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, (ast.Attribute, ast.Name)):
            owner = node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id
            if "rollout" in owner:
                found.append(f"line {node.lineno}: reads {owner}.{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg == "backend" and isinstance(node.value, ast.Constant) \
                and node.value.value in names:
            found.append(f"line {node.value.lineno}: backend={node.value.value!r}")
        elif isinstance(node, ast.arguments):
            named = node.args[len(node.args) - len(node.defaults):] + node.kwonlyargs
            defaults = node.defaults + [d for d in node.kw_defaults]
            found += [f"line {d.lineno}: {a.arg}={d.value!r}" for a, d in zip(named, defaults)
                      if a.arg == "backend" and isinstance(d, ast.Constant) and d.value in names]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "make_backend" \
                and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in names:
            found.append(f"line {node.lineno}: make_backend({node.args[0].value!r}, ...)")
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if parts[:2] == ["agentrl", "generation"] and any(m.split(".")[2:3] and m.split(".")[2] in BACKEND_MODULES
                                                              for m in modules):
                found.append(f"line {node.lineno}: imports {node.module}")
    return found


def test_the_naming_check_sees_each_way_of_naming_a_back_end():
    source = '''
from agentrl.generation.vllm import VllmBackend
from agentrl.generation import torch_engine
tp = cfg.rollout.vllm.tensor_parallel_size
level = rollout_cfg.vllm.sleep_level
if cfg.rollout.backend == "torch": pass
if name in ("auto", "vllm"): pass
group = RolloutWorkerGroup(model_dir, backend="torch")
backend = make_backend("vllm", model_dir)
def build(backend: str = "torch"): pass
'''
    assert sorted(int(w.split()[1].rstrip(":")) for w in namings(source)) == list(range(2, 11)), namings(source)
    assert namings('from agentrl.generation import make_backend\nmake_backend("auto", d)\nx = {"torch": 1}') == []


def test_no_shared_module_names_a_back_end():
    """Placement, trainer, modes, workers and the rest ask the back end's declarations (docs/rollout.md,
    'Add a back end'); docstrings and messages may still mention one."""
    naming = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if unit not in NAMING_ALLOWED:
            naming += [f"{path.relative_to(PACKAGE.parent)} {where}" for where in namings(path.read_text())]
    assert not naming, "ask the back end instead of naming it:\n" + "\n".join(naming)


def test_reading_the_declarations_loads_neither_transformers_nor_vllm():
    """The config and `agentrl plan` read every built-in back end's declarations; the engines' heavy
    packages load only when one is built (vLLM's lazily, the torch engine's caches through agentrl.models)."""
    code = ("import sys; from agentrl.config import load_config; from agentrl.placement import plan_placement; "
            "plan_placement(load_config('alfworld_bipace_qwen7b'), 1, 8); "
            "print(sorted(m for m in ('transformers', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_the_registry_lists_the_built_in_names_for_the_config():
    assert BACKENDS.names()[:2] == ["torch", "vllm"]
