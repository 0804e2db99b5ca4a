"""`agentrl bench gateway` on the torch backend: both loops play the same episodes (the vLLM run is in
test_gateway_vllm.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")


def test_bench_gateway_runs_both_loops_on_one_torch_engine():
    from agentrl.bench import gateway as bench
    from agentrl.bench._common import parse_target_args

    report = bench._measure(parse_target_args(bench, ["--tasks", "2", "--group-size", "2", "--max-steps", "2",
                                                      "--rounds", "1"]))
    rows, meta = report["results"], report["meta"]
    assert meta["backend"] == "torch" and meta["vllm"] is None
    assert rows["engine"]["env_steps"] == rows["gateway"]["env_steps"] == 8       # 4 episodes x 2 steps
    assert rows["gateway"]["failed_episodes"] == 0 and rows["gateway"]["gateway_vs_engine"] > 0


def test_bench_gateway_with_an_instant_engine_and_agents_in_a_process():
    from agentrl.bench import gateway as bench
    from agentrl.bench._common import parse_target_args

    report = bench._measure(parse_target_args(bench, ["--tasks", "2", "--group-size", "2", "--max-steps", "3",
                                                      "--rounds", "1", "--instant-engine", "--agent-processes", "1"]))
    rows, meta = report["results"], report["meta"]
    assert meta["backend"] == "instant" and meta["agent_processes"] == 1
    # the instant reply is a valid action that never wins: every episode plays its 3 steps on both sides
    assert rows["engine"]["env_steps"] == rows["gateway"]["env_steps"] == 12
    assert rows["gateway"]["failed_episodes"] == 0
