"""scripts/wheelhouse.sh: a wheelhouse built on a connected machine installs with no index.

A small closure stands in for agentrl's (whose wheelhouse is GBs): omegaconf, whose dependency
antlr4-python3-runtime 4.9.3 is published as an sdist only, like DeepSpeed, so the build must turn
it into a wheel first; and a second build for another Python and platform, as for a cluster."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(args, **env):
    done = subprocess.run(["bash", "scripts/wheelhouse.sh", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable, **env})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done


def test_a_wheelhouse_with_an_sdist_only_dependency_installs_offline(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# a small closure\nomegaconf==2.3.0\n")
    house = tmp_path / "house"
    run(["build", house, "--requirements", requirements])
    wheels = sorted(p.name for p in house.glob("*.whl"))
    assert "antlr4_python3_runtime-4.9.3-py3-none-any.whl" in wheels       # built here from its sdist
    assert any(w.startswith("omegaconf-2.3.0-") for w in wheels) and any(w.lower().startswith("pyyaml-") for w in wheels)
    assert not list(house.glob("*.tar.gz")) and not (house / ".resolved.json").exists()
    venv = tmp_path / "venv"
    # no index and none reachable: every package must come from the wheelhouse
    run(["install", house, venv, "omegaconf"], PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="")
    check = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import omegaconf, antlr4; print(omegaconf.OmegaConf.create({'a': 1}).a)"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and check.stdout.strip() == "1", check.stderr


def test_a_wheelhouse_for_another_python_and_platform(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("omegaconf==2.3.0\n")
    house = tmp_path / "house"
    run(["build", house, "--requirements", requirements, "--python-version", "3.12",
         "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"])
    pyyaml = [p.name for p in house.glob("*.whl") if p.name.lower().startswith("pyyaml-")]
    assert len(pyyaml) == 1 and "-cp312-cp312-" in pyyaml[0] and "manylinux" in pyyaml[0]
    assert (house / "antlr4_python3_runtime-4.9.3-py3-none-any.whl").is_file()
