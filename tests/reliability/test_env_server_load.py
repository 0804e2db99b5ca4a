"""Fault 11: the HTTP env server under load with faults injected. CLIENTS clients play episodes on
SERVERS server processes (INSTANCES instances each, call timeout CALL_TIMEOUT_S), first clean, then
with faults: one client's instances make slow and hung steps, SLOWLORIS connections hold half-sent
heads and bodies open on the same server, and the other server is SIGKILLed and started again on
its port. Measured: steps/s of the unaffected clients (clean and under faults), p99 latency of
their step batches and of ``/health``, episodes lost (failed episodes are played again from reset,
as the rollout engine does), the servers' memory.

Bounds are generous (a loaded 2-core box); the figures of a run are in docs/reliability.md.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import urllib3

from agentrl.envs import TaskRef
from agentrl.envs.server import EnvClient
from reliability_kit import record_figures

pytestmark = pytest.mark.slow

SERVERS, INSTANCES, CALL_TIMEOUT_S = 2, 16, 2.0
CLIENTS, PER_CLIENT = 8, 4                  # client c plays instances 4 (c // 2) .. on server c % 2
CLEAN_S, FAULT_S, DRAIN_S = 3.0, 7.0, 20.0
KILL_AT_S, DOWN_S = 2.0, 0.5                # into the fault phase: server 1 killed, started again after this
SLOWLORIS = 200
LOAD_ENV = Path(__file__).with_name("load_env.py")


def start_server(port: int) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LOAD_ENV.parent), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    process = subprocess.Popen([sys.executable, str(LOAD_ENV), str(port), str(INSTANCES), str(CALL_TIMEOUT_S)],
                               stderr=subprocess.PIPE, text=True, env=env)
    line = process.stderr.readline()
    assert line.startswith("serving "), line
    threading.Thread(target=process.stderr.read, daemon=True).start()  # keep draining its log lines
    return process, int(line.split(" at http://127.0.0.1:")[1].split()[0])


def p99(values: list[float]) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


@dataclass
class Tally:
    steps: dict[str, int] = field(default_factory=lambda: {"clean": 0, "fault": 0})
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"clean": [], "fault": []})
    started: int = 0
    completed: int = 0
    rerun: int = 0


class LoadRun:
    def __init__(self, ports: list[int]):
        self.ports = ports
        self.phase = "warm"
        self.stop_new = threading.Event()       # drain: no new episodes, finish the started ones
        self.tallies = [Tally() for _ in range(CLIENTS)]
        self.health: dict[int, dict[str, list[float]]] = {s: {"clean": [], "fault": []} for s in range(SERVERS)}
        self.health_failures = [0] * SERVERS
        self.errors: list[BaseException] = []
        self.unfinished = 0

    def faulty(self, client: int) -> bool:
        return client == 0

    def client(self, c: int) -> None:
        tally = self.tallies[c]
        server = c % SERVERS
        first = (c // SERVERS) * PER_CLIENT
        ids = list(range(first, first + PER_CLIENT))
        pending: list[int] = []                  # instances whose episode must be played (again)
        try:
            with EnvClient.http(f"http://127.0.0.1:{self.ports[server]}", timeout=10) as env:
                round_no = 0
                while True:
                    if not pending:
                        if self.stop_new.is_set():
                            return
                        pending = list(ids)
                        tally.started += len(ids)
                    resets = env.reset([(i, TaskRef("tasks", (round_no + i) % 64)) for i in pending],
                                       on_shard_error="report")
                    live = [r.instance_id for r in resets if r.ok]
                    if not live:
                        time.sleep(0.1)          # the server is down: try again
                        continue
                    failed = []
                    while live:
                        phase = self.phase
                        step = [(i, self.action(c, i, round_no)) for i in live]
                        start = time.monotonic()
                        results = env.step(step, on_shard_error="report")
                        if phase in tally.latencies and not self.faulty(c):
                            tally.latencies[phase].append(time.monotonic() - start)
                            tally.steps[phase] += len(results)
                        failed += [r.instance_id for r in results if not r.ok]
                        live = [r.instance_id for r in results if r.ok and not r.done]
                    not_reset = [r.instance_id for r in resets if not r.ok]
                    tally.rerun += len(failed)
                    tally.completed += len(pending) - len(failed) - len(not_reset)
                    pending = failed + not_reset
                    round_no += 1
        except BaseException as err:  # noqa: BLE001 - asserted by the test
            self.errors.append(err)
        finally:
            self.unfinished += len(pending)

    def action(self, client: int, instance: int, round_no: int) -> str:
        if self.phase != "fault" or not self.faulty(client):
            return "ok"
        if instance % PER_CLIENT == 0 and round_no % 3 == 0:
            return "hang"
        return "slow" if instance % PER_CLIENT == 1 else "ok"

    def prober(self, server: int) -> None:
        http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=5))
        while not self.stop_new.is_set():
            phase = self.phase
            start = time.monotonic()
            try:
                ok = http.request("GET", f"http://127.0.0.1:{self.ports[server]}/health").status == 200
            except urllib3.exceptions.HTTPError:
                ok = False
            if ok and phase in ("clean", "fault"):
                self.health[server][phase].append(time.monotonic() - start)
            elif not ok:
                self.health_failures[server] += 1
            time.sleep(0.02)


def slowloris(port: int, count: int) -> list[socket.socket]:
    """Half-sent heads and bodies, held open (the server closes them at its deadlines)."""
    held = []
    for n in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if n % 2:
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n{\"items\": [")
        else:
            sock.sendall(b"POST /step HTTP/1.1\r\nHost: x\r\nContent-Le")
        held.append(sock)
    return held


def test_env_server_under_load_with_slow_hung_killed_and_slowloris_faults():
    servers = [start_server(0) for _ in range(SERVERS)]
    processes = [p for p, _ in servers]
    run = LoadRun([port for _, port in servers])
    held: list[socket.socket] = []
    rss = {n: [psutil.Process(p.pid).memory_info().rss] for n, p in enumerate(processes)}
    threads = [threading.Thread(target=run.client, args=(c,)) for c in range(CLIENTS)]
    threads += [threading.Thread(target=run.prober, args=(s,), daemon=True) for s in range(SERVERS)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        run.phase = "clean"
        time.sleep(CLEAN_S)
        run.phase = "fault"
        fault_start = time.monotonic()
        held = slowloris(run.ports[0], SLOWLORIS)
        killed_at = None
        while time.monotonic() - fault_start < FAULT_S:
            for n, process in enumerate(processes):
                try:
                    rss[n].append(psutil.Process(process.pid).memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            if killed_at is None and time.monotonic() - fault_start >= KILL_AT_S:
                os.kill(processes[1].pid, signal.SIGKILL)
                processes[1].wait(10)
                killed_at = time.monotonic()
                time.sleep(DOWN_S)
                processes[1], _ = start_server(run.ports[1])  # on its port: the clients reconnect
                back_after = time.monotonic() - killed_at
            time.sleep(0.1)
        run.phase = "drain"
        run.stop_new.set()
        for thread in threads[:CLIENTS]:
            thread.join(DRAIN_S)
        assert not any(t.is_alive() for t in threads[:CLIENTS]), "clients did not finish their episodes"
        assert not run.errors, run.errors[:3]

        clean = [t for c, t in enumerate(run.tallies) if not run.faulty(c)]
        unaffected = [t for c, t in enumerate(run.tallies) if not run.faulty(c) and c % SERVERS == 0]
        steps_clean = sum(t.steps["clean"] for t in unaffected) / CLEAN_S
        steps_fault = sum(t.steps["fault"] for t in unaffected) / FAULT_S
        step_p99 = {phase: p99([x for t in unaffected for x in t.latencies[phase]]) for phase in ("clean", "fault")}
        health_p99 = {s: p99(run.health[s]["fault"]) for s in range(SERVERS)}
        started = sum(t.started for t in run.tallies)
        completed = sum(t.completed for t in run.tallies)
        lost = started - completed
        growth_mb = max((max(v) - v[0]) / 2**20 for v in rss.values())
        record_figures("HTTP env server under load: slow + hung steps, slowloris, a server SIGKILLed",
                       servers=SERVERS, clients=CLIENTS, instances=SERVERS * INSTANCES, slowloris=SLOWLORIS,
                       unaffected_steps_per_s_clean=round(steps_clean), unaffected_steps_per_s_fault=round(steps_fault),
                       held=round(steps_fault / steps_clean, 2),
                       unaffected_step_p99_ms={k: round(v * 1000, 1) for k, v in step_p99.items()},
                       health_p99_ms_fault={f"server{s}": round(v * 1000, 1) for s, v in health_p99.items()},
                       health_failed_probes=run.health_failures, killed_server_back_s=round(back_after, 2),
                       episodes_started=started, episodes_completed=completed,
                       episodes_rerun=sum(t.rerun for t in run.tallies), episodes_lost=lost,
                       server_rss_mb=[round(v[0] / 2**20) for v in rss.values()],
                       server_rss_growth_mb=round(growth_mb, 1))
        assert lost == 0 and run.unfinished == 0
        assert sum(t.rerun for t in run.tallies) > 0 and all(t.completed > 0 for t in clean)
        assert health_p99[0] < 1.0, health_p99              # the server with the hung steps and slowloris
        assert step_p99["fault"] < 1.0, step_p99              # unaffected instances on that server
        assert steps_fault > 0.3 * steps_clean, (steps_clean, steps_fault)
        assert growth_mb < 200, rss
    finally:
        run.stop_new.set()
        for sock in held:
            sock.close()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
