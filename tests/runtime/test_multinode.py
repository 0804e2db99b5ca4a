"""A real multi-node Ray cluster on one machine: a head and a second node started with `ray start` as
separate raylets (distinct node ids, custom resources node_a / node_b) on loopback, with the
commands of docs/multinode.md ("Placement"). `agentrl train` through RAY_ADDRESS places learner
rank 0 on node A and rank 1 on node B, the rollout worker on B and the env pool on A; its losses
equal a one-node run's; killing node B mid-run (after the second checkpoint) ends the run with one
line naming the lost node and leaves the last checkpoint loadable; with node B back the same
command resumes and finishes. With node B in a mount namespace of its own, where a tmpfs hides the
run's output directory (a node that does not share trainer.output_dir), the run is refused at
start in one line naming rank 1 and node B. The one-node run is tests/conftest.py::two_rank_run (the same
settings, also checked by tests/cli/test_train_cli.py)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import psutil
import pytest

from cli_train import iteration_losses, train_args

pytestmark = pytest.mark.slow
DOC = Path(__file__).resolve().parents[2] / "docs" / "multinode.md"


def doc_commands() -> tuple[list[str], list[str]]:
    """The `ray start` lines (head first) and the train command of docs/multinode.md's test block."""
    text = DOC.read_text()
    block = text[text.index("<!-- multinode-test -->"):]
    block = block[block.index("```bash") + len("```bash"):]
    lines = [line.strip() for line in block[:block.index("```")].splitlines()
             if line.strip() and not line.strip().startswith("#")]
    return [line for line in lines if line.startswith("ray start")], \
        [line for line in lines if "agentrl train" in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackCluster:
    """Ray nodes started by the documented `ray start` lines, each in a session of its own so one
    node's processes (raylet and its workers) can be killed without touching any other Ray."""

    def __init__(self, lines: list[str]):
        self.lines = lines
        self.port, self.dashboard_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="mn", dir="/tmp"))   # short: Ray's socket paths must fit 107 bytes
        (self.dir / "token").write_text(os.urandom(32).hex())
        self.env = {**{k: v for k, v in os.environ.items()
                       if k not in ("RAY_ADDRESS", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")},
                    "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.dir / "token"),
                    "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true",
                    # the head's GCS checks each raylet every 0.5 s instead of every 3 s, so a killed
                    # node is marked dead after 5 refused checks in ~2.5 s instead of ~15 s (a slow
                    # but live raylet still has the 10 s timeout of each check to answer)
                    "RAY_health_check_period_ms": "500"}
        self.sessions: dict[str, int] = {}     # node resource -> the session id of its processes

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, index: int, inside: Sequence[str] = ()) -> None:
        """Start node ``index`` of the documented lines; ``inside``: a command its `ray start` runs under
        (e.g. in a mount namespace of its own: the node's daemons and workers inherit it)."""
        line = self.lines[index].replace("6379", str(self.port)).replace("8265", str(self.dashboard_port))
        line = line.replace("HEAD_IP", "127.0.0.1")
        args = shlex.split(line)
        if "--head" in args:
            args.append(f"--temp-dir={self.dir / 'ray'}")
        name = re.search(r'"(node_\w+)"', line).group(1)
        ray_bin = str(Path(sys.executable).parent / "ray")
        proc = subprocess.Popen([*inside, ray_bin, *args[1:]], env=self.env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, out[-3000:]
        self.sessions[name] = proc.pid        # its daemons stay in the session ray start opened

    def processes(self, name: str) -> list[psutil.Process]:
        sid = self.sessions[name]
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) == sid:
                    found.append(proc)
            except (ProcessLookupError, PermissionError):
                continue
        return found

    def kill(self, name: str) -> int:
        victims = self.processes(name)
        for proc in victims:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        return len(victims)

    def stop(self) -> None:
        for name in list(self.sessions)[::-1]:
            self.kill(name)


def run(args: list[str], env: dict[str, str], timeout: float = 900) -> tuple[int, str]:
    proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def cluster_train_args(train_line: str, out: Path, start_model: str, iterations: int) -> list[str]:
    """The documented train command with the test's tiny settings (which replace its recipe)."""
    documented = shlex.split(train_line.split("agentrl train", 1)[1])
    placement = [a for a in documented if a.startswith("placement.") or a.startswith("learner.num_ranks")]
    assert len(placement) == 4, documented
    return [sys.executable, "-m", "agentrl.cli.main", *train_args(out, start_model, iterations), *placement]


def in_cluster(address: str, env: dict[str, str], code: str):
    """The JSON that ``code`` prints as a driver of the cluster (a child process: this test process
    stays out of the cluster)."""
    import json

    script = f"import json, ray\nray.init(address={address!r}, log_to_driver=False)\n{code}"
    code_rc, out = run([sys.executable, "-c", script], env, timeout=120)
    assert code_rc == 0, out[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def node_names(address: str, env: dict[str, str]) -> dict[str, str]:
    """Node id -> the custom resource (node_a, node_b) of each live node: Ray reports no resources
    for a node once it is dead."""
    return in_cluster(address, env, "print(json.dumps({n['NodeID']: next(k for k in n['Resources'] if "
                                     "k.startswith('node_')) for n in ray.nodes() if n['Alive']}))\n")


def actor_nodes(address: str, env: dict[str, str], names: dict[str, str]) -> dict[str, list[str]]:
    """Class name -> the nodes (``names``) its actors ran on, from Ray's state API."""
    data = in_cluster(address, env, "from ray.util.state import list_actors\n"
                                    f"names = {names!r}\n"
                                    "out = {}\n"
                                    "for a in list_actors(limit=1000, detail=True):\n"
                                    "    out.setdefault(a.class_name, []).append(names.get(a.node_id, a.node_id))\n"
                                    "print(json.dumps(out))\n")
    return data


def test_two_raylets_place_the_roles_survive_nothing_silently_and_resume(tmp_path, tiny_start_model, two_rank_run):
    """One run of 5 iterations on the two nodes: up to node B's loss after the second checkpoint its
    losses are the one-node run's and its roles sit where placement.* put them."""
    start_model = tiny_start_model
    ray_lines, train_lines = doc_commands()
    assert len(ray_lines) == 2 and len(train_lines) == 1
    # the same run on one node (the session's Ray head), 2 iterations
    assert two_rank_run.returncode == 0, two_rank_run.output[-3000:]
    one_node = iteration_losses(two_rank_run.run_dir)
    assert sorted(one_node) == [1, 2]

    cluster = LoopbackCluster(ray_lines)
    try:
        cluster.start(0)
        cluster.start(1)
        env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        names = node_names(cluster.address, env)
        assert sorted(names.values()) == ["node_a", "node_b"], names

        # node B lost after the second checkpoint: one line naming it, the checkpoint intact
        args = cluster_train_args(train_lines[0], tmp_path / "lost", start_model, 5)
        proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        latest = tmp_path / "lost" / "run" / "checkpoints" / "latest"   # replaced atomically
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and \
                not (latest.exists() and latest.read_text().strip() == "iter_000002"):
            time.sleep(0.1)
        assert latest.exists() and latest.read_text().strip() == "iter_000002", \
            "no second checkpoint before the node was killed"
        assert cluster.kill("node_b") >= 2          # its raylet and the actors' worker processes
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 2, out[-3000:]
        errors = [line for line in out.splitlines() if line.startswith("agentrl: error:")]
        assert len(errors) == 1, out[-3000:]
        assert re.search(r"training stopped in iteration \d: lost Ray node \w+ \([\d.]+, resources node_b\): its "
                         r"actors died \([\w()]+\); checkpoint .*iter_\d+ is the last complete one", errors[0]), errors[0]
        saved = latest.read_text().strip()
        assert (tmp_path / "lost" / "run" / "checkpoints" / saved / "trainer_state.json").is_file()

        # up to then: the one-node run's losses, rank 0 on node A and rank 1 on node B, the rollout
        # worker on B and the env pool on A
        losses = iteration_losses(tmp_path / "lost" / "run")
        assert {k: losses[k] for k in one_node} == pytest.approx(one_node, rel=1e-5, abs=1e-7)
        placed = actor_nodes(cluster.address, env, names)
        assert sorted(placed["LearnerRank"]) == ["node_a", "node_b"], placed
        assert set(placed["RolloutWorker"]) == {"node_b"} and set(placed["EnvPoolActor"]) == {"node_a"}, placed

        # node B back: the same command resumes from that checkpoint and finishes
        cluster.start(1)
        rc, out = run(args, env)
        assert rc == 0, out[-3000:]
        assert f"resumed run after iteration {int(saved.split('_')[1])}" in out
        assert sorted(iteration_losses(tmp_path / "lost" / "run"))[-1] == 5
    finally:
        cluster.stop()


def test_a_placement_resource_that_no_node_offers_is_refused_in_one_line(tmp_path, tiny_start_model, ray_head):
    """The cluster the command joins (the session's Ray head, started without custom resources)
    offers none."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1", **ray_head)
    rc, out = run([sys.executable, "-m", "agentrl.cli.main", *train_args(tmp_path, tiny_start_model),
                   "placement.rollout=[node_z]"], env, timeout=300)
    assert rc == 2, out[-2000:]
    assert "agentrl: error: placement.rollout names the Ray resource 'node_z', which no node of the cluster offers " \
           "(offered: none); start a node with `ray start --address ... --resources='{\"node_z\": 1}'`" in out, out[-2000:]


def mount_namespace_problem(directory: Path) -> str | None:
    """Why a process cannot get a mount namespace of its own with a tmpfs over ``directory`` here, or None."""
    try:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                f"mount -t tmpfs none {shlex.quote(str(directory))}"],
                               capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no unshare command"
    return None if probe.returncode == 0 else (probe.stderr.strip() or f"exit code {probe.returncode}")


def test_a_node_that_does_not_share_the_output_dir_is_refused_at_start(tmp_path, tiny_start_model):
    """Node B's raylet (and so every worker it starts) runs in a mount namespace where an empty tmpfs
    lies over trainer.output_dir: a real filesystem that node A's processes do not share."""
    out = tmp_path / "out"
    out.mkdir()
    problem = mount_namespace_problem(out)
    if problem:
        pytest.skip(f"needs a mount namespace (unshare --mount, as root or with CAP_SYS_ADMIN) for a node-local "
                    f"filesystem: {problem}")
    ray_lines, train_lines = doc_commands()
    cluster = LoopbackCluster(ray_lines)
    try:
        cluster.start(0)
        cluster.start(1, inside=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                 f'mount -t tmpfs none {shlex.quote(str(out))} && exec "$@"', "sh"])
        env = {**cluster.env, "RAY_ADDRESS": cluster.address}
        rc, output = run(cluster_train_args(train_lines[0], out, tiny_start_model, 2), env, timeout=600)
    finally:
        cluster.stop()
    assert rc == 2, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("agentrl: error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert re.fullmatch(rf"agentrl: error: trainer\.output_dir is not one directory for every learner rank: in "
                        rf"{re.escape(str(out / 'run'))}, learner rank 1 \(node [\d.]+ \[node_b\], pid \d+\) does not "
                        r"see the marker this process wrote there \(no directory of that path on its node\)\. Each "
                        r"rank writes its share of every checkpoint there, .*; put trainer\.output_dir on a filesystem "
                        r"that every node mounts at the same path \(e\.g\. NFS\), or run the learner ranks on this "
                        r"node \(placement\.learner naming a resource of this node\)", errors[0]), errors[0]
    # refused before any checkpoint, and no marker left behind
    assert not (out / "run" / "checkpoints").exists()
    assert not [p for p in (out / "run").iterdir() if p.name.startswith(".agentrl-shared-check")]
