"""Suite-wide fixtures."""

from __future__ import annotations

import faulthandler
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from process_sessions import kill_sessions

from agentrl.envs.spec import source_checkout_envs

# The environment packages of this checkout (envs/<name>/agentrl_env_<name>) import by their own names
# in tests and in the processes tests start, installed (scripts/setup.sh) or not: discovery puts their
# folders on sys.path, and PYTHONPATH carries them to child processes.
source_checkout_envs()
_ENV_FOLDERS = [str(p) for p in sorted((Path(__file__).resolve().parents[1] / "envs").glob("*")) if p.is_dir()]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] +
    [p for p in _ENV_FOLDERS if p not in os.environ.get("PYTHONPATH", "").split(os.pathsep)])


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """The test machines are small and shared: one torch thread per process avoids oversubscription
    (child processes started by the tests set OMP_NUM_THREADS=1 themselves)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def ieee_floats_after_each_test():
    """A test that calls the agentrl command in this process (`main([...])`) leaves its denormal
    flushing on (agentrl.runtime.denormals: the command's process is meant to keep it); turn it off again, so
    every test sees the IEEE floats it would see alone (hypothesis refuses to run otherwise)."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session", autouse=True)
def release_process_group():
    """In-process learners share one gloo process group for the whole test process (DeepSpeed
    creates it once); destroy it when the session ends, so its threads are gone before the
    interpreter shuts down rather than torn down during the shutdown."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs, started once for the whole test process.

    Every module that needs Ray shares it: a ``ray.shutdown()`` followed by a new ``ray.init()``
    in one process leaves Ray's background threads free to touch the torn-down core worker, which
    can crash the process later (at the latest while it exits). Modules that ship test-only code
    to the workers override this fixture, request it, and register their modules by value.
    """
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_head():
    """One Ray head node (`ray start --head`) for the whole test session: the environment (RAY_ADDRESS
    and its token) that makes an `agentrl` command started by a test join it, as docs/multinode.md
    recommends for many runs on one machine, instead of starting and stopping a local Ray instance
    of its own (a tiny 2-rank train run took ~39 s that way and ~16 s joining a running head, on 2
    cores). Its Ray workers run with this process's environment (less any rendezvous variables),
    not the command's. tests/training/test_async_training.py and tests/bench/test_bench_modes.py still run the
    local start through the CLI; tests/runtime/test_ray_start.py tests it."""
    pytest.importorskip("ray")
    home = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))     # short: Ray's socket paths must fit 107 bytes
    (home / "token").write_text(os.urandom(32).hex())
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(home / "token"), RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", WANDB_SILENT="true", TOKENIZERS_PARALLELISM="false")
    ray_bin = str(Path(sys.executable).parent / "ray")
    # room for a 2-rank run (4 actors) beside the actors of a killed run that Ray is still cleaning up
    proc = subprocess.Popen([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=8", "--include-dashboard=false",
                             f"--dashboard-port={_free_port()}", f"--ray-client-server-port={_free_port()}",
                             f"--temp-dir={home / 'ray'}", "--disable-usage-stats"],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-3000:]
        yield {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": str(home / "token")}
    finally:
        kill_sessions([proc.pid])
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_start_model(tmp_path_factory) -> str:
    """A random tiny TextCraft policy (tokenizer trained on env text) for the `agentrl train` runs of
    tests/helpers/cli_train.py, built once for the session."""
    from agentrl.config import load_config
    from agentrl.models import prepare_initial_model
    from agentrl.warmstart.starting_policy import corpus_builder
    from cli_train import TINY

    cfg = load_config("textcraft_gigpo_tiny", TINY)
    path = tmp_path_factory.mktemp("policy") / "init"
    return prepare_initial_model(cfg.model, cfg.tokenizer, path, corpus=corpus_builder(cfg), seed=0)


class FinishedRun:
    """A finished `agentrl train` subprocess: its run directory, exit status and output."""

    def __init__(self, run_dir: Path, returncode: int, output: str):
        self.run_dir, self.returncode, self.output = run_dir, returncode, output


@pytest.fixture(scope="session")
def two_rank_run(tmp_path_factory, tiny_start_model, ray_head) -> FinishedRun:
    """`agentrl train` of tests/helpers/cli_train.py's tiny settings (2 iterations, 2 learner ranks, a
    checkpoint after each, validation after the second) with rollout.weight_sync=broadcast, run once:
    tests/cli/test_train_cli.py checks it and resumes a killed copy of it, tests/runtime/test_multinode.py
    compares a two-node run's losses with it."""
    from cli_train import run_cli, train_args

    out = tmp_path_factory.mktemp("two-rank-run")
    proc = run_cli([*train_args(out, tiny_start_model), "rollout.weight_sync=broadcast"], extra_env=ray_head)
    output, _ = proc.communicate(timeout=900)
    return FinishedRun(out / "run", proc.returncode, output)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Keep the fault handler on through interpreter shutdown, after pytest's own one is switched
    off: a crash while the test process exits then prints the Python stack of every thread,
    instead of a bare exit status 139."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)


@pytest.fixture(scope="session")
def alfworld_search_games(tmp_path_factory) -> str:
    """A directory of 3 generated bathroom ``pick_and_place_simple`` training games walked by the
    searching expert (the kind the ALFWorld tiny recipes and the DAgger pass use)."""
    pytest.importorskip("alfworld")
    from agentrl_env_alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("search-games"))
    generate_dataset(out, {"train": 3}, seed=3, workers=1, solver="search", task_types=("pick_and_place_simple",),
                     rooms=("bathroom",))
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Byte-level BPE trained on TextCraft and WebShop expert text, and a random tiny model (hidden 64,
    2 layers): the rollout, generation and warm-start tests' model."""
    from rollout_helpers import write_rollout_model

    return write_rollout_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from agentrl.models import load_tokenizer

    return load_tokenizer(tiny_model_dir)
