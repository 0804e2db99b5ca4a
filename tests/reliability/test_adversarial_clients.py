"""Fault 12: outsiders who reach an env server or a gateway (docs/reliability.md, "Limits"). Each
server runs in a process of its own, the env server under a lowered file limit (512: a connection cap
of 192); a legitimate client plays meanwhile and must be served within 1 s throughout, with no
episode lost and the server's memory growing by less than MEMORY_BOUND_MB.

* env server (2 shards), all at once: IDLE connections held open (silent, after ``/health``, after a
  401), more than its file limit; HEADS request heads of HEAD_MIB MiB each; BODIES authenticated
  heads that claim 16 MiB of body and send none; and one shard process SIGKILLed (started again:
  no half-server; its episodes are played again);
* gateway: one REQUEST_MIB MiB request with a valid key, heads of HEAD_MIB MiB, idle connections.

Before these limits (85d0bf4), the legitimate client's connections were reset once the idle ones had
used the file limit, claimed bodies held its step for ~30 s, a 4 MiB gateway request took 18.5 s
and 700 MB. The sizes are small so that this runs in seconds; ``agentrl bench hardening`` measures
the same attacks, larger, against an older checkout side by side (docs/benchmarks.md).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from agentrl.bench._attacks import (ClaimedBodies, HugeHeads, HugeRequest, IdleConnections, Watch, start_env_server,
                                    start_gateway)
from agentrl.runtime.http_connections import raise_file_limit
from reliability_kit import record_figures

pytestmark = pytest.mark.slow

TREE = str(Path(__file__).resolve().parents[2])
FILE_LIMIT = 512            # of the env server process: its connection cap is 512 - 256 - 64 = 192
IDLE, HEADS, HEAD_MIB, BODIES, REQUEST_MIB = 600, 3, 8, 8, 8
ATTACK_S = 3.0
MEMORY_BOUND_MB = 64
LEGIT_BOUND_S = 1.0
HEALTH_TARGET_MS = 100      # what /health aims at throughout; asserted on the median (CI boxes are shared)


def test_env_server_serves_its_clients_while_outsiders_attack_it():
    room = raise_file_limit() - 200        # this process holds every attacking connection
    served = start_env_server(TREE, file_limit=FILE_LIMIT, size=4, shards=2)
    attacks = [IdleConnections(min(IDLE, room)), HugeHeads(HEADS, HEAD_MIB << 20), ClaimedBodies(BODIES)]
    try:
        watch = Watch(served).start()
        time.sleep(0.5)
        for attack in attacks:
            attack.start(served)
        time.sleep(ATTACK_S / 2)
        shard = next(p for p in __import__("psutil").Process(served.process.pid).children() if p.is_running())
        os.kill(shard.pid, signal.SIGKILL)      # one shard dies: started again, its episodes re-run
        time.sleep(ATTACK_S / 2)
        figures = watch.stop()
    finally:
        for attack in attacks:
            attack.stop()
        served.stop()
    record_figures("env server attacked: idle connections past its file limit, huge heads, claimed bodies, a "
                   "shard SIGKILLed", file_limit=FILE_LIMIT, idle=IDLE, heads=f"{HEADS} x {HEAD_MIB} MiB",
                   claimed_bodies=f"{BODIES} x 16 MiB", **figures,
                   outcomes={type(a).__name__: a.outcome for a in attacks})
    assert figures["episodes_lost"] == 0 and figures["episodes_rerun"] >= 1, figures
    assert figures["calls_failed"] == 0 and figures["call_max_ms"] < LEGIT_BOUND_S * 1000, figures
    assert figures["health_failed"] == 0 and figures["health_max_ms"] < LEGIT_BOUND_S * 1000, figures
    assert figures["health_p50_ms"] < HEALTH_TARGET_MS, figures
    assert figures["rss_growth_mb"] < MEMORY_BOUND_MB, figures
    assert set(attacks[1].outcome) == {"HTTP/1.1 431"}, attacks[1].outcome       # no huge head was parsed


def test_gateway_serves_its_agents_while_one_sends_a_huge_request_and_outsiders_attack_it():
    served = start_gateway(TREE)
    attacks = [HugeRequest(REQUEST_MIB << 20), HugeHeads(HEADS, HEAD_MIB << 20), IdleConnections(300)]
    try:
        watch = Watch(served).start()
        time.sleep(0.5)
        for attack in attacks:
            attack.start(served)
        attacks[0].wait(30)
        time.sleep(ATTACK_S)
        figures = watch.stop()
    finally:
        for attack in attacks:
            attack.stop()
        served.stop()
    record_figures("gateway attacked: an 8 MiB request with a valid key, huge heads, idle connections",
                   request=f"{REQUEST_MIB} MiB", heads=f"{HEADS} x {HEAD_MIB} MiB", **figures,
                   request_s=round(attacks[0].seconds, 2), outcomes={type(a).__name__: a.outcome for a in attacks})
    assert attacks[0].outcome == {"HTTP 413": 1} and attacks[0].seconds < LEGIT_BOUND_S
    assert figures["calls_failed"] == 0 and figures["call_max_ms"] < LEGIT_BOUND_S * 1000, figures
    assert figures["health_failed"] == 0 and figures["health_max_ms"] < LEGIT_BOUND_S * 1000, figures
    assert figures["health_p50_ms"] < HEALTH_TARGET_MS, figures
    assert figures["rss_growth_mb"] < MEMORY_BOUND_MB, figures
