"""The plan's placement group on a real two-node Ray cluster with declared GPUs, on a CPU machine.

Two raylets on loopback (`ray start --head --num-gpus=8` and a second `ray start --address ...
--num-gpus=8`, the approach of tests/runtime/test_multinode.py: each in a session of its own, token
authentication on) make a 2 x 8 GPU cluster without a GPU; Ray still sets each actor's
CUDA_VISIBLE_DEVICES from the GPU ids it grants. `agentrl plan --reserve --json` plans on that
cluster, reserves the placement group and starts a stand-in actor in every slot with the options the
real roles use (agentrl.runtime.actor_slots.actor_options); the test reads back each stand-in's node
and CUDA_VISIBLE_DEVICES. The pytest process itself never joins the cluster."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

from process_sessions import kill_sessions

pytestmark = pytest.mark.slow
RAY = str(Path(sys.executable).parent / "ray")
SEVEN_B = "recipe=alfworld_bipace_qwen7b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeclaredGpuCluster:
    """Raylets that declare GPUs the machine does not have; each node's processes in a session of
    their own, so that stopping them touches no other Ray on the machine."""

    def __init__(self):
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="pg", dir="/tmp"))     # short: Ray's socket paths must fit
        (self.dir / "token").write_text(os.urandom(32).hex())
        self.env = {**{k: v for k, v in os.environ.items()
                       if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK",
                                    "WORLD_SIZE", "LOCAL_RANK")},
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.dir / "token"),
                    "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
        self.sessions: list[int] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_node(self, gpus: int, cpus: int) -> None:
        where = (f"--head --port={self.port} --include-dashboard=false --temp-dir={self.dir / 'ray'}"
                 if not self.sessions else f"--address={self.address}")
        proc = subprocess.Popen([RAY, "start", *shlex.split(where), f"--num-gpus={gpus}", f"--num-cpus={cpus}",
                                 "--disable-usage-stats"], env=self.env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
        self.sessions.append(proc.pid)

    def stop(self) -> None:
        kill_sessions(self.sessions, timeout=10)

    def run(self, *args: str, timeout: float = 240) -> tuple[int, str]:
        env = {**self.env, "RAY_ADDRESS": self.address}
        proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", *args], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out if proc.returncode == 0 else err

    def reserve(self, *args: str) -> dict:
        code, out = self.run("plan", *args, "--reserve", "--json")
        assert code == 0, out[-3000:]
        return json.loads(out)


@pytest.fixture(scope="module")
def cluster():
    started = DeclaredGpuCluster()
    try:
        started.start_node(gpus=8, cpus=12)
        started.start_node(gpus=8, cpus=12)
        yield started
    finally:
        started.stop()


def slots_of(data: dict, role: str) -> list[tuple[str, list[str]]]:
    found = sorted((s["index"], s["node_id"], [d for d in (s["cuda_visible_devices"] or "").split(",") if d])
                   for s in data["slots"] if s["role"] == role)
    assert [index for index, _, _ in found] == list(range(len(found)))
    return [(node, devices) for _, node, devices in found]


def assert_no_gpu_given_twice(*groups: list[tuple[str, list[str]]]) -> None:
    given = [(node, device) for group in groups for node, devices in group for device in devices]
    assert len(given) == len(set(given)), given


def test_the_shipped_7b_recipe_holds_eight_gpus_of_one_node(cluster):
    data = cluster.reserve(SEVEN_B)
    assert data["node_gpus"] == [8, 8] and data["layout"] == "split"
    learner, engines, env = slots_of(data, "learner"), slots_of(data, "rollout"), slots_of(data, "env")
    assert [len(devices) for _, devices in learner] == [1, 1, 1, 1]
    assert [len(devices) for _, devices in engines] == [4]            # tensor parallel 4: its four GPUs
    assert {node for node, _ in learner + engines} == {engines[0][0]}   # the plan's node 0: one Ray node
    assert_no_gpu_given_twice(learner, engines)
    assert env == [(env[0][0], [])]                                    # an env server sees no GPU
    assert data["driver_gpu"] is None


def test_filling_two_nodes_keeps_each_engine_on_one_node_and_the_plans_grouping(cluster):
    data = cluster.reserve(SEVEN_B, "learner.num_ranks=8", "rollout.num_workers=2")
    learner, engines = slots_of(data, "learner"), slots_of(data, "rollout")
    assert [len(devices) for _, devices in engines] == [4, 4]
    assert [len(devices) for _, devices in learner] == [1] * 8
    assert_no_gpu_given_twice(learner, engines)
    # the plan: both engines on node 0, the eight ranks on node 1
    assert [e["node"] for e in data["engines"]] == [0, 0] and {r["node"] for r in data["ranks"]} == {1}
    assert len({node for node, _ in engines}) == 1 and len({node for node, _ in learner}) == 1
    assert engines[0][0] != learner[0][0]


def test_colocated_ranks_hold_the_gpus_their_engine_sees(cluster):
    data = cluster.reserve(SEVEN_B, "placement.layout=colocated", "rollout.vllm.sleep_level=1",
                           "rollout.vllm.gpu_memory_utilization=0.4")
    learner, engines = slots_of(data, "learner"), slots_of(data, "rollout")
    assert data["layout"] == "colocated" and len(engines) == 1
    engine_node, engine_devices = engines[0]
    assert len(engine_devices) == 4
    assert [len(devices) for _, devices in learner] == [1] * 4
    assert_no_gpu_given_twice(learner)
    assert {node for node, _ in learner} == {engine_node}
    assert sorted(d for _, devices in learner for d in devices) == sorted(engine_devices)


def test_a_one_rank_learner_keeps_its_gpu_from_the_engines(cluster):
    data = cluster.reserve("recipe=alfworld_bipace_qwen1.5b", "learner.num_ranks=1")
    assert slots_of(data, "learner") == []
    driver = data["driver_gpu"]
    assert driver is not None and driver["gpu"] in [str(i) for i in range(8)]
    engines = slots_of(data, "rollout")
    assert [len(devices) for _, devices in engines] == [2]
    assert (driver["node_id"], driver["gpu"]) not in [(engines[0][0], d) for d in engines[0][1]]


def test_a_cluster_too_small_or_too_busy_is_refused_in_one_line(cluster):
    code, err = cluster.run("plan", SEVEN_B, "learner.num_ranks=8", "rollout.num_workers=3", "--reserve")
    errors = [line for line in err.splitlines() if line.startswith("agentrl: error:")]
    assert code == 2 and errors == [
        "agentrl: error: the split layout needs 20 GPUs (8 learner rank(s) + 3 rollout engine(s) x 4) and the cluster "
        "has 16 (2 nodes x 8 GPUs); add GPUs (placement.nodes), lower learner.num_ranks or rollout.num_workers, or "
        "set placement.layout=colocated"], err[-2000:]

    # another job holds 12 of the 16 GPUs: the group cannot be granted, the wait is bounded
    holder_code = ("import ray, sys\nfrom ray.util.placement_group import placement_group\n"
                   f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
                   "group = placement_group([{'GPU': 8}, {'GPU': 4}], strategy='SPREAD')\n"
                   "assert group.wait(timeout_seconds=120)\nprint('held', flush=True)\nsys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", holder_code], env={**cluster.env, "RAY_ADDRESS": cluster.address},
                              start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        code, err = cluster.run("plan", SEVEN_B, "placement.wait_s=3", "--reserve")
        assert time.monotonic() - started < 60
        errors = [line for line in err.splitlines() if line.startswith("agentrl: error:")]
        assert code == 2 and len(errors) == 1, err[-2000:]
        assert errors[0].startswith("agentrl: error: the Ray cluster cannot hold this run's placement group within "
                                    "placement.wait_s=3 s: it asks for 8 GPU, 6 CPU (bundles of up to 4 GPUs on one "
                                    "node); the cluster has 16 GPU (4 free), 24 CPU (24 free); missing 4 GPU; "), errors
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    # the refused group was removed: the GPUs are free again for the next run
    data = cluster.reserve(SEVEN_B)
    assert [len(devices) for _, devices in slots_of(data, "rollout")] == [4]
