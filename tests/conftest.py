"""Suite-wide fixtures."""

from __future__ import annotations

import faulthandler
import gc
import os
import sys

import pytest
import torch


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
    from agentrl.envs.alfworld.generate import generate_dataset

    out = str(tmp_path_factory.mktemp("search-games"))
    generate_dataset(out, {"train": 3}, seed=3, workers=1, solver="search", task_types=("pick_and_place_simple",),
                     rooms=("bathroom",))
    return out
