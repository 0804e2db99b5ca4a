"""Rendezvous ports: a port this project chooses is bound from the moment it is chosen (nothing
starting in between, a Ray worker or another learner, can take it), for one learner process and
for rank 0 of several; a port the user sets is used as it is."""
import os
import socket
import subprocess
import sys
import textwrap

RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

SINGLE = textwrap.dedent("""
    import os, socket
    import torch.distributed as dist
    from agentrl.learner import distributed

    def bindable(port):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    info = distributed.rank_from_env()
    first = int(os.environ["MASTER_PORT"])
    assert (info.rank, info.world_size) == (0, 1)
    assert not bindable(first), "the chosen port is free again before the group is built"
    distributed.init_process_group("cpu")
    assert dist.is_initialized() and dist.get_world_size() == 1
    distributed.init_process_group("cpu")      # a second learner while the group lives: the same group
    assert int(os.environ["MASTER_PORT"]) == first
    distributed.destroy_process_group()

    # a second learner in this process: a port of its own, the first one's store is gone
    distributed.init_process_group("cpu")
    assert dist.is_initialized() and int(os.environ["MASTER_PORT"]) != first
    distributed.destroy_process_group()
    print("chosen ports held")

    # a port the user set is theirs: a clash is reported, not silently moved
    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    os.environ["MASTER_PORT"] = str(busy.getsockname()[1])
    try:
        distributed.init_process_group("cpu")
    except dist.DistNetworkError as error:
        assert "EADDRINUSE" in str(error), error
        print("user port kept")
""")

RANK = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    from agentrl.learner import distributed
    from agentrl.runtime.rendezvous import reserve_store

    rank = int(os.environ["RANK"])
    if rank == 0:      # as LearnerRank.serve_store: bound first, the port handed to the others after
        port = reserve_store(2)
        os.environ["MASTER_PORT"] = str(port)
        print(port, flush=True)
    else:
        os.environ["MASTER_PORT"] = sys.stdin.readline().strip()
    distributed.init_process_group("cpu")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print("sum", int(total.item()), flush=True)
    distributed.destroy_process_group()
""")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in RENDEZVOUS}


def test_one_process_holds_the_port_it_chose_and_keeps_the_users():
    done = subprocess.run([sys.executable, "-c", SINGLE], env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == ["chosen ports held", "user port kept"], done.stdout


def test_two_ranks_meet_at_the_store_rank_zero_reserved():
    env = {**clean_env(), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    zero = subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": "0", "LOCAL_RANK": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # rank 1 starts (and imports torch) at once, then waits on stdin for the port
    one = subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": "1", "LOCAL_RANK": "1"},
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(zero.stdout.readline())
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            assert s.connect_ex(("127.0.0.1", port)) == 0, "rank 0's store does not listen yet"
        out_one, err_one = one.communicate(f"{port}\n", timeout=300)
        out_zero, err_zero = zero.communicate(timeout=300)
    finally:
        for proc in (zero, one):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert zero.returncode == 0 and one.returncode == 0, err_zero + err_one
    assert out_zero.splitlines()[-1] == out_one.splitlines()[-1] == "sum 3", (out_zero, out_one)
