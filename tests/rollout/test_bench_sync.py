"""``agentrl bench sync`` moves weights into real Ray rollout workers every way and reports each."""

from __future__ import annotations

import pytest

from agentrl.bench import sync as bench
from agentrl.bench._common import parse_target_args

pytest.importorskip("ray")


@pytest.mark.slow
def test_sync_bench_times_packed_broadcast_and_tensor_dict_syncs(ray_cluster, tiny_model_dir, capsys, monkeypatch):
    argv = ["--arch", str(tiny_model_dir), "--dtype", "float32", "--repeats", "2", "--bucket-mb", "1"]
    reports = []
    measure = bench._measure
    monkeypatch.setattr(bench, "_measure", lambda args: reports.append(measure(args)) or reports[-1])
    assert bench.run(parse_target_args(bench, argv)) == 0          # the text table
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("weight sync benchmark:") and "median of 2" in lines[0]
    assert [line.split()[0] for line in lines[2:5]] == ["packed", "broadcast", "tensor_dict"]
    assert lines[5:] == ["ipc: not run: CUDA IPC needs a GPU (--device cuda)"]
    # the report that table was printed from (one measurement: it starts Ray workers and a receiver)
    assert len(reports) == 1
    meta, rows = reports[0]["meta"], reports[0]["results"]
    assert meta["device"] == "cpu" and meta["workers"] == 1 and meta["tensors"] > 10 and meta["gb"] > 0
    assert set(rows) == {"packed", "broadcast", "tensor_dict"}       # ipc: on a GPU only
    assert set(meta["not_measured"]) == {"ipc"}
    assert rows["broadcast"]["speedup"] == pytest.approx(rows["tensor_dict"]["total_s"] / rows["broadcast"]["total_s"])
    packed = rows["packed"]
    assert packed["total_s"] == pytest.approx(packed["pack_s"] + packed["load_s"], rel=0.05)
    assert packed["speedup"] == pytest.approx(rows["tensor_dict"]["total_s"] / packed["total_s"])
    assert all(row["gb_per_s"] > 0 for row in rows.values())
    with pytest.raises(SystemExit, match="--repeats"):
        measure(parse_target_args(bench, ["--arch", str(tiny_model_dir), "--repeats", "0"]))


def test_broadcast_is_refused_where_two_members_would_share_a_gpu():
    """One GPU: the bench puts the worker on the learner's GPU (for IPC), and NCCL would stop the group
    with "Duplicate GPU detected"; the broadcast path is reported as not run, with the reason."""
    why = bench.broadcast_refusal("cuda", "GPU-aaaa", ["GPU-aaaa"])
    assert why and "Duplicate GPU detected" in why and "share 1 GPU(s)" in why
    assert "share 2 GPU(s)" in bench.broadcast_refusal("cuda:0", "GPU-a", ["GPU-b", "GPU-a"])
    assert bench.broadcast_refusal("cuda", "GPU-a", ["GPU-b", "GPU-c"]) is None    # a GPU per member
    assert bench.broadcast_refusal("cpu", None, [None, None]) is None              # gloo: no such rule


def test_requested_paths_in_timing_order_and_what_cannot_run_here():
    assert bench.requested_paths("ipc,packed", gpu=True) == (["packed", "ipc"], {})
    paths, skipped = bench.requested_paths("ipc,packed,broadcast", gpu=False)
    assert paths == ["packed", "broadcast"] and skipped["ipc"].startswith("not run: CUDA IPC needs a GPU")
    with pytest.raises(SystemExit, match="--paths 'nccl'"):
        bench.requested_paths("nccl", gpu=True)
