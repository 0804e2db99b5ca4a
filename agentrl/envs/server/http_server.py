"""The HTTP env server, ``agentrl envs serve NAME --port P``: one or more shard processes, each a
:class:`~agentrl.envs.server.pool_server.PoolHTTPServer` (its routes and errors are described there).

With ``shards > 1`` the instances are split over that many processes: this one serves the first
shard on the given port, the others listen on free ports of the same host, and ``/info`` lists
them all, so a client holding one URL uses every core. Each shard process runs its server on a
daemon thread while its main thread keeps to signals, so a hung environment never keeps a process
from exiting; with ``call_timeout_s`` a hung reset/step is abandoned and its instance rebuilt (see
``EnvPool``).

**The shards live and die together**, so no half-server answers:

* a shard process whose server process (shard 0) is gone stops at once: it reads a pipe from its
  parent and stops when that pipe closes, however the parent ended (SIGKILL included);
* a shard process that dies is started again on its port (fresh instances: reset them), so clients
  reconnect to it without being told; one that cannot be started again, or dies more than
  ``MAX_RESTARTS`` times in ``RESTART_WINDOW_S``, stops the whole server (exit code 1, one line
  naming the shard), and so does any shard death with ``restart_shards=False``.

A server bound beyond the loopback interface requires a token (:mod:`agentrl.envs.server.auth`); the
extra shards get it through their pipe, never through their environment or command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from agentrl.envs.server.auth import TOKEN_ENV, check_token, refuse_open_bind
from agentrl.envs.server.pool import EnvPool, shard_sizes
from agentrl.envs.server.pool_server import DEFAULT_MAX_BODY_BYTES, GRACEFUL_SHUTDOWN_S, PoolHTTPServer
from agentrl.runtime.http_connections import raise_file_limit

MAX_RESTARTS = 5            # a shard that dies more often than this within RESTART_WINDOW_S stops the server
RESTART_WINDOW_S = 60.0


def _watch_parent() -> None:
    """In a shard process: stop once the pipe from the server's main process closes (it exited). Read
    from the file descriptor itself: a daemon thread blocked in ``sys.stdin`` holds its lock, which
    the interpreter then cannot take at exit (a fatal error)."""
    try:
        while os.read(sys.stdin.fileno(), 65536):
            pass
    except (OSError, ValueError):
        pass
    print("env shard: the server's main process is gone; stopping", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)


def _shard_main(argv: list[str]) -> int:
    """Entry point of an extra shard process: serve on a free port, print it as one JSON line. The first
    line of stdin holds ``{"token": ...}``; the rest of stdin stays open while the parent lives."""
    spec = json.loads(argv[0])
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        token = json.loads(sys.stdin.buffer.readline() or b"{}").get("token")
        raise_file_limit()
        pool = EnvPool(spec["env"], spec["size"], spec["env_kwargs"], spec["first_id"],
                       call_timeout_s=spec.get("call_timeout_s"))
        server = PoolHTTPServer((spec["host"], spec.get("port", 0)), pool, spec["max_body_bytes"], token=token,
                                ssl_certfile=spec.get("ssl_certfile"), ssl_keyfile=spec.get("ssl_keyfile"))
    except Exception as err:  # noqa: BLE001 - reported to the parent, which fails loudly
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    threading.Thread(target=_watch_parent, name="env-shard-parent", daemon=True).start()
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    thread = server.start_background()  # this thread keeps to signals (see PoolHTTPServer.serve_forever)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C reaches the whole process group; SIGTERM
        pass
    finally:
        server.shutdown(timeout=GRACEFUL_SHUTDOWN_S + 1.0)
    return 0


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


class ShardedHTTPServer:
    """Shard 0 in this process plus ``shards - 1`` child processes, all on ``host``.

    ``token``: required from clients (see :mod:`agentrl.envs.server.auth`); without one, a ``host``
    other machines can reach is refused unless ``allow_no_token``. ``ssl_certfile``/``ssl_keyfile``:
    every shard serves HTTPS. ``failure``: why the server stopped itself (a shard that died and
    could not be started again), else None."""

    def __init__(self, env_name: str, size: int, env_kwargs: dict | None = None, host: str = "127.0.0.1",
                 port: int = 0, shards: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 verbose: bool = False, start_timeout: float = 300.0, call_timeout_s: float | None = None,
                 restart_shards: bool = True, token: str | None = None, allow_no_token: bool = False,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None):
        if token is not None:
            check_token(token, "token=")
        refuse_open_bind(host, token, allow_no_token)
        self.token = token
        env_kwargs = dict(env_kwargs or {})
        sizes = shard_sizes(size, shards)
        firsts = [sum(sizes[:i]) for i in range(shards)]
        self.children: list[subprocess.Popen] = []
        self.specs: list[dict[str, Any]] = []
        self.restarts = 0   # shard processes started again after they died
        self.failure: str | None = None
        self.start_timeout = start_timeout
        self.restart_shards = restart_shards
        self._deaths: list[list[float]] = []     # per extra shard: when it died lately
        self._started = False
        self._closing = threading.Event()
        try:
            for i in range(1, shards):
                self.specs.append({"env": env_name, "env_kwargs": env_kwargs, "host": host, "size": sizes[i],
                                   "first_id": firsts[i], "max_body_bytes": max_body_bytes,
                                   "call_timeout_s": call_timeout_s, "ssl_certfile": ssl_certfile,
                                   "ssl_keyfile": ssl_keyfile})
                self.children.append(self._spawn(self.specs[-1]))
                self._deaths.append([])
            self.server = PoolHTTPServer((host, port), EnvPool(env_name, sizes[0], env_kwargs, 0,
                                                               call_timeout_s=call_timeout_s),
                                         max_body_bytes, verbose, token, ssl_certfile, ssl_keyfile)
            for i, child in enumerate(self.children, start=1):
                self.specs[i - 1]["port"] = self._await_port(child, i)
                self.server.shards.append({"port": self.specs[i - 1]["port"], "first_id": firsts[i],
                                           "size": sizes[i]})
        except BaseException:
            self.close()
            raise

    def _spawn(self, spec: dict[str, Any]) -> subprocess.Popen:
        """A shard process; its token goes down its stdin pipe, which stays open while this process lives
        (the shard stops when it closes). Its environment is this one's without ``$AGENTRL_ENV_TOKEN``."""
        env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
        child = subprocess.Popen([sys.executable, "-m", "agentrl.envs.server.http_server", json.dumps(spec)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        child.stdin.write(json.dumps({"token": self.token}) + "\n")
        child.stdin.flush()
        return child

    def _await_port(self, child: subprocess.Popen, shard: int) -> int:
        line = _first_line(child, self.start_timeout)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            reply = {"error": f"no answer (exit code {child.poll()}); see its stderr"}
        if "port" not in reply:
            raise RuntimeError(f"shard {shard} of {self.specs[shard - 1]['env']!r} failed to start: "
                               f"{reply.get('error')}")
        return int(reply["port"])

    def _supervise(self) -> None:
        """Start a dead shard process again on its port (its instances come back fresh); stop the whole
        server when that is not allowed or does not work (module docstring)."""
        while not self._closing.wait(0.2):
            for n, child in enumerate(self.children):
                if child.poll() is None or self._closing.is_set():
                    continue
                _close_pipes(child)
                what = f"env shard {n + 1} (port {self.specs[n]['port']}) exited with code {child.returncode}"
                now = time.monotonic()
                deaths = self._deaths[n] = [t for t in self._deaths[n] if now - t < RESTART_WINDOW_S] + [now]
                if not self.restart_shards:
                    self.stop(f"{what} (restart_shards=False)")
                    return
                if len(deaths) > MAX_RESTARTS:
                    self.stop(f"{what}, its {len(deaths)}th death in {RESTART_WINDOW_S:g} s")
                    return
                print(f"{what}; starting it again", file=sys.stderr, flush=True)
                try:
                    self.children[n] = self._spawn(self.specs[n])
                    self.restarts += 1
                    self._await_port(self.children[n], n + 1)
                except (OSError, RuntimeError) as err:  # e.g. the port was taken meanwhile
                    self.stop(f"{what} and could not be started again: {err}")
                    return

    def stop(self, reason: str) -> None:
        """Stop every shard (no half-server answers) and record why; :meth:`serve_forever` returns."""
        self.failure = reason
        print(f"env server stopped: {reason}; the other shards are stopped with it (start the server again)",
              file=sys.stderr, flush=True)
        self._closing.set()
        for child in self.children:
            if child.poll() is None:
                child.terminate()
        if self._started:
            self.server.shutdown()
        self.server.server_close()

    def _start_supervisor(self) -> None:
        if self.children:
            threading.Thread(target=self._supervise, name="env-shard-supervisor", daemon=True).start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def shards(self) -> list[dict[str, int]]:
        return self.server.shards

    def serve_forever(self) -> None:
        """Serve until interrupted: the loop runs on a daemon thread, this thread waits for signals."""
        thread = self.start_background()
        while thread.is_alive():
            thread.join(0.5)

    def start_background(self) -> threading.Thread:
        """Serve from a daemon thread (tests, benchmarks); :meth:`close` stops it."""
        self._started = True
        self._start_supervisor()
        return self.server.start_background()

    def close(self) -> None:
        self._closing.set()
        server = getattr(self, "server", None)
        if server is not None:
            if self._started:
                server.shutdown()
            server.server_close()
            server.pool.close()
        for child in self.children:
            if child.poll() is None:
                child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            _close_pipes(child)


def _close_pipes(child: subprocess.Popen) -> None:
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:     # a broken pipe to a dead child
                pass


def serve(env_name: str, size: int, env_kwargs: dict | None = None, host: str = "127.0.0.1",
          port: int = 8400, shards: int = 1, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          verbose: bool = False, call_timeout_s: float | None = None, token: str | None = None,
          allow_no_token: bool = False, ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> int:
    """Run the server until interrupted (SIGINT or SIGTERM); returns the exit code (1 when a shard
    died for good and took the server with it)."""
    raise_file_limit()      # connections are capped below the file limit: the hard limit is the roof
    sharded = ShardedHTTPServer(env_name, size, env_kwargs, host, port, shards, max_body_bytes, verbose,
                                call_timeout_s=call_timeout_s, token=token, allow_no_token=allow_no_token,
                                ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    listing = ", ".join(f"{s['first_id']}..{s['first_id'] + s['size'] - 1} on port {s['port']}"
                        for s in sharded.server.shards)
    scheme = "https" if ssl_certfile else "http"
    print(f"serving {size} x {env_name} at {scheme}://{host}:{sharded.port} (instances {listing}"
          f"{'; token required' if token else ''})", file=sys.stderr, flush=True)
    try:
        sharded.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sharded.close()
    return 1 if sharded.failure else 0


if __name__ == "__main__":  # an extra shard process started by ShardedHTTPServer
    sys.exit(_shard_main(sys.argv[1:]))
