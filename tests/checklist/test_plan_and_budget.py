"""The checklist's plan without running it: which stages, the time each needs before the deadline, the
attention back end and sampler modules vLLM 0.26 loads per GPU, the commit named, an output folder
that would not come back whole, and the window's commands and estimates (with docs/gpu.md)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.checklist import output, probes, runner, window
from agentrl.checklist import stages as S
from agentrl.checklist.provenance import provenance
from agentrl.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def parse(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    return parser.parse_intermixed_args([str(tmp_path / "out"), "--work", str(tmp_path / "work"), *argv])


def test_the_first_window_is_every_stage_in_order_with_the_sync_at_1_5b(tmp_path):
    args = parse(tmp_path, "--first-window")
    assert runner.selected_stages(args) == list(S.FIRST_WINDOW) == list(S.STAGES)
    assert S.FIRST_WINDOW[:6] == ("imports", "probe_ray", "probe_ipc", "probe_sleep", "smoke", "engine_vs_raw")
    done = runner.Checklist(args, ROOT)
    assert done.plan.first_window and done.report["plan"]["first_window"]
    done.plan.gpu = True
    assert done.plan.shape == "1.5B"
    assert runner.Checklist(parse(tmp_path), ROOT).plan.shape == "probe"           # CPUs: the probe architecture
    later = runner.Checklist(parse(tmp_path, "--stages", "weight_sync"), ROOT).plan
    later.gpu = True
    assert later.shape == "7B"                                                     # a later window: 7B


def test_stages_are_taken_in_order_with_imports_first_and_bad_selections_are_one_line_errors(tmp_path):
    assert runner.selected_stages(parse(tmp_path, "--stages", "weight_sync,probe_ray")) == \
        ["imports", "probe_ray", "weight_sync"]
    with pytest.raises(UsageError, match="unknown stage.*nope"):
        runner.selected_stages(parse(tmp_path, "--stages", "smoke,nope"))
    with pytest.raises(UsageError, match="give --first-window or --stages, not both"):
        runner.selected_stages(parse(tmp_path, "--stages", "smoke", "--first-window"))
    error = subprocess.run([sys.executable, "-m", "agentrl.checklist", str(tmp_path / "o"),
                            "--stages", "nope"], capture_output=True, text=True, cwd=ROOT)
    assert error.returncode == 2 and error.stderr.startswith("agentrl: error: --stages: unknown stage(s) nope")
    assert not (tmp_path / "o").exists()


def test_a_stage_needs_its_estimate_for_the_device_a_margin_and_the_time_to_finish(tmp_path):
    plan = S.Plan(python="python3", gpu=True, out=tmp_path, work=tmp_path, first_window=True)
    assert S.estimate_s("smoke", plan) == 170 and S.needed_s("smoke", plan) == 196 + S.FINISH_S
    assert S.estimate_s("weight_sync", plan) == 45
    plan.sync_shape = "7B"
    assert S.estimate_s("weight_sync", plan) == S.GPU_SYNC_ESTIMATES_S["7B"]
    plan.gpu = False
    assert S.estimate_s("smoke", plan) == S.STAGES["smoke"].cpu_estimate_s
    plan.device_known = False                    # before the imports stage found the device: the larger
    assert S.estimate_s("imports", plan) == max(S.STAGES["imports"].estimate_s, S.STAGES["imports"].cpu_estimate_s)


def test_the_deadline_counts_from_the_commands_start_and_skips_what_does_not_fit(tmp_path):
    started = time.time() - 400                  # the command started 400 s ago (the unpacking, say)
    done = runner.Checklist(parse(tmp_path, "--device", "cuda", "--deadline-s", "510", "--started-at", str(started)),
                            ROOT)
    assert 105 < done.time_left() <= 110
    assert done.skip_for_time("probe_ray") is None                     # 20 s x 1.15 + 12 s = 35 s fits
    why = done.skip_for_time("engine_vs_raw")                          # 116 s does not
    assert why.startswith("out of time: it needs 116 s (estimate 90 s + 15% + 12 s to finish)") and "510" in why
    assert done.report["plan"]["before_checklist_s"] >= 399
    no_deadline = runner.Checklist(parse(tmp_path, "--deadline-s", "0"), ROOT)
    assert no_deadline.skip_for_time("smoke") is None


def test_the_first_windows_stages_fit_its_deadline_on_an_h200_by_their_estimates():
    steps = window.plan_window([f"part.{i:02d}" for i in range(6)], "abc", ["--first-window"])
    deadline = int(re.search(r"--deadline-s (\d+)", steps[-2].command).group(1))
    plan = S.Plan(python="python3", gpu=True, out=Path("."), work=Path("."), first_window=True)
    clock, ran = window.UNPACK_S + 2, []
    for name in S.FIRST_WINDOW:
        if S.needed_s(name, plan) <= deadline - clock:
            ran.append(name)
            clock += S.estimate_s(name, plan)
    assert ran[:6] == ["imports", "probe_ray", "probe_ipc", "probe_sleep", "smoke", "engine_vs_raw"]


@pytest.mark.parametrize("capability, picked, modules", [
    ((9, 0), "FLASH_ATTN", ["flash_attn", "flashinfer"]),          # H100, H200: FlashAttention 3
    ((8, 0), "FLASH_ATTN", ["flash_attn", "flashinfer"]),          # A100: FlashAttention 2
    ((8, 9), "FLASH_ATTN", ["flash_attn", "flashinfer"]),
    ((10, 0), "FLASHINFER", ["flashinfer", "flash_attn"]),         # Blackwell: FlashInfer first
    ((12, 0), "FLASH_ATTN", ["flash_attn", "flashinfer"]),
    ((7, 5), "TRITON_ATTN", ["triton_attn", "flex_attention"]),    # Turing: no FlashAttention, no FlashInfer in 0.26
    ((7, 0), "TRITON_ATTN", ["triton_attn", "flex_attention"]),
])
def test_the_attention_back_end_is_the_one_vllm_0_26_picks_for_the_gpu(capability, picked, modules):
    plan = probes.attention_plan(capability)
    assert plan["picked"] == picked
    assert plan["modules"] == [f"vllm.v1.attention.backends.{m}" for m in modules]
    if picked == "FLASH_ATTN":
        assert plan["flash_attn_version"] == {9: 3}.get(capability[0], 2)


def test_flashinfers_sampler_is_imported_only_when_enabled():
    off, _ = probes.engine_modules((9, 0), {"VLLM_USE_FLASHINFER_SAMPLER": "0"})
    on, decided = probes.engine_modules((9, 0), {})
    assert "flashinfer.sampling" not in off and "vllm.v1.attention.backends.flashinfer" in off   # the next back end
    assert on[-1] == "flashinfer.sampling" and decided["flashinfer_sampler"]["imported"]
    assert "vllm.v1.attention.backends.flash_attn" in on and len(on) == len(set(on))
    turing, decided = probes.engine_modules((7, 5), {})
    assert "flashinfer.sampling" not in turing and not decided["flashinfer_sampler"]["imported"]
    cpu, decided = probes.engine_modules(None, {})
    assert "vllm.v1.worker.cpu_worker" in cpu and "attention" not in decided


def test_the_commit_comes_from_the_argument_or_git_or_is_said_to_be_missing(tmp_path):
    assert provenance(tmp_path, "0123abc") == {"agentrl_commit": "0123abc", "commit_source": "--commit"}
    assert provenance(tmp_path, None)["agentrl_commit"] is None                    # no .git: the GPU machine
    assert "no .git here and no --commit given" in provenance(tmp_path, None)["commit_source"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert provenance(ROOT, None)["agentrl_commit"] == head


def test_an_output_folder_holding_other_files_or_the_work_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "checklist.json").write_text("{}")                       # an earlier checklist's: fine
    output.Output(out, tmp_path / "work" / "checklist").check_out()
    (out / "logs").mkdir()
    with pytest.raises(UsageError, match=r"already holds 1 other entries \(logs\)"):
        output.Output(out, tmp_path / "work" / "checklist").check_out()
    with pytest.raises(UsageError, match="is inside the output folder"):
        output.Output(tmp_path / "o2", tmp_path / "o2" / "work" / "checklist").check_out()


def test_layout_problems_name_what_would_not_come_back(tmp_path):
    assert output.layout_problems(tmp_path) == []
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "ok.txt").write_text("x")
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    for i in range(8):
        (tmp_path / f"f{i}").write_text("x")
    assert output.layout_problems(tmp_path) == ["10 files (at most 8 come back)",
                                                "a/b/c/deep.txt is deeper than OUT/a/b/file"]


@pytest.mark.parametrize("parts", [1, 2, 5, 6, 8])
def test_a_window_plan_totals_13_minutes_at_most_and_its_commands_fit_the_device(parts):
    names = [f"part.{i:02d}" for i in range(parts)]
    steps = window.plan_window(names, "0123abc", ["--first-window"])
    assert sum(step.estimate_s for step in steps) <= 13 * 60
    commands = [step for step in steps if step.command]
    assert [step.carry for step in commands] == [[f".devparts/{name}"] for name in names]
    assert all(len(step.command) <= 2000 for step in commands)     # the device's limit on a command
    assert "pip list --format=freeze > $OUT/pip-freeze.txt" in commands[0].command
    assert "df -h /dev/shm /tmp > $OUT/df.txt" in commands[0].command
    last = commands[-1].command
    assert last.startswith("T0=$(date +%s.%N); ") and "unset PYTHONDONTWRITEBYTECODE" in last
    assert last.index("extractall('/root/site')") < last.index("bash scripts/gpu_checklist.sh python3 \"$OUT\"")
    assert "--first-window" in last and '--started-at "$T0"' in last and last.endswith("--commit 0123abc")
    deadline = int(re.search(r"--deadline-s (\d+)", last).group(1))
    assert deadline <= runner.DEADLINE_S < 600
    with pytest.raises(UsageError, match="no parts to send"):
        window.plan_window([], None, [])


def test_the_docs_window_plan_is_the_modules_plan_for_six_parts():
    text = (ROOT / "docs" / "gpu.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (.+?) \| (\d+) s \| (\d+):(\d\d) \|", text, re.M)
    assert rows[0][:3] == ("0", rows[0][1], "0")            # step 0, `status`, costs nothing
    rows = rows[1:]
    steps = window.plan_window([f"part.{i:02d}" for i in range(6)], None, ["--first-window"])
    assert [int(seconds) for _, _, seconds, _, _ in rows] == [step.estimate_s for step in steps]
    assert int(rows[-1][3]) * 60 + int(rows[-1][4]) == sum(step.estimate_s for step in steps) <= 13 * 60
    for step in steps:
        if step.command:
            assert step.command.replace(" --commit", "") in text.replace(" --commit SHA", ""), step.name
