"""A GPU window, planned: every command to send, back to back, with each step's estimate.

    python -m agentrl.checklist.window                       # the parts found in .devparts/, this commit
    python -m agentrl.checklist.window --parts 6 --budget-s 840 -- --stages weight_sync --sync-shape 7B

A window is 15 minutes of device time in all: the machine's start, every command and every idle
second count, and the machine is reset 30 s after a reply (the files outside the project folder go
with it). So the packages travel as parts, one per command, back to back (each command carries the
working tree and one part, 64 MiB at most), and the last part's command unpacks them and runs the
checklist, whose ``--deadline-s`` counts from that command's start (``--started-at "$T0"``) and is
what the plan has left once the steps before it are paid for. The plan totals at most
:data:`PLAN_S` (13 minutes); docs/gpu.md, "The window", is the same plan in prose. Standard library
only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.errors import UsageError

PLAN_S = 780             # 13 minutes: what a plan may take of the 15 (the rest absorbs a slow start)
START_S = 150            # the machine's start, paid by the first command (2-3 min)
FIRST_S = 25             # part.00 with the machine's facts, the pip freeze and df
PART_S = 20              # one more part: 56 MiB and the working tree sent, moved, the reply back
UNPACK_S = 30            # the parts unpacked (xz) into /root/site, inside the last command
REPLY_S = 15             # the last reply, with the checklist's two files
DEADLINE_CAP_S = 540     # a command is stopped at 600 s
BUDGET_RESERVE_S = 120   # of what `status` says is left, kept back for the start's variation
UNPACK = ("cat /root/parts/part.* | python3 -c \"import lzma,sys,tarfile; tarfile.open(fileobj=lzma.open("
          "sys.stdin.buffer), mode='r|').extractall('/root/site')\"")
FACTS = ("nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv "
         "> $OUT/nvidia-smi.csv; python3 -V; python3 -m pip list --format=freeze > $OUT/pip-freeze.txt; "
         "df -h /dev/shm /tmp > $OUT/df.txt")


@dataclass
class Step:
    name: str
    estimate_s: int
    command: str | None = None         # None: not a command (the start)
    carry: list[str] = field(default_factory=list)


def plan_window(parts: list[str], commit: str | None, checklist_args: list[str],
                budget_s: float = 900) -> list[Step]:
    """The steps of a window sending ``parts`` (file names under .devparts/) and running the checklist."""
    if not parts:
        raise UsageError("no parts to send: make the package parts into .devparts/ first (part.00, part.01, ...; "
                         "docs/gpu.md, 'The packages')")
    plan_s = min(PLAN_S, budget_s - BUDGET_RESERVE_S)
    first, last = parts[0], parts[-1]
    steps = [Step("machine start (the first command waits for it)", START_S)]
    if len(parts) > 1:
        steps.append(Step(f"{first} + the machine's facts", FIRST_S,
                          f"mkdir -p /root/parts && mv .devparts/{first} /root/parts/ && {FACTS}", [f".devparts/{first}"]))
        steps += [Step(part, PART_S, f"mv .devparts/{part} /root/parts/ && ls /root/parts | wc -l", [f".devparts/{part}"])
                  for part in parts[1:-1]]
    sending = FIRST_S if len(parts) == 1 else PART_S          # the last command's own part, sent before T0
    before = sum(step.estimate_s for step in steps) + sending
    deadline = int(min(DEADLINE_CAP_S, plan_s - before - REPLY_S) // 10 * 10)
    if deadline < UNPACK_S + 60:
        raise UsageError(f"{len(parts)} parts leave the checklist {deadline} s of a {plan_s:.0f}-s plan: too little "
                         "(fewer parts, or a window with more device time left)")
    facts = f"{FACTS}; " if len(parts) == 1 else ""
    checklist = ["bash scripts/gpu_checklist.sh python3 \"$OUT\"", *checklist_args, "--deadline-s", str(deadline),
                 "--started-at \"$T0\"", *(["--commit", commit] if commit else [])]
    steps.append(Step(f"{last} ({sending} s) + unpack ({UNPACK_S} s) + the checklist (--deadline-s {deadline} from "
                      "the unpack's start)", sending + deadline,
                      f"T0=$(date +%s.%N); mkdir -p /root/parts && mv .devparts/{last} /root/parts/ && {facts}{UNPACK}; "
                      "export PYTHONPATH=/root/site; unset PYTHONDONTWRITEBYTECODE; " + " ".join(checklist),
                      [f".devparts/{last}"]))
    steps.append(Step("the last reply (checklist.json, logs.tar.gz)", REPLY_S))
    return steps


def found_parts(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("part.*") if p.is_file())


def checkout_commit(root: Path) -> tuple[str | None, bool]:
    """This checkout's commit and whether its tracked files differ from it."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))


def show(steps: list[Step]) -> str:
    lines, total = [], 0
    for number, step in enumerate(steps, 1):
        total += step.estimate_s
        lines.append(f"{number}. {step.name}: {step.estimate_s} s (at {total // 60}:{total % 60:02d})")
        if step.command:
            lines.append(f"   carry: {step.carry}")
            lines.append(f"   {step.command}")
    lines.append(f"total {total} s = {total / 60:.2f} min; each command within 30 s of the previous reply")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentrl.checklist.window", description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=int, default=None, help="how many parts (default: those in --parts-dir)")
    parser.add_argument("--parts-dir", default=".devparts", help="where the parts are (default .devparts)")
    parser.add_argument("--commit", default=None, help="the commit the checklist names (default: this checkout's)")
    parser.add_argument("--budget-s", type=float, default=900, help="device seconds `status` says are left")
    parser.add_argument("checklist_args", nargs="*", help="the checklist's arguments (default --first-window)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    try:
        parts = [f"part.{i:02d}" for i in range(args.parts)] if args.parts is not None else \
            found_parts(root / args.parts_dir)
        commit, changed = (args.commit, False) if args.commit else checkout_commit(root)
        if changed:
            print(f"warning: tracked files differ from {commit}: commit them, or the JSON names other code",
                  file=sys.stderr)
        print(show(plan_window(parts, commit, args.checklist_args or ["--first-window"], args.budget_s)))
    except UsageError as err:
        print(f"agentrl: error: {err}", file=sys.stderr)
        return UsageError.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
