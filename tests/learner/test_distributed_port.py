"""A single learner process picks its own rendezvous port; when something else binds that port
before the store does (a Ray worker starting at the same moment), it picks another one."""
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, socket
    import torch.distributed as dist
    from agentrl.learner import distributed

    busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    ports = [taken]
    real_free_port = distributed.free_port
    distributed.free_port = lambda: ports.pop(0) if ports else real_free_port()
    info = distributed.init_process_group("cpu")
    assert dist.is_initialized() and info.world_size == 1
    assert int(os.environ["MASTER_PORT"]) != taken, os.environ["MASTER_PORT"]
    distributed.destroy_process_group()

    # a port the user set is theirs: a clash is reported, not silently moved
    os.environ["MASTER_PORT"] = str(taken)
    try:
        distributed.init_process_group("cpu")
    except dist.DistNetworkError as error:
        assert "EADDRINUSE" in str(error)
        print("user port kept")
    print("ok")
""")


def test_a_port_taken_before_the_store_binds_is_chosen_again():
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-2:] == ["user port kept", "ok"], done.stdout
